"""Every setting: the command line, else the environment, else a file (README: Configuration). The scratch
root (--root, HERMETIC_ROOT, .hermetic/) and the lock folder (HERMETIC_LOCK_DIR, a runner's gpu.lock_dir, the
defaults); the remote cache's order is tested in tests/test_remote.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermetic import root as root_mod
from hermetic.root import Root
from hermetic.run import devices


def test_the_root_command_line_then_environment_then_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"HERMETIC_ROOT": str(tmp_path / "from-env")}
    assert Root.locate(str(tmp_path / "from-cli"), env) == Root(tmp_path / "from-cli", "--root")
    assert Root.locate(None, env) == Root(tmp_path / "from-env", "HERMETIC_ROOT")
    default = Root.locate(None, {})
    assert default.path == tmp_path / ".hermetic" and "default" in default.named_by


def test_the_lock_folder_environment_then_runner_then_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMETIC_LOCK_DIR", str(tmp_path / "from-env"))
    assert devices.lock_dir(str(tmp_path / "from-runner")) == tmp_path / "from-env"
    assert devices.lock_dir(None) == tmp_path / "from-env"
    monkeypatch.delenv("HERMETIC_LOCK_DIR")
    assert devices.lock_dir(str(tmp_path / "from-runner")) == tmp_path / "from-runner"
    # no setting: the first default whose parent this user may write, else the last
    (tmp_path / "run-lock").mkdir()
    defaults = (str(tmp_path / "missing" / "hermetic"), str(tmp_path / "run-lock" / "hermetic"),
                str(tmp_path / "last" / "hermetic"))
    monkeypatch.setattr(root_mod, "DEFAULT_LOCK_DIRS", defaults)
    assert devices.lock_dir(None) == tmp_path / "run-lock" / "hermetic"
    os.rmdir(tmp_path / "run-lock")
    assert devices.lock_dir(None) == tmp_path / "last" / "hermetic"
