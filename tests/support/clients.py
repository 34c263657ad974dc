"""The real clients, pip (>= 25.1, so `pip lock` and truststore) and uv, in a throwaway venv.

``make_client_venv`` builds the venv (the one install that uses the machine's pip configuration: it is how the
index is reached); ``isolated_env`` is an environment for running them with every home, cache and temp
directory inside one folder and no pip or uv settings, so a test leaves nothing behind and reaches no index
but its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# What pip prints when the package index cannot be reached (as opposed to a real install failure).
_NO_NETWORK = re.compile(r"Failed to establish a new connection|Temporary failure in name resolution|"
                         r"Name or service not known|Network is unreachable|No route to host|"
                         r"Max retries exceeded|ConnectTimeoutError|ReadTimeoutError|ProxyError|"
                         r"Could not fetch URL|NewConnectionError|connection broken", re.I)


def isolated_env(root: Path) -> dict[str, str]:
    """The caller's environment minus pip/uv settings, with every writable home inside ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    for name in ("home", "cache", "config", "data", "state", "tmp", "uv-cache", "pip-cache"):
        (root / name).mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(root / "home"), XDG_CACHE_HOME=str(root / "cache"),
               XDG_CONFIG_HOME=str(root / "config"), XDG_DATA_HOME=str(root / "data"),
               XDG_STATE_HOME=str(root / "state"), TMPDIR=str(root / "tmp"),
               UV_CACHE_DIR=str(root / "uv-cache"), PIP_CACHE_DIR=str(root / "pip-cache"))
    return env


def run(cmd: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def make_client_venv(root: Path) -> Path:
    """A venv under ``root`` holding uv and pip>=25.1; skips only when the package index is unreachable."""
    venv_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv_dir)], check=True, timeout=300)
    # Only the config locations are kept from the real environment; everything written stays under root.
    env = {**os.environ, **isolated_env(root / "install")}
    env["XDG_CONFIG_HOME"] = os.environ.get("XDG_CONFIG_HOME", str(Path.home() / ".config"))
    if "PIP_CONFIG_FILE" not in env and (Path.home() / ".pip/pip.conf").is_file():
        env["PIP_CONFIG_FILE"] = str(Path.home() / ".pip/pip.conf")  # pip's legacy per-user file
    done = run([str(venv_dir / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                "pip>=25.1", "uv"], env, timeout=600)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if _NO_NETWORK.search(output):
            print(f"pip could not reach the package index:\n{output}")
            pytest.skip("no network: cannot install uv and pip>=25.1 (see captured output)")
        pytest.fail(f"installing uv and pip>=25.1 failed:\n{output}")
    return venv_dir
