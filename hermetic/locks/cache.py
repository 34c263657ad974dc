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

CACHE_VERSION = 1


def read_lock_cached(state: Path, path: Path) -> Lock:
    cache = state / "locks" / (fs.sha256_bytes(str(path.resolve()).encode())[:24] + ".json")
    key = [CACHE_VERSION, fs.fingerprint(path), fs.fingerprint(Path(sys.executable).resolve())]
    try:
        data = json.loads(cache.read_text())
        if data["key"] == json.loads(json.dumps(key)):
            return _decode(data["lock"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from hermetic.locks.read import read_lock
    lock = read_lock(path)
    fs.atomic_write(cache, fs.canonical_json({"key": key, "lock": _encode(lock)}), durable=False)
    return lock


def _encode(lock: Lock) -> dict[str, Any]:
    encoded: dict[str, Any] = json.loads(json.dumps(asdict(lock), default=str))
    return encoded


def _decode(d: dict[str, Any]) -> Lock:
    wheels = tuple(LockedWheel(**{**w, "hashes": tuple(w["hashes"]), "path": Path(w["path"]) if w["path"] else None})
                   for w in d["wheels"])
    return Lock(Path(d["path"]), d["sha256"], d["format"], wheels, tuple(d.get("warnings", ())))
