"""Lock readers: a pip hash lock or a PEP 751 pylock.toml becomes the list of wheels to fetch.

Pure functions: no network, no file but the lock itself. Markers and wheel tags are evaluated here for the
interpreter described by ``environment`` and ``tags``, so that callers see exactly the files to install.
The records are in ``types``, the formats in ``piplock`` and ``pylock`` (built on ``packaging.pylock``); this
module picks the format.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.tags import Tag, sys_tags

from hermetic.locks.piplock import read_pip_hash
from hermetic.locks.pylock import read_pylock
from hermetic.locks.types import Lock, LockedWheel
from hermetic.tomlutil import read_input

__all__ = ["Lock", "LockedWheel", "read_lock"]


def read_lock(path: Path, *, environment: dict[str, str] | None = None,
              tags: Sequence[Tag] | None = None) -> Lock:
    """Read a lock for one interpreter: markers are evaluated with ``environment`` (keys it lacks come from
    the running interpreter) and pylock wheels chosen by ``tags`` (best first). Any problem is BadInput."""
    env: dict[str, Any] = {**default_environment(), **(environment or {})}
    tag_list = list(tags) if tags is not None else list(sys_tags())
    raw = read_input(path, "lock file")
    warnings: list[str] = []
    if re.fullmatch(r"pylock\..*toml", path.name):
        fmt, (wheels, warnings) = "pylock", read_pylock(path, raw, env, tag_list)
    else:
        fmt, wheels = "pip-hash", read_pip_hash(path, raw, env, tag_list)
    return Lock(path, hashlib.sha256(raw).hexdigest(), fmt, tuple(sorted(wheels, key=lambda w: w.name)),
                tuple(warnings))
