"""What a lock reader yields, and the checks both readers apply to a locked wheel.

``LockedWheel`` and ``Lock`` are the records; the functions check the parts of an entry that the pip hash
lock and PEP 751 share: control characters, environment markers, wheel file names and tags, locations.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from hermetic.errors import BadInput
from hermetic.locks.types import Lock, LockedWheel
from hermetic.urls import file_url_path

__all__ = ["Lock", "LockedWheel"]


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
WHEELS_ONLY = "lock wheels: build the package into a wheel and lock that, or lock with --only-binary :all:"


def no_control(text: str, what: str, where: str) -> str:
    if _CONTROL.search(text):
        raise BadInput(f"control character in {what} {text!r}", where=where,
                       hint="remove it: names and paths in a lock are printable text")
    return text


def parse_marker(text: str, where: str) -> Marker:
    try:
        return Marker(text)
    except InvalidMarker as e:
        raise BadInput(f"invalid environment marker {text!r}: {e}", where=where,
                       hint="write a PEP 508 marker, e.g. sys_platform == 'linux'") from None


def eval_marker(text: str, env: dict[str, Any], where: str) -> bool:
    marker = parse_marker(text, where)
    try:
        return marker.evaluate(env)
    except (UndefinedComparison, UndefinedEnvironmentName) as e:  # a missing variable, an undefined comparison
        raise BadInput(f"cannot evaluate marker {text!r}: {e}", where=where,
                       hint="use PEP 508 marker variables; compare versions only with versions") from None


def parse_filename(filename: str, where: str) -> tuple[str, str]:
    """The canonical name and the version of a wheel file name."""
    no_control(filename, "wheel file name", where)
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        raise BadInput(f"invalid wheel file name {filename!r}: {e}", where=where,
                       hint="a wheel file name reads NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl") from None
    return canonicalize_name(name), str(version)


def tag_rank(filename: str, rank: dict[Tag, int]) -> int | None:
    """Priority of the wheel's best tag for this interpreter (lower is better); None: not installable here."""
    ranks = [rank[t] for t in parse_wheel_filename(filename)[3] if t in rank]
    return min(ranks) if ranks else None


def no_wheel(name: str, filenames: Sequence[str], tags: Sequence[Tag], where: str,
             env: dict[str, Any] | None = None) -> BadInput:
    best = str(tags[0]) if tags else "(none)"
    python = f" (Python {env['python_full_version']})" if env and "python_full_version" in env else ""
    return BadInput(f"no wheel for this interpreter{python} in the lock for {name!r}: {', '.join(filenames)}",
                    where=where, hint=f"this interpreter's best tag is {best}; re-lock for this interpreter and "
                                      "platform, or name the interpreter the lock is for (recipe.python)")


def resolve_location(loc: str, base: Path, where: str) -> tuple[str | None, Path | None]:
    """An http(s) URL, a file: URL (becomes a path) or a path relative to the lock's folder."""
    no_control(loc, "location", where)
    if not SCHEME.match(loc):
        return None, Path(os.path.normpath(base / loc))
    parts = urlsplit(loc)
    if parts.scheme in ("http", "https") and parts.netloc:
        return loc, None
    if parts.scheme == "file":
        return None, file_url_path(loc, where)
    raise BadInput(f"unsupported URL {loc!r}", where=where,
                   hint="give the wheel by an http(s) URL, a file:/// URL or a local path")


def basename(loc: str) -> str:
    """The file name at the end of a URL or a path."""
    return unquote(urlsplit(loc).path.rsplit("/", 1)[-1]) if SCHEME.match(loc) else Path(loc).name
