"""verify --rebuild-sample: honest objects compare equal after recompiling; a planted wrong object (compiled
with another flag and filed under the right key, so every hash check passes) is caught; kill -9 mid-compile
leaves no compiler behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from hermetic.store import Store
from tests.support import cli
from tests.support.builds import Project, local_command
from tests.support.reliability import kill_and_reap, live_commands, survivors


def _verify(root: Path, n: int) -> tuple[int, dict[str, object]]:
    p = cli.run(root, "verify", "--rebuild-sample", str(n), "--json", env=dict(os.environ), timeout=600)
    return p.returncode, json.loads(p.stdout.splitlines()[-1])


def test_rebuild_sample_finds_no_mismatch_then_catches_a_planted_object(tmp_path: Path) -> None:
    root = tmp_path / "root"
    proj = Project(tmp_path / "p", "sample", root)
    # internal linkage: nvcc names these after the unit's module id, a hash of the source's path
    (proj.folder / "src" / "anon.cu").write_text("namespace { __global__ void twice(float* p) { p[0] *= 2; } }\n"
                                                  "void launch_twice(float* p) { twice<<<1, 1>>>(p); }\n")
    proj.realize()
    rc, result = _verify(root, 100)
    outcomes = {r["source"]: r["outcome"] for r in result["rebuilt"]}  # type: ignore[index]
    assert rc == 0 and outcomes == {s: "same" for s in ("anon.cu", "bindings.cpp", "host.cpp", "kern.cu",
                                                         "named.cpp", "other.cpp")}
    # a new source tree (a file added), every object reused: the module id follows the resolved path of the
    # source (a store tree's) unless hermetic names the path (flags.module_id_flags); anon.cu still compares
    (proj.folder / "src" / "NOTES.txt").write_text("a file no unit reads\n")
    decisions = proj.realize().decisions
    assert decisions.pop("clock.cpp") == "compiled-uncacheable" and set(decisions.values()) == {"reused"}
    rc, result = _verify(root, 100)
    assert rc == 0 and {r["outcome"] for r in result["rebuilt"]} == {"same"}  # type: ignore[union-attr]
    store = Store(root / "store")
    name = next(e for e in store.iter_entries() if e.endswith("-obj-other.o"))
    meta = store.object_record(name)
    argv = local_command(root, name)
    wrong = tmp_path / "wrong.o"
    argv[argv.index("-o") + 1] = str(wrong)
    subprocess.run([*argv, "-O3", "-fno-inline"], check=True, cwd=tmp_path)
    digest = store.put_blob_bytes(wrong.read_bytes())
    meta_path = store.entry_path(name) / "meta.json"
    os.chmod(meta_path, 0o644)
    planted = {k: v for k, v in meta.items() if k != "packed"}  # a raw blob, hashing to the record
    meta_path.write_text(json.dumps({**planted, "object": digest, "size": wrong.stat().st_size,
                                     "refs": [f"blob:{digest}"]}))
    rc, result = _verify(root, 100)
    outcomes = {r["source"]: r["outcome"] for r in result["rebuilt"]}  # type: ignore[index]
    assert rc == 1 and outcomes["other.cpp"] == "mismatch"
    assert "recompiled object differs" in next(r["detail"] for r in result["rebuilt"]  # type: ignore[union-attr]
                                               if r["source"] == "other.cpp")
    assert [s for s, o in outcomes.items() if o == "mismatch"] == ["other.cpp"]


def test_gc_of_a_dropped_build_removes_its_objects_and_their_index(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Project(tmp_path / "p", "dropped", root).realize()
    index = root / "store" / "index"
    assert list(index.glob("*/*/*"))
    p = cli.run(root, "gc", "--drop-root", "dropped", env=dict(os.environ), timeout=600)
    assert p.returncode == 0, p.stderr
    store = Store(root / "store")
    assert not [e for e in store.iter_entries() if "-obj-" in e or "-mod-" in e]
    assert not list(index.glob("*/*/*")) and not list(index.glob("*/*"))
    # the recipe forgotten whole: its toolchain's profile too, so nothing of it stays (the outside attack on
    # issue 35, finding 14: profiles/dropped.toolchain stayed, and with it the toolchain's entries)
    assert not os.listdir(root / "profiles")
    assert store.iter_entries() == []


def _recompiling(root: Path) -> list[int]:
    """Live compilers of a rebuild sample (their output goes to the root's tmp/rebuild-*)."""
    needle = f"{root}/tmp/rebuild-".encode()
    tools = (b"nvcc", b"cicc", b"cc1plus", b"ptxas", b"g++", b"c++")
    return [pid for pid, cmd in live_commands().items() if needle in cmd and any(t in cmd for t in tools)]


def test_kill_9_mid_rebuild_sample_leaves_no_compiler(tmp_path: Path, shared_root: Path) -> None:
    Project(tmp_path / "p", "rebuildkill", shared_root).realize()
    p = cli.popen(shared_root, "verify", "--rebuild-sample", "100", env=dict(os.environ), output=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not _recompiling(shared_root):
        assert p.poll() is None and time.monotonic() < deadline, "no compiler started"
        time.sleep(0.01)
    outlived, _waited = kill_and_reap(p.pid, shared_root)
    p.wait(timeout=60)
    assert outlived == [] and _recompiling(shared_root) == [] and survivors(shared_root) == []
