"""A dry run's folder outside the root (its children's home and temp files: docs/layout.md) is removed on every
exit, and one left by a dry run killed with kill -9 (no exit handler runs) is found and removed by the next dry
run or gc: it is locked while its process lives, so a live one is never touched (issue 35)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.support import cli
from tests.support.builds import Project
from tests.support.cli import hermetic_env


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
