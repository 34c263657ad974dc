"""The audit never says clean when it cannot see (issue 34, item 7): a change at any depth under a watched
place is found; a place it could not check fully makes ``clean`` "unknown" and is listed under ``unchecked``;
the lock folder is watched, where only lock files may appear.

Before the fix, a file written five folders below an existing folder of /tmp (a compiler's -save-temps with
sandbox off) left the audit clean: the walk stopped two levels down, and the folder at the limit kept its
mtime. The lock folder was left out whole, and it can be any folder a setting names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hermetic.audit as audit_mod
from hermetic import fs, procs
from hermetic.audit import OutsideRootAudit
from tests.support.reliability import live_commands


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
    assert str(tmp) not in result["shallow"] and not any(u.startswith(str(tmp)) for u in result["unchecked"])


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
    held = fs.open_lock_file(locks / "gpu-GPU-1234.lock")   # a lock file this command takes
    os.close(held)
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
    os.close(fs.open_lock_file(locks / "cpu-host.lock"))
    (locks / "notes.txt").write_text("x")
    result = audit.finish(children=[(t0, time.time(), "python3", False)], exclude=[locks])
    assert str(locks) in result["watched"] and result["created"] == [str(locks / "notes.txt")]
    assert result["clean"] is False and not any(str(locks) in u for u in result["unchecked"])
    # one named only at the end, outside every place, was not watched: the audit says so
    other = tmp_path / "other-locks"
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    result = audit.finish(children=[], exclude=[other])
    assert result["clean"] == "unknown" and any(str(other) in u for u in result["unchecked"])


def test_a_shallow_place_is_unknown_below_its_depth_when_a_child_ran_unsandboxed(tmp_path: Path) -> None:
    """attack34 finding 9 (home-deep, home-deep-edit, cwd-deep): a file written or appended four folders below
    HOME or the current folder moves no folder's time at the depth limit. Before: clean true, nothing listed;
    now clean is "unknown" and the unchecked list says which places were walked how deep. Children all in the
    sandbox could not write there: clean stays true."""
    home, tmp, cwd, root = _places(tmp_path)
    for top in (home, cwd):
        deep = top / "proj" / "sub" / "deep"
        deep.mkdir(parents=True)
        (deep / "existing.txt").write_text("old\n")
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    t0 = time.time()
    (home / "proj" / "sub" / "deep" / "new.txt").write_text("pwn\n")
    with open(home / "proj" / "sub" / "deep" / "existing.txt", "a") as f:
        f.write("pwn\n")
    (cwd / "proj" / "sub" / "deep" / "new.py").write_text("pwn\n")
    result = audit.finish(children=[(t0, time.time(), "cc1plus", False)])
    assert result["clean"] == "unknown", result
    assert any(u.startswith(f"{home}: walked 1 level deep only") for u in result["unchecked"]), result["unchecked"]
    assert any(u.startswith(f"{cwd}: walked 2 levels deep only") for u in result["unchecked"]), result["unchecked"]
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    result = audit.finish(children=[(time.time(), time.time(), "cc1plus", True)])
    assert result["clean"] is True and result["unchecked"] == []


def test_a_lock_file_this_command_did_not_hold_is_a_leak(tmp_path: Path) -> None:
    """attack34 finding 9 (lock-new, lock-edit): a new ``evil.lock`` and an append to an existing lock file
    that this command never opened are judged like any other file (ours: a child wrote them). Before: both
    left out as lock files, clean true. A lock file another live hermetic holds (its holder line, nothing else)
    is not ours."""
    home, tmp, cwd, root = _places(tmp_path)
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "existing.lock").write_text("")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[locks])
        audit.start()
        t0 = time.time()
        (locks / "evil.lock").write_text("pwn\n")
        with open(locks / "existing.lock", "a") as f:
            f.write("pwn\n")
        (locks / "cpu-other.lock").write_text(f"pid {other.pid} on host since 2026-01-01T00:00:00Z\n")
        os.close(fs.open_lock_file(locks / "cpu-mine.lock"))
        result = audit.finish(children=[(t0, time.time(), "cc1plus", False)], exclude=[locks])
    finally:
        other.kill()
        other.wait()
    judged = {f["path"]: f["ours"] for f in result["files"]}
    assert judged == {str(locks / "evil.lock"): "yes", str(locks / "existing.lock"): "yes",
                      str(locks / "cpu-other.lock"): "no"}, result["files"]
    assert result["clean"] is False


def test_a_file_held_open_by_a_detached_descendant_of_a_child_is_not_another_process(tmp_path: Path) -> None:
    """attack34 finding 9 (tmp-held): a process a child started that left its session and holds a file open is
    hermetic's own (it carries the child's mark): before, the file was judged "not ours: held open by pid N
    (sleep)", clean true. It is stopped by the audit and listed under ``escaped``."""
    home, tmp, cwd, root = _places(tmp_path)
    held = tmp / "held.txt"
    script = f"setsid sh -c 'exec 3>{held}; echo pwn >&3; exec sleep 3547' </dev/null >/dev/null 2>&1 &"
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd, lock_folders=[])
    audit.start()
    mark = f"{procs.MARK}.audit-test"
    t0 = time.time()
    subprocess.run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin", procs.MARK_VARIABLE: mark}, check=True)
    for _ in range(100):
        if held.exists():
            break
        time.sleep(0.05)
    t1 = time.time()
    holders = audit_mod._holders({str(held)})
    assert str(held) not in holders, holders
    result = audit.finish(children=[(t0, t1, "cc1plus", False)])
    judged = {f["path"]: f for f in result["files"]}
    assert judged[str(held)]["ours"] == "yes", judged
    assert any("3547" in e["command"] for e in result["escaped"]), result["escaped"]
    assert result["clean"] is False
    time.sleep(0.2)
    assert not [c for c in live_commands().values() if b"sleep\x003547" in c]
