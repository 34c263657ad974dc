"""A dry run's folder outside the root (its children's home and temp files: docs/layout.md) is removed on every
exit, and one left by a dry run killed with kill -9 (no exit handler runs) is found and removed by the next dry
run or gc: it is locked while its process lives, so a live one is never touched (issue 35)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import cli
from tests.support.builds import Project
from tests.support.cli import REPO, hermetic_env


def _left(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("hermetic-dry-run-*"))


def _killed_dry_run(root: Path, recipe: Path, env: dict[str, str], tmp: Path) -> Path:
    """A dry run killed with kill -9 once its folder exists (stopped first, so that it is killed there)."""
    before = set(_left(tmp))
    proc = cli.popen(root, "realize", recipe, "--dry-run", "--json", env=env)
    end = time.monotonic() + 120
    while not set(_left(tmp)) - before:
        assert proc.poll() is None and time.monotonic() < end, "the dry run ended before its folder appeared"
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    [left] = set(_left(tmp)) - before
    return left


def test_a_killed_dry_run_leaves_a_folder_the_next_command_removes(tmp_path: Path, shared_root: Path) -> None:
    tmp = tmp_path / "systemp"
    env = hermetic_env(tmp_path / "home", pip="machine", tmp=tmp)
    proj = Project(tmp_path / "p", "scratch", tmp_path / "root")   # an empty root: the probe imports torch
    live = tmp / "hermetic-dry-run-1-live"   # another live process's: locked, never touched
    live.mkdir(parents=True)
    import fcntl
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        done = cli.run(proj.root, "realize", proj.recipe, "--dry-run", env=env)
        assert done.rc == 0, done.err[-3000:]
        assert _left(tmp) == [live]   # its own folder removed at exit
        left = _killed_dry_run(proj.root, proj.recipe, env, tmp)
        assert left.is_dir()
        again = cli.run(proj.root, "realize", proj.recipe, "--dry-run", "-v", env=env)
        assert again.rc == 0 and str(left) in again.err, again.err[-3000:]
        assert _left(tmp) == [live]
        left = _killed_dry_run(proj.root, proj.recipe, env, tmp)
        gc = cli.run(proj.root, "gc", env=env)
        assert gc.rc == 0 and str(left) in gc.err, gc.err[-3000:]
        assert _left(tmp) == [live]
    finally:
        os.close(held)


def test_gc_removes_only_the_folders_hermetic_made_and_marked(tmp_path: Path) -> None:
    """Attack on issue 34, finding 7: `gc` removed every folder ``$TMPDIR/hermetic-dry-run-*`` of this user that
    nobody flocked, "left by a dry run that was killed": the user's own notes in one of that name too. Now only a
    folder holding hermetic's marker (a regular file of this user, with hermetic's words) goes; a look-alike, one
    whose marker is a link or a folder, one of another user, and links and files of that name are left."""
    tmp = tmp_path / "systemp"
    env = hermetic_env(tmp_path / "home", tmp=tmp)
    # a real dry run's folder, its process killed with kill -9 (no exit handler ran)
    made = subprocess.run([sys.executable, "-c", "import os; from hermetic import fs; "
                           "print(fs.process_scratch_dir('hermetic-dry-run-'), flush=True); os.kill(os.getpid(), 9)"],
                          env=env, cwd=REPO, capture_output=True, text=True)
    killed = Path(made.stdout.strip())
    assert made.returncode == -signal.SIGKILL and killed.is_dir() and killed.parent == tmp, made
    mine = tmp / "hermetic-dry-run-99999-mine"
    (mine / "notes.txt").parent.mkdir()
    (mine / "notes.txt").write_text("precious\n")
    linked = tmp / "hermetic-dry-run-2-linked-marker"
    linked.mkdir()
    (linked / ".hermetic-scratch").symlink_to(killed / ".hermetic-scratch")
    folder_marker = tmp / "hermetic-dry-run-3-folder-marker"
    (folder_marker / ".hermetic-scratch").mkdir(parents=True)
    other = tmp / "hermetic-dry-run-4-other-user"
    other.mkdir()
    marker = killed / ".hermetic-scratch"   # (absent before the fix: then any text stands in)
    (other / ".hermetic-scratch").write_bytes(marker.read_bytes() if marker.exists() else b"made by hermetic\n")
    os.chown(other / ".hermetic-scratch", 65534, 65534)
    (tmp / "hermetic-dry-run-5-file").write_text("a file\n")
    (tmp / "hermetic-dry-run-6-link").symlink_to(mine)
    res = cli.run(tmp_path / "root", "gc", env=env)
    assert res.rc == 0 and f"removed {killed}" in res.err, res.err
    assert not killed.exists()
    assert sorted(p.name for p in _left(tmp)) == [
        "hermetic-dry-run-2-linked-marker", "hermetic-dry-run-3-folder-marker", "hermetic-dry-run-4-other-user",
        "hermetic-dry-run-5-file", "hermetic-dry-run-6-link", "hermetic-dry-run-99999-mine"]
    assert (mine / "notes.txt").read_text() == "precious\n"
