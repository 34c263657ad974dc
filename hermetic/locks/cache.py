"""Parsed locks cached by stat fingerprint: an unchanged lock is not parsed again.

Parsing evaluates markers and wheel tags with packaging, whose import alone costs more than laying out a
whole tree from a warm store. The cache holds the parsed records keyed by the lock and the interpreter they
were evaluated for, valid while both keep their stat fingerprints (PRODUCT.md: a realize trusts recorded
fingerprints and re-reads only what changed).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic import fs
from hermetic.locks.types import Lock, LockedWheel

if TYPE_CHECKING:
    from hermetic.interpreter import Interpreter


def read_lock_cached(cache: fs.FingerprintCache, path: Path, python: Interpreter) -> Lock:
    """``path`` parsed for the interpreter ``python`` (its markers and tags), from ``cache`` (root's ``locks``
    bucket) while the lock and the interpreter are unchanged."""
    key = f"{fs.resolve(path)}\0{python.executable}"
    found = cache.get(key)
    if isinstance(found, dict):
        try:
            return _decode(found)
        except (KeyError, TypeError, ValueError):
            pass  # a record of another shape: parse again
    from hermetic.locks.read import read_lock
    lock = read_lock(path, environment=python.markers, tags=python.tag_list())
    cache.put(key, _encode(lock), [path, python.executable])
    return lock


def _encode(lock: Lock) -> dict[str, Any]:
    encoded: dict[str, Any] = json.loads(json.dumps(asdict(lock), default=str))
    return encoded


def _decode(d: dict[str, Any]) -> Lock:
    wheels = tuple(LockedWheel(**{**w, "hashes": tuple(w["hashes"]), "path": Path(w["path"]) if w["path"] else None})
                   for w in d["wheels"])
    return Lock(Path(d["path"]), d["sha256"], d["format"], wheels, tuple(d.get("warnings", ())))
