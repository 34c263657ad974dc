"""The one way tests run hermetic: the real command line, ``python -m hermetic``, in a subprocess.

``hermetic_env`` says which machine the process is on: ``pip="isolated"`` (no pip configuration; an index the
test serves, if any), ``"machine"`` (this machine's pip configuration: the CUDA compiler wheels come from its
index) or ``"offline"`` (no configuration and no index at all: another machine that must get everything from
the store, an archive or a remote cache). ``run`` and ``popen`` take that environment, a root and the
arguments; ``code`` runs an older copy of the package instead of this checkout (tests/test_compat.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    # subprocess's names too, so a check reads the same whichever way it got its process
    @property
    def returncode(self) -> int:
        return self.rc

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err

    @property
    def records(self) -> list[dict[str, Any]]:
        """The JSON Lines of stdout (with --json)."""
        return [json.loads(line) for line in self.out.splitlines() if line.startswith("{")]

    @property
    def result(self) -> dict[str, Any]:
        """The closing result record ({} when there is none)."""
        found = [r for r in self.records if "result" in r]
        return found[-1] if found else {}


def hermetic_env(home: Path | None = None, *, pip: str = "isolated", tmp: Path | None = None,
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without HERMETIC_* (and, unless ``pip == "machine"``, without PIP_*), with a
    private HOME (and TMPDIR) when given."""
    if pip not in ("isolated", "machine", "offline"):
        raise ValueError(f"pip={pip!r}")
    drop = ("HERMETIC_",) if pip == "machine" else ("HERMETIC_", "PIP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # no configuration file of this machine's (user, system) and no colour choice of the caller's: a test that
    # wants them sets them
    for key in ("XDG_CONFIG_HOME", "NO_COLOR", "FORCE_COLOR", "CLICOLOR_FORCE", "MAX_JOBS"):
        env.pop(key, None)
    env["HERMETIC_SYSTEM_CONFIG"] = ""
    if pip != "machine":
        env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "1", "PIP_DEFAULT_TIMEOUT": "5"})
    if pip == "offline":
        env["PIP_NO_INDEX"] = "1"
    for key, folder in (("HOME", home), ("TMPDIR", tmp)):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            env[key] = str(folder)
    env.update(extra or {})
    return env


def command(root: Path, *args: str | Path) -> list[str]:
    return [sys.executable, "-m", "hermetic", "--root", str(root), *map(str, args)]


def _with_code(env: dict[str, str], code: Path | None) -> dict[str, str]:
    # `python -m` puts the working folder first on the import path: an older copy runs from its own folder
    return env if code is None else {**env, "PYTHONPATH": str(code)}


def run(root: Path, *args: str | Path, env: dict[str, str], cwd: Path | None = None, code: Path | None = None,
        timeout: float = 900, check: bool = False) -> Result:
    p = subprocess.run(command(root, *args), capture_output=True, text=True, env=_with_code(env, code),
                       cwd=cwd or code or REPO, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"hermetic {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return Result(p.returncode, p.stdout, p.stderr)


def popen(root: Path, *args: str | Path, env: dict[str, str], cwd: Path | None = None, code: Path | None = None,
          output: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """hermetic started, not waited for; ``output=subprocess.DEVNULL`` for a process nobody reads."""
    return subprocess.Popen(command(root, *args), stdout=output, stderr=output, text=True,
                            env=_with_code(env, code), cwd=cwd or code or REPO)


class Hermetic:
    """hermetic bound to a root and an environment: ``h("realize", recipe, check=True)``."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env

    def __call__(self, *args: str | Path, root: Path | None = None, check: bool = False,
                 env: dict[str, str] | None = None, timeout: float = 600) -> Result:
        return run(root or self.root, *args, env={**self.env, **(env or {})}, check=check, timeout=timeout)

    def popen(self, *args: str | Path, root: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return popen(root or self.root, *args, env={**self.env, **(env or {})})
