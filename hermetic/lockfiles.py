"""Lock readers: a pip hash lock or a PEP 751 pylock.toml becomes the list of wheels to fetch.

Pure functions: no network, no file but the lock itself. Markers and wheel tags are evaluated here for the
interpreter described by ``environment`` and ``tags``, so that callers see exactly the files to install.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

from packaging.markers import InvalidMarker, Marker, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from hermetic.errors import BadInput
from hermetic.tomlutil import KeyPath, TomlDoc, check_keys, expect_type, get_key, parse_toml, read_input


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


_HEX_LEN = {"sha256": 64, "sha384": 96, "sha512": 128}  # what pip accepts besides sha256
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_COMMENT = re.compile(r"(^|\s+)#.*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_WHEELS_ONLY = "lock wheels: build the package into a wheel and lock that, or lock with --only-binary :all:"


def read_lock(path: Path, *, environment: dict[str, str] | None = None,
              tags: Sequence[Tag] | None = None) -> Lock:
    """Read a lock for one interpreter: markers are evaluated with ``environment`` (keys it lacks come from
    the running interpreter) and pylock wheels chosen by ``tags`` (best first). Any problem is BadInput."""
    env: dict[str, Any] = {**default_environment(), **(environment or {})}
    tag_list = list(tags) if tags is not None else list(sys_tags())
    raw = read_input(path, "lock file")
    warnings: list[str] = []
    if re.fullmatch(r"pylock\..*toml", path.name):
        if not re.fullmatch(r"pylock\.([^.]+\.)?toml", path.name):
            raise BadInput(f"{path.name!r} is not a PEP 751 lock file name", where=str(path),
                           hint="name it pylock.toml or pylock.NAME.toml, with no dot in NAME")
        fmt, wheels = "pylock", _Pylock(parse_toml(path, raw), env, tag_list, warnings).read()
    else:
        fmt, wheels = "pip-hash", _read_pip_hash(path, raw, env, tag_list)
    return Lock(path, hashlib.sha256(raw).hexdigest(), fmt, tuple(sorted(wheels, key=lambda w: w.name)),
                tuple(warnings))


# --- shared checks ---------------------------------------------------------------------------------------

def _no_control(text: str, what: str, where: str) -> str:
    if _CONTROL.search(text):
        raise BadInput(f"control character in {what} {text!r}", where=where,
                       hint="remove it: names and paths in a lock are printable text")
    return text


def _eval_marker(text: str, env: dict[str, Any], where: str, *, lock_file: bool = False) -> bool:
    try:
        marker = Marker(text)
    except InvalidMarker as e:
        raise BadInput(f"invalid environment marker {text!r}: {e}", where=where,
                       hint="write a PEP 508 marker, e.g. sys_platform == 'linux'") from None
    try:
        return marker.evaluate(env, "lock_file") if lock_file else marker.evaluate(env)
    except ValueError as e:  # an unknown variable, or an ordering comparison of non-versions
        raise BadInput(f"cannot evaluate marker {text!r}: {e}", where=where,
                       hint="use PEP 508 marker variables; compare versions only with versions") from None


def _parse_filename(filename: str, where: str) -> tuple[str, str]:
    _no_control(filename, "wheel file name", where)
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        raise BadInput(f"invalid wheel file name {filename!r}: {e}", where=where,
                       hint="a wheel file name reads NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl") from None
    return canonicalize_name(name), str(version)


def _tag_rank(filename: str, rank: dict[Tag, int]) -> int | None:
    """Priority of the wheel's best tag for this interpreter (lower is better); None: not installable here."""
    ranks = [rank[t] for t in parse_wheel_filename(filename)[3] if t in rank]
    return min(ranks) if ranks else None


def _no_wheel(name: str, filenames: Sequence[str], tags: Sequence[Tag], where: str) -> BadInput:
    best = str(tags[0]) if tags else "(none)"
    return BadInput(f"no wheel for this interpreter in the lock for {name!r}: {', '.join(filenames)}",
                    where=where, hint=f"this interpreter's best tag is {best}; re-lock for this platform")


def _location(loc: str, base: Path, where: str) -> tuple[str | None, Path | None]:
    """An http(s) URL, a file: URL (becomes a path) or a path relative to the lock's folder."""
    _no_control(loc, "location", where)
    if not _SCHEME.match(loc):
        return None, Path(os.path.normpath(base / loc))
    parts = urlsplit(loc)
    if parts.scheme in ("http", "https") and parts.netloc:
        return loc, None
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return None, Path(url2pathname(parts.path))
    raise BadInput(f"unsupported URL {loc!r}", where=where,
                   hint="give the wheel by an http(s) URL, a file:/// URL or a local path")


def _basename(loc: str) -> str:
    return unquote(urlsplit(loc).path.rsplit("/", 1)[-1]) if _SCHEME.match(loc) else Path(loc).name


# --- pip hash locks --------------------------------------------------------------------------------------

def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Join backslash continuations as pip does (a comment line ends one); yield the first line's number."""
    pending: list[str] = []
    first = 0
    # Not str.splitlines: it also splits at \x0b, \x0c and \x1c-\x1e, which must be reported, not obeyed.
    for number, line in enumerate(text.removesuffix("\n").split("\n"), 1):
        line = line.removesuffix("\r")
        if line.endswith("\\") and not _COMMENT.search(line):
            first = first if pending else number
            pending.append(line[:-1])
        elif pending:
            yield first, "".join(pending) + (" " + line if _COMMENT.match(line) else line)
            pending = []
        else:
            yield number, line
    if pending:
        yield first, "".join(pending)


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
        filename = _basename(location)
        name, version = _parse_filename(filename, where)
        if marker and not _eval_marker(marker, env, where):
            return None
        if "/" in location or _SCHEME.match(location):
            url, path = _location(location, base, where)
    else:
        try:
            req = Requirement(spec)
        except InvalidRequirement as e:
            raise BadInput(f"cannot parse requirement {spec!r}: {e}", where=where,
                           hint="write name==version --hash=sha256:HEX") from None
        if req.marker is not None and not _eval_marker(str(req.marker), env, where):
            return None
        name = canonicalize_name(req.name)
        if not req.url:
            specs = list(req.specifier)
            if len(specs) != 1 or specs[0].operator not in ("==", "===") or specs[0].version.endswith(".*"):
                raise BadInput(f"requirement {spec!r} is not pinned to one version", where=where,
                               hint=f"pin it exactly: {req.name}==VERSION --hash=sha256:HEX")
            return LockedWheel(name, specs[0].version, hashes, None, None, None, None, where)
        filename = _basename(req.url)
        if not filename.endswith(".whl"):
            raise BadInput(f"{req.name} @ {req.url} is not a wheel: hermetic installs wheels only",
                           where=where, hint=_WHEELS_ONLY)
        url, path = _location(req.url, base, where)
        wheel_name, version = _parse_filename(filename, where)
        if wheel_name != name:
            raise BadInput(f"{filename!r} is not a wheel of {req.name!r}", where=where,
                           hint="fix the name or the URL")
    if _tag_rank(filename, {t: i for i, t in enumerate(tags)}) is None:
        raise _no_wheel(name, [filename], tags, where)
    return LockedWheel(name, version, hashes, filename, url, path, None, where)


def _read_pip_hash(path: Path, raw: bytes, env: dict[str, Any], tags: list[Tag]) -> list[LockedWheel]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        number = raw[: e.start].count(b"\n") + 1
        raise BadInput(f"lock is not valid UTF-8 (byte {e.start})", where=f"{path}:{number}",
                       hint="re-save the file as UTF-8") from None
    base = path.absolute().parent
    seen: dict[str, LockedWheel] = {}
    for number, physical in _logical_lines(text):
        where = f"{path}:{number}"
        line = _no_control(_COMMENT.sub("", physical).strip(), "line", where)
        if not line or line.split()[0] == "--require-hashes":
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


# --- PEP 751 pylock.toml ---------------------------------------------------------------------------------

_TOP_KEYS = {"lock-version", "environments", "requires-python", "extras", "dependency-groups",
             "default-groups", "created-by", "packages", "tool"}
_PACKAGE_KEYS = {"name", "version", "marker", "requires-python", "dependencies", "index", "vcs", "directory",
                 "archive", "sdist", "wheels", "attestation-identities", "tool"}
_FILE_KEYS = {"name", "upload-time", "url", "path", "size", "hashes", "tool"}
_SOURCES = {"vcs": "a VCS checkout", "directory": "a source directory", "archive": "an archive",
            "sdist": "an sdist"}


@dataclass
class _Pylock:
    doc: TomlDoc
    env: dict[str, Any]
    tags: list[Tag]
    warnings: list[str]
    strict: bool = True

    def keys(self, table: dict[str, Any], allowed: set[str], kp: KeyPath) -> None:
        if self.strict:
            check_keys(self.doc, table, allowed, kp)
        else:
            # The spec lets a newer 1.x minor version add keys: an installer warns about them, not fails.
            self.warnings += [f"{self.doc.where(*kp, k)}: unknown key {k!r} ignored (lock-version is newer "
                              "than 1.0)" for k in table if k not in allowed]

    def strings(self, table: dict[str, Any], key: str, kp: KeyPath) -> list[str]:
        items = get_key(self.doc, table, key, list, kp) or []
        return [expect_type(self.doc, v, str, (*kp, key, i)) for i, v in enumerate(items)]

    def python_ok(self, table: dict[str, Any], kp: KeyPath) -> None:
        spec = get_key(self.doc, table, "requires-python", str, kp)
        if spec is None:
            return
        where = self.doc.where(*kp, "requires-python")
        try:
            specifier = SpecifierSet(spec)
        except InvalidSpecifier as e:
            raise BadInput(f"invalid requires-python {spec!r}: {e}", where=where,
                           hint="write a version specifier such as >=3.11") from None
        version = self.env["python_full_version"].rstrip("+")
        if not specifier.contains(version, prereleases=True):
            raise BadInput(f"requires Python {spec}, but the interpreter is Python {version}", where=where,
                           hint="use an interpreter that matches, or re-lock for this one")

    def read(self) -> list[LockedWheel]:
        doc, data = self.doc, self.doc.data
        lock_version = get_key(doc, data, "lock-version", str, (), required=True) or ""
        m = re.fullmatch(r"(\d+)\.(\d+)", lock_version)
        if m is None or m.group(1) != "1":
            raise BadInput(f"unsupported lock-version {lock_version!r}", where=doc.where("lock-version"),
                           hint="hermetic reads PEP 751 lock-version 1.x; re-lock with a current pip or uv")
        self.strict = m.group(2) == "0"
        self.keys(data, _TOP_KEYS, ())
        get_key(doc, data, "created-by", str, (), required=True)
        self.strings(data, "extras", ())
        self.strings(data, "dependency-groups", ())
        # Install what the lock installs by default: no extras, the default dependency groups.
        groups = frozenset(self.strings(data, "default-groups", ()))
        self.env.update(extras=frozenset(), dependency_groups=groups)
        envs = self.strings(data, "environments", ())
        if envs and not any(_eval_marker(e, self.env, doc.where("environments", i), lock_file=True)
                            for i, e in enumerate(envs)):
            raise BadInput("the lock supports none of this interpreter's environments", where=doc.where(
                "environments"), hint=f"it was locked for: {'; '.join(envs)}; re-lock for this interpreter")
        self.python_ok(data, ())
        chosen: dict[str, LockedWheel] = {}
        for i, entry in enumerate(get_key(doc, data, "packages", list, (), required=True) or []):
            wheel = self.package(expect_type(doc, entry, dict, ("packages", i)), ("packages", i))
            if wheel is not None and wheel.name in chosen:
                raise BadInput(f"{wheel.name!r} is locked twice for this environment (also at "
                               f"{chosen[wheel.name].where})", where=doc.where("packages", i),
                               hint="give the entries markers that exclude each other")
            if wheel is not None:
                chosen[wheel.name] = wheel
        return list(chosen.values())

    def package(self, pkg: dict[str, Any], kp: KeyPath) -> LockedWheel | None:
        doc = self.doc
        self.keys(pkg, _PACKAGE_KEYS, kp)
        name = canonicalize_name(get_key(doc, pkg, "name", str, kp, required=True) or "")
        version = get_key(doc, pkg, "version", str, kp)
        try:
            Version(version or "0")
        except InvalidVersion:
            raise BadInput(f"invalid version {version!r} for {name!r}", where=doc.where(*kp, "version"),
                           hint="write a PEP 440 version") from None
        index = get_key(doc, pkg, "index", str, kp)
        get_key(doc, pkg, "dependencies", list, kp)  # informational only: installers must not use it
        for j, ident in enumerate(get_key(doc, pkg, "attestation-identities", list, kp) or []):
            ikp = (*kp, "attestation-identities", j)
            get_key(doc, expect_type(doc, ident, dict, ikp), "kind", str, ikp, required=True)
        marker = get_key(doc, pkg, "marker", str, kp)
        if marker and not _eval_marker(marker, self.env, doc.where(*kp, "marker"), lock_file=True):
            return None
        self.python_ok(pkg, kp)
        sources = [k for k in ("vcs", "directory", "archive") if k in pkg]
        if len(sources) + ("sdist" in pkg or "wheels" in pkg) != 1:
            given = sources + [k for k in ("sdist", "wheels") if k in pkg]
            raise BadInput(f"package {name!r} needs exactly one source, found {', '.join(given) or 'none'}",
                           where=doc.where(*kp), hint="give wheels (hermetic installs wheels only)")
        wheels = get_key(doc, pkg, "wheels", list, kp) or []
        if "sdist" in pkg:
            self.file(expect_type(doc, pkg["sdist"], dict, (*kp, "sdist")), (*kp, "sdist"), name)
        if sources or "sdist" in pkg and not wheels:
            what = sources[0] if sources else "sdist"
            raise BadInput(f"package {name!r} is locked as {_SOURCES[what]}: hermetic installs wheels only",
                           where=doc.where(*kp, what), hint=_WHEELS_ONLY)
        if not wheels:
            raise BadInput(f"package {name!r} has an empty wheels list", where=doc.where(*kp, "wheels"),
                           hint="list at least one wheel, with its url or path and its hashes")
        files = [self.file(expect_type(doc, w, dict, (*kp, "wheels", j)), (*kp, "wheels", j), name)
                 for j, w in enumerate(wheels)]
        return self.choose(name, version, index, files, kp)

    def file(self, entry: dict[str, Any], kp: KeyPath, name: str) -> LockedWheel:
        """A checked wheel (or sdist) entry; its hashes are empty when it has no sha256."""
        doc, base = self.doc, self.doc.path.absolute().parent
        self.keys(entry, _FILE_KEYS, kp)
        url_text = get_key(doc, entry, "url", str, kp)
        path_text = get_key(doc, entry, "path", str, kp)
        if url_text is None and path_text is None:
            raise BadInput("the entry has neither url nor path", where=doc.where(*kp),
                           hint='add url = "https://..." or path = "relative/to/the/lock.whl"')
        for key, text in (("url", url_text), ("path", path_text)):
            if text is not None and bool(_SCHEME.match(text)) != (key == "url"):
                raise BadInput(f"{key} {text!r} is {'not an absolute URL' if key == 'url' else 'a URL'}",
                               where=doc.where(*kp, key), hint="put URLs in `url`, local paths in `path`")
        url, path = _location(url_text, base, doc.where(*kp, "url")) if url_text else (None, None)
        if path_text is not None:
            path = _location(path_text, base, doc.where(*kp, "path"))[1]
        filename = get_key(doc, entry, "name", str, kp) or _basename(url_text or path_text or "")
        size = get_key(doc, entry, "size", int, kp)
        if size is not None and size < 0:
            raise BadInput(f"negative size {size}", where=doc.where(*kp, "size"), hint="write the byte count")
        get_key(doc, entry, "upload-time", dt.datetime, kp)
        hashes = get_key(doc, entry, "hashes", dict, kp, required=True) or {}
        if not hashes:
            raise BadInput("the hashes table is empty", where=doc.where(*kp, "hashes"),
                           hint='add sha256 = "<64 hex digits>"')
        for algo, digest in hashes.items():
            expect_type(doc, digest, str, (*kp, "hashes", algo))
            if algo != algo.lower():
                raise BadInput(f"hash algorithm {algo!r} must be lowercase", hint=f"write {algo.lower()}",
                               where=doc.where(*kp, "hashes", algo))
        sha256 = hashes.get("sha256", "").lower()
        if "sha256" in hashes and not re.fullmatch("[0-9a-f]{64}", sha256):
            raise BadInput(f"bad sha256 digest {sha256!r}: expected 64 hex digits",
                           where=doc.where(*kp, "hashes", "sha256"), hint="copy the digest again")
        return LockedWheel(name, None, (sha256,) if sha256 else (), filename, url, path, size, doc.where(*kp))

    def choose(self, name: str, version: str | None, index: str | None, files: list[LockedWheel],
               kp: KeyPath) -> LockedWheel:
        """The wheel whose best tag ranks first for this interpreter: a file of the lock, never another."""
        rank = {t: i for i, t in enumerate(self.tags)}
        best: tuple[int, LockedWheel, str] | None = None
        for f in files:
            assert f.filename is not None
            wheel_name, wheel_version = _parse_filename(f.filename, f.where)
            if wheel_name != name or (version is not None and Version(wheel_version) != Version(version)):
                raise BadInput(f"wheel {f.filename!r} is not a wheel of {name} {version or ''}".rstrip(),
                               where=f.where, hint="fix the package name/version or the wheel")
            r = _tag_rank(f.filename, rank)
            if r is not None and (best is None or r < best[0]):
                best = (r, f, wheel_version)
        if best is None:
            raise _no_wheel(name, [f.filename or "" for f in files], self.tags, self.doc.where(*kp, "wheels"))
        _, chosen, wheel_version = best
        # Only the chosen file is fetched, so only its hashes must be ones hermetic can check.
        if not chosen.hashes:
            raise BadInput(f"the hashes of {chosen.filename} have no sha256 entry", where=chosen.where,
                           hint='hermetic checks every file with sha256: add sha256 = "<64 hex digits>"')
        return replace(chosen, version=version or wheel_version, index=index)
