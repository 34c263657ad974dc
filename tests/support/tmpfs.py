"""A small tmpfs for a test whose failure (before a fix) would write until the file system is full: the write
fills the tmpfs, never the real disk. Needs root (or CAP_SYS_ADMIN); elsewhere the test skips."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(mnt: Path, size: str = "32m") -> Iterator[Path]:
    mnt.mkdir(parents=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip() or p.returncode}): needs root or CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
