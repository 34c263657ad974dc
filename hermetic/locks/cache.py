"""Parsed locks cached by stat fingerprint: an unchanged lock is not parsed again.

Parsing evaluates markers and wheel tags with packaging, whose import alone costs more than laying out a
whole tree from a warm store. The cache holds the parsed records keyed by the lock's and the interpreter's
stat fingerprints (PRODUCT.md: a realize trusts recorded fingerprints and re-reads only what changed).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.locks.types import Lock, LockedWheel


def read_lock_cached(cache: fs.FingerprintCache, path: Path) -> Lock:
    """``path`` parsed for the running interpreter, from ``cache`` (root's ``locks`` bucket) while the lock and
    the interpreter are unchanged."""
    found = cache.get(str(fs.resolve(path)))
    if isinstance(found, dict):
        try:
            return _decode(found)
        except (KeyError, TypeError, ValueError):
            pass  # a record of another shape: parse again
    from hermetic.locks.read import read_lock
    lock = read_lock(path)
    cache.put(str(fs.resolve(path)), _encode(lock), [path, Path(sys.executable).resolve()])
    return lock


def _encode(lock: Lock) -> dict[str, Any]:
    encoded: dict[str, Any] = json.loads(json.dumps(asdict(lock), default=str))
    return encoded


def _decode(d: dict[str, Any]) -> Lock:
    wheels = tuple(LockedWheel(**{**w, "hashes": tuple(w["hashes"]), "path": Path(w["path"]) if w["path"] else None})
                   for w in d["wheels"])
    return Lock(Path(d["path"]), d["sha256"], d["format"], wheels, tuple(d.get("warnings", ())))
