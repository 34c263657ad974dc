"""Reading test locks: an interpreter (Linux or Windows, CPython 3.11), digests, and helpers that write a
lock under tmp_path, read it for that interpreter, or expect it to be rejected with a located BadInput."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from packaging.tags import Tag, compatible_tags, cpython_tags

from hermetic.errors import BadInput
from hermetic.locks.read import read_lock
from hermetic.locks.types import Lock

PLATFORMS = ["manylinux_2_17_x86_64", "linux_x86_64"]
TAGS = [*cpython_tags((3, 11), ["cp311"], PLATFORMS), *compatible_tags((3, 11), "cp311", PLATFORMS)]
ENV = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "python_version": "3.11", "python_full_version": "3.11.7", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "implementation_version": "3.11.7"}
WIN_ENV = {**ENV, "sys_platform": "win32", "platform_system": "Windows", "os_name": "nt",
           "platform_machine": "AMD64"}
WIN_TAGS = [*cpython_tags((3, 11), ["cp311"], ["win_amd64"]),
            *compatible_tags((3, 11), "cp311", ["win_amd64"])]
H1, H2, H3 = "1" * 64, "a" * 64, "0123456789abcdef" * 4
T1, T2, T3 = (f'{{ sha256 = "{h}" }}' for h in (H1, H2, H3))  # pylock hashes tables


def write(tmp_path: Path, text: str, name: str = "requirements.txt") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).removeprefix("\n"))
    return path


def read(tmp_path: Path, text: str, name: str = "requirements.txt", environment: dict[str, str] = ENV,
         tags: list[Tag] = TAGS) -> Lock:
    return read_lock(write(tmp_path, text, name), environment=environment, tags=tags)


def fails(tmp_path: Path, text: str, name: str = "requirements.txt") -> BadInput:
    with pytest.raises(BadInput) as info:
        read(tmp_path, text, name)
    err = info.value
    assert err.exit_code == 2 and err.hint, err.render()
    assert err.where is not None and err.where.startswith(str(tmp_path / name)), err.where
    return err


def line_of(err: BadInput) -> int:
    assert err.where is not None
    return int(err.where.split(":")[1])
