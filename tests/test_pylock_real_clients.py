"""Acceptance: pylock.toml files written by the real clients (`uv pip compile`, `pip lock`) are accepted.

The clients run in a throwaway venv against a loopback index serving wheels built here, with every home,
cache and temp directory inside tmp_path, so the test leaves nothing behind and reaches no index but its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from packaging.markers import default_environment
from packaging.tags import compatible_tags, cpython_tags

from hermetic.locks.read import read_lock
from hermetic.locks.types import Lock
from tests.support.clients import isolated_env, run
from tests.support.index import LoopbackIndex, serve_index
from tests.support.wheels import BuiltWheel, build_wheel

PY = f"{sys.version_info.major}{sys.version_info.minor}"


Served = tuple[LoopbackIndex, dict[str, BuiltWheel]]


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Served]:
    wheels_dir = tmp_path / "wheels"
    wheels = {
        "alpha": build_wheel(wheels_dir, "alpha-pkg", "1.0", {"alpha_pkg/__init__.py": "A = 1\n"},
                             requires=["beta>=2", "gamma; sys_platform == 'win32'"]),
        "beta1": build_wheel(wheels_dir, "beta", "1.0", {"beta/__init__.py": "B = 1\n"}),
        "beta2": build_wheel(wheels_dir, "beta", "2.0", {"beta/__init__.py": "B = 2\n"}),
        "gamma": build_wheel(wheels_dir, "gamma", "3.0", {"gamma/__init__.py": ""}),
        "gamma-win": build_wheel(wheels_dir, "gamma", "3.0", {"gamma/__init__.py": "# win\n"},
                                 tag=f"cp{PY}-cp{PY}-win_amd64"),
    }

    with serve_index(*(w.path for w in wheels.values())) as idx:
        yield idx, wheels


def _check(lock: Lock, idx: LoopbackIndex, expected: list[BuiltWheel]) -> None:
    got = [(w.name, w.version, w.hashes, w.url, w.filename, w.path) for w in lock.wheels]
    assert got == [(w.name, w.version, (w.sha256,), f"{idx.url}/files/{w.filename}", w.filename, None)
                   for w in expected]
    for locked, built in zip(lock.wheels, expected, strict=True):
        assert locked.size in (None, built.size)  # optional in PEP 751; the loopback index sends no sizes


def test_index_answers_head(index: Served) -> None:
    # uv probes a wheel with HEAD (for range requests) when the index has no PEP 658 metadata.
    idx, wheels = index
    wheel = f"/files/{wheels['beta2'].filename}"

    def head(path: str) -> tuple[int, dict[str, str], bytes]:
        conn = HTTPConnection(urlsplit(idx.url).netloc, timeout=30)
        try:
            conn.request("HEAD", path)
            answer = conn.getresponse()
            return answer.status, dict(answer.getheaders()), answer.read()
        finally:
            conn.close()

    status, headers, body = head(wheel)
    assert (status, int(headers["Content-Length"]), body) == (200, wheels["beta2"].size, b"")
    status, headers, body = head("/simple/beta/")
    assert status == 200 and headers["Content-Type"] == "text/html" and body == b""
    idx.state.fail_next = 1
    assert head(wheel)[0] == 503 and head(wheel)[0] == 200
    assert idx.state.head_requests == [wheel, "/simple/beta/", wheel, wheel] and idx.state.requests == []


def test_uv_pip_compile_pylock(client_venv: Path, index: Served, tmp_path: Path) -> None:
    idx, wheels = index
    env = {**isolated_env(tmp_path / "uv-run"), "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
    (tmp_path / "requirements.in").write_text("alpha-pkg\n")
    out = tmp_path / "uv" / "pylock.toml"
    done = run([str(client_venv / "bin/uv"), "pip", "compile", "--quiet", "--format", "pylock.toml",
                "--universal", "--index-url", idx.simple_url, "--no-cache", "--python",
                str(client_venv / "bin/python"), "-o", str(out), str(tmp_path / "requirements.in")], env)
    assert done.returncode == 0, done.stdout + done.stderr
    print(out.read_text())
    assert 'created-by = "uv"' in out.read_text()

    lock = read_lock(out)
    assert lock.format == "pylock" and lock.warnings == ()
    _check(lock, idx, [wheels["alpha"], wheels["beta2"]])  # gamma's marker (win32) is false here

    # The universal lock also serves Windows: there gamma is installed, from its platform wheel.
    win_env = {**{k: str(v) for k, v in default_environment().items()},
               "sys_platform": "win32", "platform_system": "Windows", "os_name": "nt"}
    win_tags = [*cpython_tags(sys.version_info[:2], [f"cp{PY}"], ["win_amd64"]),
                *compatible_tags(sys.version_info[:2], f"cp{PY}", ["win_amd64"])]
    windows = read_lock(out, environment=win_env, tags=win_tags)
    _check(windows, idx, [wheels["alpha"], wheels["beta2"], wheels["gamma-win"]])


def test_pip_lock_pylock(client_venv: Path, index: Served, tmp_path: Path) -> None:
    idx, wheels = index
    env = {**isolated_env(tmp_path / "pip-run"), "PIP_CONFIG_FILE": os.devnull}
    out = tmp_path / "pip" / "pylock.toml"
    out.parent.mkdir()  # pip lock -o does not create missing folders (uv does)
    done = run([str(client_venv / "bin/python"), "-m", "pip", "lock", "--isolated",
                "--disable-pip-version-check", "--no-cache-dir", "--index-url", idx.simple_url, "-o", str(out),
                "alpha-pkg"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    print(out.read_text())
    assert 'created-by = "pip"' in out.read_text()

    lock = read_lock(out)
    assert lock.format == "pylock" and lock.warnings == ()
    _check(lock, idx, [wheels["alpha"], wheels["beta2"]])
    # pip locks for the running environment only: no gamma at all, not even under a marker.
    assert "gamma" not in out.read_text()
