"""The shared lock folder (attack on issue 34, finding 1): a lock file is opened without following a symlink and
must be a regular file of one link; it is chmodded through its held descriptor, and only when it is this
user's. A link, a hard link or a FIFO planted at a lock's name (by this user or by another user of the machine)
is refused with exit 2 naming it; the file it leads to is neither written nor chmodded.

Before the fix ``take_lock`` opened the name with O_CREAT (following the link), wrote "pid N on HOST since ..."
into the file it led to and chmodded that file 0666; another user could then write into it."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from hermetic import fs
from hermetic.errors import BadInput
from hermetic.reporter import Reporter
from hermetic.run.devices import take_lock

NOBODY = 65534


def _decoy(tmp_path: Path) -> Path:
    home = tmp_path / "victimhome"
    home.mkdir()
    decoy = home / ".bashrc-decoy"
    decoy.write_text("export PATH=/usr/bin:/bin  # the user's own file\n")
    decoy.chmod(0o644)
    return decoy


def _as_nobody(cwd: Path, *argv: str) -> None:
    """Run a command as user nobody (setpriv, as root only), the other user of the machine, in ``cwd`` (entered
    as root: nobody may not pass the test's private folders above it)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("playing a second user needs root and setpriv")
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], check=True,
                   cwd=cwd)


def _take(locks: Path, name: str) -> fs.FileLock:
    lock, _waited = take_lock(locks, name, 1.0, Reporter(quiet=True), "this machine's CPU measurements")
    return lock


def test_a_link_another_user_planted_in_the_shared_lock_folder_is_refused(tmp_path: Path) -> None:
    """The attack: a sticky folder of mode 1777 (as hermetic makes /tmp/hermetic-locks), user nobody plants
    ``cpu-HOST.lock -> the victim's file``. Before the fix the victim's file held "pid N on HOST since ..." and
    mode 0666 afterwards, and nobody could append to it."""
    decoy = _decoy(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    name = f"cpu-{socket.gethostname()}.lock"
    _as_nobody(shared, "ln", "-s", str(decoy), name)
    before = (decoy.read_bytes(), os.lstat(decoy).st_mode)
    with pytest.raises(BadInput) as caught:
        _take(shared, name)
    assert caught.value.exit_code == 2 and caught.value.where == str(shared / name)
    assert "symbolic link" in caught.value.what and str(decoy) in caught.value.what
    assert (decoy.read_bytes(), os.lstat(decoy).st_mode) == before
    assert os.path.islink(shared / name)


@pytest.mark.parametrize("plant", ["symlink", "dangling symlink", "hard link", "fifo", "folder"])
def test_anything_but_a_lock_file_at_a_locks_name_is_refused(tmp_path: Path, plant: str) -> None:
    """The same user's lock folder (HERMETIC_LOCK_DIR): whatever is planted, nothing is written through it and
    nothing waits on it."""
    decoy = _decoy(tmp_path)
    locks = tmp_path / "locks"
    locks.mkdir()
    path = locks / "gpu-0.lock"
    if plant == "symlink":
        path.symlink_to(decoy)
    elif plant == "dangling symlink":
        path.symlink_to(tmp_path / "victimhome" / "new-file")
    elif plant == "hard link":
        os.link(decoy, path)
    elif plant == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    before = (decoy.read_bytes(), os.lstat(decoy).st_mode)
    with pytest.raises(BadInput) as caught:
        _take(locks, "gpu-0.lock")
    assert caught.value.where == str(path), caught.value.render()
    assert {"symlink": "symbolic link", "dangling symlink": "symbolic link", "hard link": "2 hard links",
            "fifo": "a FIFO", "folder": "a folder"}[plant] in caught.value.what
    assert (decoy.read_bytes(), os.lstat(decoy).st_mode) == before
    assert not (tmp_path / "victimhome" / "new-file").exists()


def test_a_lock_file_of_another_user_is_used_and_never_chmodded(tmp_path: Path) -> None:
    """The control: lock files are shared between users on purpose. nobody's lock file (0644: only nobody may
    write it) is taken as it is, its mode left alone; this user's own new lock file is made 0666 so that
    every user can take it later."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    _as_nobody(shared, "sh", "-c", "umask 022; : > gpu-1.lock")
    theirs = os.lstat(shared / "gpu-1.lock")
    lock = _take(shared, "gpu-1.lock")   # as root here: writing is allowed, chmodding another's file is not done
    try:
        after = os.lstat(shared / "gpu-1.lock")
        assert (after.st_uid, stat.S_IMODE(after.st_mode)) == (NOBODY, stat.S_IMODE(theirs.st_mode)) == (NOBODY, 0o644)
        assert (shared / "gpu-1.lock").read_text().startswith(f"pid {os.getpid()} on ")
    finally:
        lock.release()
    mine = _take(shared, "gpu-2.lock")
    try:
        assert stat.S_IMODE(os.lstat(shared / "gpu-2.lock").st_mode) == 0o666
    finally:
        mine.release()


def test_a_new_lock_folder_is_made_sticky_and_never_chmodded_through_a_link(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """take_lock makes a missing default lock folder 1777 through the descriptor of the folder it made (a folder
    a setting names is never made: tests/test_config.py); a name that is already there (a link, say) is not
    chmodded."""
    from hermetic.run import devices
    fresh = tmp_path / "run" / "lock" / "hermetic"
    monkeypatch.setattr(devices, "DEFAULT_LOCK_DIRS", (str(fresh),))   # where the machine's default would be
    _take(fresh, "cpu-x.lock").release()
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o1777
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    elsewhere.chmod(0o700)
    (tmp_path / "linked").symlink_to(elsewhere)
    _take(tmp_path / "linked", "cpu-x.lock").release()   # the user's own choice of a folder: used, not chmodded
    assert stat.S_IMODE(os.lstat(elsewhere).st_mode) == 0o700
