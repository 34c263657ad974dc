"""The pip hash lock: requirement lines pinned to one version, each with --hash=sha256:HEX.

The format pip writes with ``pip-compile --generate-hashes`` or ``uv pip compile --generate-hashes``: a
name==version pin (found later in the indexes), a direct URL or path to a wheel, or a wheel file name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_name

from hermetic.errors import BadInput
from hermetic.locks.types import LockedWheel
from hermetic.locks.validate import (
    SCHEME,
    WHEELS_ONLY,
    basename,
    eval_marker,
    no_control,
    no_wheel,
    parse_filename,
    resolve_location,
    tag_rank,
)
from hermetic.tomlutil import decode_utf8

_HEX_LEN = {"sha256": 64, "sha384": 96, "sha512": 128}  # what pip accepts besides sha256
_COMMENT = re.compile(r"(^|\s+)#.*$")


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """pip's req_file.join_lines, yielding the first line's number: a line ending in a backslash goes on in the
    next one unless it is a comment line (its first non-blank character a #). Comments are stripped only
    after joining, so a trailing comment ending in a backslash swallows the next line, as in pip."""
    pending: list[str] = []
    first = 0
    # Not str.splitlines: it also splits at \x0b, \x0c and \x1c-\x1e, which must be reported, not obeyed.
    for number, line in enumerate(text.removesuffix("\n").split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.endswith("\\") or _COMMENT.match(line):
            if _COMMENT.match(line):
                line = " " + line  # so that stripping comments finds it inside a joined line
            if pending:
                yield first, "".join([*pending, line])
                pending = []
            else:
                yield number, line
        else:
            first = first if pending else number
            pending.append(line.strip("\\"))  # pip strips every backslash at either end
    if pending:
        yield first, "".join(pending)


def requirement_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines pip reads from a requirements file, numbered (pip's req_file.preprocess: join_lines, then
    ignore_comments; hermetic expands no ${VARIABLES}, so that the lock means one thing everywhere)."""
    for number, line in _logical_lines(text):
        line = _COMMENT.sub("", line).strip()
        if line:
            yield number, line


_OPTION_ERRORS = [  # (options, why they cannot be in a lock, what to do)
    ({"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--no-index", "--trusted-host"},
     "indexes come from pip's configuration, not the lock", "delete the line; set the index in pip.conf or "
     "PIP_INDEX_URL"),
    ({"-r", "--requirement", "-c", "--constraint"}, "hermetic reads one self-contained lock",
     "copy the pinned, hashed lines of that file into this one"),
    ({"-e", "--editable"}, "an editable requirement cannot be locked by hash",
     "build a wheel and lock it as name==version --hash=sha256:HEX"),
]


def _option_error(option: str, where: str) -> BadInput:
    why, hint = next(((why, hint) for options, why, hint in _OPTION_ERRORS if option in options),
                     ("it is not supported", "a lock holds only requirement lines with --hash=sha256:HEX"))
    return BadInput(f"option {option} in a lock: {why}", where=where, hint=hint)


def _hashes(options: list[str], where: str) -> tuple[str, ...]:
    values: list[str] = []
    rest = iter(options)
    for opt in rest:
        if opt.startswith("--hash="):
            values.append(opt.removeprefix("--hash="))
        elif opt == "--hash":
            values.append(next(rest, ""))
        else:
            raise _option_error(opt.split("=", 1)[0], where)
    if not values:
        raise BadInput("requirement has no hash", where=where,
                       hint="add --hash=sha256:HEX for each acceptable file (`pip hash FILE` prints it)")
    sha256: set[str] = set()
    for value in values:
        algo, sep, digest = value.partition(":")
        algo, digest = algo.lower(), digest.lower()
        if algo not in _HEX_LEN or not sep:
            weak = algo in ("md5", "sha1", "sha224")
            raise BadInput(f"{algo} is too weak to lock with" if weak else f"bad hash {value!r}", where=where,
                           hint="write --hash=sha256:HEX (`pip hash FILE` prints it)")
        if not re.fullmatch(f"[0-9a-f]{{{_HEX_LEN[algo]}}}", digest):
            raise BadInput(f"bad {algo} digest {digest!r}: expected {_HEX_LEN[algo]} hex digits", where=where,
                           hint="copy the digest again (`pip hash FILE` prints it)")
        if algo == "sha256":
            sha256.add(digest)
    if not sha256:
        raise BadInput("requirement has no sha256 hash", where=where,
                       hint="add --hash=sha256:HEX: hermetic checks every download with sha256")
    return tuple(sorted(sha256))


def _pip_line(line: str, base: Path, env: dict[str, Any], tags: list[Tag], where: str) -> LockedWheel | None:
    tokens = line.split()
    cut = next((i for i, t in enumerate(tokens) if t.startswith("-")), len(tokens))
    spec, hashes = " ".join(tokens[:cut]), _hashes(tokens[cut:], where)
    location, _, marker = (part.strip() for part in spec.partition(";"))
    url: str | None = None
    path: Path | None = None
    if location.endswith(".whl") and "@" not in location.split("/")[0]:
        # A wheel named by its file name (found later in the indexes), by a path, or by a bare URL.
        filename = basename(location)
        name, version = parse_filename(filename, where)
        if marker and not eval_marker(marker, env, where):
            return None
        if "/" in location or SCHEME.match(location):
            url, path = resolve_location(location, base, where)
    else:
        try:
            req = Requirement(spec)
        except InvalidRequirement as e:
            raise BadInput(f"cannot parse requirement {spec!r}: {e}", where=where,
                           hint="write name==version --hash=sha256:HEX") from None
        if req.marker is not None and not eval_marker(str(req.marker), env, where):
            return None
        name = canonicalize_name(req.name)
        if not req.url:
            specs = list(req.specifier)
            if len(specs) != 1 or specs[0].operator not in ("==", "===") or specs[0].version.endswith(".*"):
                raise BadInput(f"requirement {spec!r} is not pinned to one version", where=where,
                               hint=f"pin it exactly: {req.name}==VERSION --hash=sha256:HEX")
            return LockedWheel(name, specs[0].version, hashes, None, None, None, None, where)
        filename = basename(req.url)
        if not filename.endswith(".whl"):
            raise BadInput(f"{req.name} @ {req.url} is not a wheel: hermetic installs wheels only",
                           where=where, hint=WHEELS_ONLY)
        url, path = resolve_location(req.url, base, where)
        wheel_name, version = parse_filename(filename, where)
        if wheel_name != name:
            raise BadInput(f"{filename!r} is not a wheel of {req.name!r}", where=where,
                           hint="fix the name or the URL")
    if tag_rank(filename, {t: i for i, t in enumerate(tags)}) is None:
        raise no_wheel(name, [filename], tags, where, env)
    return LockedWheel(name, version, hashes, filename, url, path, None, where)


def read_pip_hash(path: Path, raw: bytes, env: dict[str, Any], tags: list[Tag]) -> list[LockedWheel]:
    """The wheels of the lock ``raw`` (read from ``path``) whose markers hold in ``env``, one per name."""
    text = decode_utf8(path, raw, "lock", bom=True)
    base = path.absolute().parent
    seen: dict[str, LockedWheel] = {}
    for number, text_line in requirement_lines(text):
        where = f"{path}:{number}"
        line = no_control(text_line, "line", where)
        if line.split()[0] == "--require-hashes":
            continue  # hermetic always requires hashes, so that line only restates it
        if line.startswith("-"):
            raise _option_error(line.split()[0].split("=", 1)[0], where)
        wheel = _pip_line(line, base, env, tags, where)
        if wheel is not None and wheel.name in seen:
            raise BadInput(f"{wheel.name!r} is locked twice (also at {seen[wheel.name].where})", where=where,
                           hint="keep one line per package, or add markers so that only one applies")
        if wheel is not None:
            seen[wheel.name] = wheel
    return list(seen.values())
