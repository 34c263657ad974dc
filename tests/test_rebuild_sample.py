"""verify --rebuild-sample: honest objects compare equal after recompiling; a planted wrong object (compiled
with another flag and filed under the right key, so every hash check passes) is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hermetic.store import Store
from tests.support.builds import REPO, Project


def _verify(root: Path, n: int) -> tuple[int, dict[str, object]]:
    p = subprocess.run([sys.executable, "-m", "hermetic", "--root", str(root), "verify", "--rebuild-sample",
                        str(n), "--json"], capture_output=True, text=True, cwd=REPO, timeout=600)
    return p.returncode, json.loads(p.stdout.splitlines()[-1])


def test_rebuild_sample_finds_no_mismatch_then_catches_a_planted_object(tmp_path: Path) -> None:
    root = tmp_path / "root"
    proj = Project(tmp_path / "p", "sample", root)
    proj.realize()
    rc, result = _verify(root, 100)
    outcomes = {r["source"]: r["outcome"] for r in result["rebuilt"]}  # type: ignore[index]
    assert rc == 0 and outcomes == {s: "same" for s in ("bindings.cpp", "host.cpp", "kern.cu", "named.cpp",
                                                         "other.cpp")}
    store = Store(root / "store")
    name = next(e for e in store.iter_entries() if e.endswith("-obj-other.o"))
    meta = store.entry_meta(name)
    argv = list(meta["command"])
    wrong = tmp_path / "wrong.o"
    argv[argv.index("-o") + 1] = str(wrong)
    subprocess.run([*argv, "-O3", "-fno-inline"], check=True, cwd=tmp_path)
    digest = store.put_blob_bytes(wrong.read_bytes())
    meta_path = store.entry_path(name) / "meta.json"
    os.chmod(meta_path, 0o644)
    meta_path.write_text(json.dumps({**meta, "object": digest}))
    rc, result = _verify(root, 100)
    outcomes = {r["source"]: r["outcome"] for r in result["rebuilt"]}  # type: ignore[index]
    assert rc == 1 and outcomes["other.cpp"] == "mismatch"
    assert [s for s, o in outcomes.items() if o == "mismatch"] == ["other.cpp"]


def test_gc_of_a_dropped_build_removes_its_objects_and_their_index(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Project(tmp_path / "p", "dropped", root).realize()
    index = root / "store" / "index"
    assert list(index.glob("*/*/*"))
    p = subprocess.run([sys.executable, "-m", "hermetic", "--root", str(root), "gc", "--drop-root", "dropped"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr
    store = Store(root / "store")
    assert not [e for e in store.iter_entries() if "-obj-" in e or "-mod-" in e]
    assert not list(index.glob("*/*/*")) and not list(index.glob("*/*"))
