"""The audit never says clean when it cannot see (issue 34, item 7): a change at any depth under a watched
place is found; a place it could not check fully makes ``clean`` "unknown" and is listed under ``unchecked``;
the lock folder is watched, where only lock files may appear.

Before the fix, a file written five folders below an existing folder of /tmp (a compiler's -save-temps with
sandbox off) left the audit clean: the walk stopped two levels down, and the folder at the limit kept its
mtime. The lock folder was left out whole, and it can be any folder a setting names."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import hermetic.audit as audit_mod
from hermetic.audit import OutsideRootAudit


def _places(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    home, tmp, cwd, root = (tmp_path / n for n in ("home", "tmp", "cwd", "work/root"))
    for d in (home, tmp, cwd, root):
        d.mkdir(parents=True)
    return home, tmp, cwd, root


def test_a_write_five_folders_below_an_existing_folder_is_found(tmp_path: Path) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    deep = tmp / "build-cache" / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (deep / "old.o").write_bytes(b"old")
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    t0 = time.time()
    (deep / "leak.ii").write_text("int leaked;\n")
    (deep / "old.o").write_bytes(b"rewritten")
    result = audit.finish(children=[(t0, time.time(), "g++", False)])
    assert result["created"] == [str(deep / "leak.ii")] and result["changed"] == [str(deep / "old.o")]
    assert result["clean"] is False and result["counts"]["ours"] == 2
    assert result["unchecked"] == [] and str(tmp) not in result["shallow"]


def test_a_place_past_its_budget_leaves_clean_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    for i in range(12):
        (tmp / f"f{i}").write_text("x")
    monkeypatch.setattr(audit_mod, "MAX_ENTRIES", 5)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    result = audit.finish(children=[])
    assert result["clean"] == "unknown" and result["complete"] is False
    assert any(u.startswith(f"{tmp}: more than 5 entries") for u in result["unchecked"]), result["unchecked"]


def test_the_lock_folder_is_watched_and_only_lock_files_may_appear_there(tmp_path: Path) -> None:
    """Named at the end as the pipelines name it (``exclude``): it lies in a place walked whole, so every change
    in it is known; a lock file is left out, a library planted beside it is a leak, however deep."""
    home, tmp, cwd, root = _places(tmp_path)
    locks = tmp / "hermetic-locks"
    (locks / "sub").mkdir(parents=True)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    t0 = time.time()
    (locks / "gpu-GPU-1234.lock").write_text("pid 1 on host\n")
    (locks / "planted.so").write_bytes(b"\x7fELF")
    (locks / "sub" / "deeper.txt").write_text("x")
    result = audit.finish(children=[(t0, time.time(), "python3", False)], exclude=[locks])
    assert result["created"] == [str(locks / "planted.so"), str(locks / "sub" / "deeper.txt")]
    assert result["clean"] is False and f"{locks}/*.lock" in result["excluded"]


def test_a_lock_folder_given_from_the_start_is_a_place_of_its_own(tmp_path: Path) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    locks = tmp_path / "shared-locks"   # outside every other place
    locks.mkdir()
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[locks])
    audit.start()
    t0 = time.time()
    (locks / "cpu-host.lock").write_text("x")
    (locks / "notes.txt").write_text("x")
    result = audit.finish(children=[(t0, time.time(), "python3", False)], exclude=[locks])
    assert str(locks) in result["watched"] and result["created"] == [str(locks / "notes.txt")]
    assert result["clean"] is False and result["unchecked"] == []
    # one named only at the end, outside every place, was not watched: the audit says so
    other = tmp_path / "other-locks"
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    result = audit.finish(children=[], exclude=[other])
    assert result["clean"] == "unknown" and any(str(other) in u for u in result["unchecked"])
