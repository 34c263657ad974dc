"""No compiler outlives hermetic: kill -9 during a compile, and SIGTERM; then the next realize finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.builds import Project
from tests.support.reliability import live_commands


def _compilers_under(root: Path) -> list[int]:
    tools = (b"nvcc", b"cicc", b"cc1plus", b"ptxas", b"ninja")
    return [pid for pid, cmd in live_commands().items()
            if str(root).encode() in cmd and any(t in cmd for t in tools)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_hermetic_mid_compile_leaves_no_compiler(tmp_path: Path, shared_root: Path,
                                                         sig: signal.Signals) -> None:
    proj = Project(tmp_path / "p", f"kill{int(sig)}", shared_root)
    p = cli.popen(shared_root, "realize", proj.recipe, env=dict(os.environ), output=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not _compilers_under(shared_root / "build" / proj.name) and not _compilers_under(shared_root / "tmp"):
        assert p.poll() is None and time.monotonic() < deadline, "no compiler started"
        time.sleep(0.01)
    p.send_signal(sig)
    p.wait(timeout=60)
    deadline = time.monotonic() + 10  # the reaper acts at once; a loaded machine may take a moment
    while _compilers_under(shared_root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _compilers_under(shared_root) == []
    done = proj.realize()
    assert done.result["ok"] is True
