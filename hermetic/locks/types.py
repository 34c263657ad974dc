"""The records a lock reader yields. No dependencies, so that cached locks load without packaging."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LockedWheel:
    name: str                  # canonical name
    version: str | None
    hashes: tuple[str, ...]    # acceptable sha256 hex digests, lowercase, sorted
    filename: str | None       # exact wheel filename when the lock names one (pylock: always)
    url: str | None            # absolute http(s) URL when the lock gives one
    path: Path | None          # absolute local path: relative paths and file: URLs resolved
    size: int | None
    where: str                 # "manifests/x.txt:12" for messages
    index: str | None = None   # pylock package `index` (a simple-API base URL) when given


@dataclass(frozen=True)
class Lock:
    path: Path
    sha256: str                # of the lock file bytes
    format: str                # "pip-hash" or "pylock"
    wheels: tuple[LockedWheel, ...]   # after marker evaluation, sorted by name
    warnings: tuple[str, ...] = ()    # unknown keys tolerated in a pylock of a newer 1.x minor version
