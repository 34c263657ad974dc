"""Concurrent realizes of one recipe on one root: all succeed, each wheel is fetched and unpacked once and each
object compiled once; gc running during realizes never deletes what they use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from hermetic.extensions.certificate import read_certificate
from hermetic.store import Store
from tests.support import cli
from tests.support.builds import Project, linked_root
from tests.support.cli import REPO, Hermetic
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe
from tests.support.runs import SLOW_WORKER, run_hermetic, small_repo
from tests.support.trees import tree_snapshot


def test_four_realizes_at_once_build_each_entry_once(tmp_path: Path, hermetic: Hermetic,
                                                     index: LoopbackIndex) -> None:
    wheels = [make_pkg(tmp_path / "whl", f"pkg{i}", "1.0") for i in range(4)]
    index.add(*(w.path for w in wheels))
    recipe = write_recipe(tmp_path / "r", "conc", "".join(pip_lock_line(w) for w in wheels))
    procs = [hermetic.popen("realize", recipe, "--json") for _ in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _out, err in outputs]
    records = [json.loads(line) for out, _err in outputs for line in out.splitlines()]
    unpacked = [r for r in records if r.get("event") == "unpacked"]
    fetched = [r for r in records if r.get("event") == "fetched"]
    assert len(unpacked) == 4 and len(fetched) == 4  # one per wheel, across all four processes
    file_gets = [r for r in index.state.requests if r.startswith("/files/")]
    assert len(file_gets) == 4
    trees = {json.loads(out.splitlines()[-1])["tree"] for out, _err in outputs}
    assert len(trees) == 1
    assert len(tree_snapshot(hermetic.root / "profiles" / "conc")) == 4 * (33 + 4) + 2  # and bin/python(3)
    assert hermetic("verify").rc == 0


def test_four_builds_at_once_compile_each_object_once(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "conc4", shared_root)
    proj.edit("clock.cpp", "__TIME__", '"fixed"')  # else clock.cpp is never stored, so compiled by each
    # --explain: each process says what it did with every object
    procs = [cli.popen(shared_root, "realize", proj.recipe, "--json", "--explain", env=dict(os.environ))
             for _ in range(4)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _out, err in outputs]
    compiled: dict[str, int] = {}
    for out, _err in outputs:
        decisions = [r["message"].split(": ")[1:3] for r in map(json.loads, out.splitlines())
                     if r.get("event") == "explain"]
        assert len(decisions) == 6, out[-2000:]
        for source, decision in decisions:
            assert decision.split(" ")[0] in ("compiled", "reused"), decision
            compiled[source] = compiled.get(source, 0) + decision.startswith("compiled")
    assert compiled == {s: 1 for s in ("bindings.cpp", "clock.cpp", "host.cpp", "kern.cu", "named.cpp", "other.cpp")}
    assert len({json.loads(out.splitlines()[-1])["tree"] for out, _err in outputs}) == 1
    receipt = json.loads(Path(json.loads(outputs[0][0].splitlines()[-1])["receipt"]).read_text())
    cert = read_certificate(Store(shared_root / "store"), receipt["modules"][0]["certificate_blob"])
    assert len(cert["objects"]) == 6


def _drop_records(root: Path, name: str) -> None:
    """What `gc --drop-root NAME` does before it collects: the entries stay, unrooted."""
    (root / "roots" / f"{name}.json").unlink()
    (root / "profiles" / name).unlink()
    for p in (root / "receipts").glob(f"{name}-*.json"):
        p.unlink()


# The real gc, paused between planning and deleting until a file appears: what a store of thousands of
# entries does for seconds, made wide enough to land a realize in it every time.
PAUSED_GC = """
import os, sys, time
import hermetic.store.gc as g
plan = g.plan
def paused(*args, **kwargs):
    p = plan(*args, **kwargs)
    print("planned", file=sys.stderr, flush=True)
    while not os.path.exists(os.environ["GC_GO"]):
        time.sleep(0.01)
    return p
g.plan = paused
from hermetic.cli.main import main
raise SystemExit(main())
"""


def test_gc_between_plan_and_delete_never_deletes_what_a_realize_uses(tmp_path: Path, hermetic: Hermetic,
                                                                      index: LoopbackIndex) -> None:
    """A realize that reuses unrooted entries (a dropped root) starts after gc planned to delete them and
    before gc deletes them. It must either pin them before gc decides or find them gone after gc is done;
    never succeed on entries gc then deletes (the realize's profile would point at nothing)."""
    wheels = [make_pkg(tmp_path / "whl", f"race{i}", "1.0") for i in range(6)]
    index.add(*(w.path for w in wheels))
    recipe = write_recipe(tmp_path / "r", "race", "".join(pip_lock_line(w) for w in wheels))
    hermetic("realize", recipe, check=True)
    _drop_records(hermetic.root, "race")
    go = tmp_path / "go"
    gc = subprocess.Popen([sys.executable, "-c", PAUSED_GC, "--root", str(hermetic.root), "gc", "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**hermetic.env, "GC_GO": str(go)}, cwd=REPO)
    assert gc.stderr is not None and gc.stderr.readline().strip() == "planned"
    realize = hermetic.popen("realize", recipe, "--json")
    try:
        realize.wait(timeout=3)  # unfixed, the realize finishes inside gc's window; fixed, it waits for gc
    except subprocess.TimeoutExpired:
        pass
    go.touch()
    (out, err), (gc_out, _gc_err) = realize.communicate(timeout=300), gc.communicate(timeout=300)
    assert gc.returncode == 0 and realize.returncode == 0, err[-3000:]
    deleted = json.loads(gc_out.splitlines()[-1])["dead_entries"]
    assert len(deleted) == 7  # the six unpacked wheels and the tree: gc did delete what it planned to
    assert json.loads(out.splitlines()[-1])["counts"]["fetched"] == 6  # so the realize fetched them again
    res = hermetic("verify", "--json")
    assert res.rc == 0, res.out[-3000:]
    assert len(tree_snapshot(hermetic.root / "profiles" / "race")) == 6 * (33 + 4) + 2  # and bin/python(3)


def test_gc_in_a_loop_during_a_build(tmp_path: Path, shared_root: Path) -> None:
    """gc runs again and again while a cold build publishes objects, a module and trees not yet rooted."""
    proj = Project(tmp_path / "p", "gcloop", shared_root)
    root = proj.root = linked_root(shared_root, tmp_path / "root")
    stop = threading.Event()
    runs: list[int] = []

    def collect() -> None:
        while not stop.is_set():
            runs.append(cli.run(root, "gc", env=dict(os.environ), timeout=300).rc)

    thread = threading.Thread(target=collect)
    thread.start()
    try:
        done = proj.realize()
    finally:
        stop.set()
        thread.join()
    assert done.result["ok"] is True and len(runs) >= 2 and set(runs) == {0}, runs
    assert set(done.decisions.values()) <= {"compiled", "compiled-uncacheable"}
    res = cli.run(root, "verify", env=dict(os.environ), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_gc_during_a_run_never_deletes_what_it_measures(tmp_path: Path, shared_root: Path) -> None:
    """A `hermetic run` holds what it measures alive: while its worker waits at a gate, the recipe's root is
    dropped and gc collects; nothing the run uses goes, and the run finishes."""
    locks = tmp_path / "locks"
    locks.mkdir()
    h = run_hermetic((shared_root, locks), tmp_path)
    h("realize", REPO / "recipes" / "p2p.toml", check=True)
    gate = tmp_path / "gate"
    runner = small_repo(tmp_path / "repo", SLOW_WORKER.format(gate=gate))
    run = h.popen("run", runner, "--device", "cpu", "--json")
    try:
        while not any(f"pid {run.pid} " in p.read_text() for p in locks.glob("cpu-*.lock")):
            assert run.poll() is None, run.communicate()[1][-3000:]  # the run realized, pinned, then locked
            time.sleep(0.1)
        used = set(json.loads((shared_root / "roots" / "p2p.json").read_text())["refs"])
        gc = h("gc", "--drop-root", "p2p", "--json", check=True)
        dead = {f"entry:{e}" for e in json.loads(gc.out.splitlines()[-1])["dead_entries"]}
        assert not dead & used, sorted(dead & used)
        store = Store(shared_root / "store")
        assert all(store.has_entry(r[len("entry:"):]) for r in used if r.startswith("entry:"))
    finally:
        gate.touch()
        out, err = run.communicate(timeout=600)
    assert h("verify").rc == 0
    again = h("realize", REPO / "recipes" / "p2p.toml", "--json", check=True)  # the root back, nothing rebuilt
    assert json.loads(again.out.splitlines()[-1])["counts"].get("objects_compiled", 0) == 0
    # the worker imports from the trees the run pinned, not through the dropped profile
    result = cli.Result(run.returncode, out, err).result
    assert run.returncode == 0 and result["ok"], (err[-3000:], out[-3000:])


def _staging(root: Path, deadline_s: float, proc: subprocess.Popen[str]) -> Path | None:
    """The import's staging folder under store/tmp, caught as soon as it appears (polled every millisecond)."""
    tmp = root / "store" / "tmp"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        try:
            found = [n for n in os.listdir(tmp) if n.startswith("import-")]
        except FileNotFoundError:
            found = []
        if found:
            return tmp / found[0]
        time.sleep(0.001)
    return None


def test_gc_beside_an_import_spares_its_staging_folder(tmp_path: Path, hermetic: Hermetic,
                                                       index: LoopbackIndex) -> None:
    """The outside attack on issue 35 (finding 3): gc beside `import` deleted the live import's staging folder
    (store/tmp/import-*), and the import failed, exit 2, ".../import-.../<sha> does not exist" (1 in 7-20 tries).
    Here the window is placed: the import is stopped (SIGSTOP) the moment its staging folder appears, gc runs,
    the import goes on. A staging folder a killed import left (its lock free) is garbage for the next gc."""
    wheels = [make_pkg(tmp_path / "whl", f"imp{i}", "1.0") for i in range(3)]
    index.add(*(w.path for w in wheels))
    recipe = write_recipe(tmp_path / "r", "imp", "".join(pip_lock_line(w) for w in wheels))
    hermetic("realize", recipe, check=True)
    archive = tmp_path / "imp.tar.zst"
    hermetic("export", "--level", "1", archive, check=True)
    other = Hermetic(tmp_path / "other", hermetic.env)
    for trial in range(2):
        proc = other.popen("import", "--trust-unsigned", archive, "--json")
        staging = _staging(other.root, 60, proc)
        assert staging is not None, "the import ended before its staging folder was seen"
        os.kill(proc.pid, 19)   # SIGSTOP: the import holds its staging folder, half read
        try:
            gc = other("gc", "--json")
            assert gc.rc == 0, gc.err
            left = staging.is_dir()
        finally:
            os.kill(proc.pid, 9 if trial else 18)   # the second import is killed: its folder is garbage
        out, err = proc.communicate(timeout=120)
        assert left, "gc deleted the staging folder of a live import"
        if trial == 0:
            assert proc.returncode == 0, err[-2000:]
            assert other("verify").rc == 0
            other("gc", "--drop-root", "imp", check=True)
    assert staging.is_dir()   # what the killed import left
    assert other("gc").rc == 0
    assert not staging.exists() and not os.listdir(other.root / "store" / "tmp")
