"""Links planted below hermetic's own folders (the re-attack of 2026-12-04, findings 5 and 5b): the build folder
of a recipe and the folders below it that hermetic writes into are never followed out of the root."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tests.support import cli
from tests.support.builds import Project


def _state(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_a_linked_build_folder_is_refused_and_nothing_outside_changes(tmp_path: Path, shared_root: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "default").mkdir(parents=True)
    (outside / "build.ninja").write_text("the user's own build file\n")
    (outside / "default" / "notes.txt").write_text("mine\n")
    before = _state(outside)
    proj = Project(tmp_path / "p", "deeplinks", shared_root)
    folder = shared_root / "build" / "deeplinks"
    assert not folder.exists()
    folder.parent.mkdir(exist_ok=True)
    folder.symlink_to(outside)
    try:
        res = proj.realize(check=False)
        assert res.rc == 2 and "symbolic link" in res.err and str(folder) in res.err, (res.rc, res.err[-2000:])
        assert "Traceback" not in res.err
        assert _state(outside) == before
    finally:
        folder.unlink()
    # built for real, then the objects' folder replaced by a link: the next build (the root dropped, so the
    # objects are placed again) refuses it rather than linking objects into the outside folder
    proj.realize()
    objs = [p for p in folder.rglob("*.o") if p.is_file()]
    assert objs, sorted(folder.rglob("*"))
    obj_dir = objs[0].parent
    victim = tmp_path / "objects"
    victim.mkdir()
    (victim / objs[0].name).write_text("the user's object\n")
    before = _state(victim)
    for p in obj_dir.iterdir():
        p.unlink()
    obj_dir.rmdir()
    obj_dir.symlink_to(victim)
    gone = cli.run(shared_root, "gc", "--drop-root", "deeplinks", env=dict(os.environ))
    assert gone.rc == 0, gone.err
    res = proj.realize(check=False)
    assert res.rc == 2 and "symbolic link" in res.err and str(obj_dir) in res.err, (res.rc, res.err[-2000:])
    assert _state(victim) == before
    obj_dir.unlink()
