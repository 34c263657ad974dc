"""The PEP 751 lock, pylock.toml, read with packaging's reader (``packaging.pylock``) and hermetic's checks.

Three steps. hermetic checks the file first, strictly and with the line of every mistake: unknown keys (errors
in a lock-version 1.0 file, warnings in a newer 1.x one, as the spec asks), types, locations, digests, wheel
file names. ``Pylock.from_dict`` then validates it as PEP 751 (anything it still finds is located by the key
it names), and ``Pylock.select`` decides for the interpreter's markers and tags: ``environments``,
``requires-python``, package markers, one entry per name, and the wheel whose best tag ranks first. Last,
hermetic refuses what it cannot install: a package selected as an sdist, VCS checkout, directory or archive,
and a chosen wheel without a sha256.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from packaging.markers import Environment, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.pylock import (
    Package,
    PackageSdist,
    PackageWheel,
    Pylock,
    PylockSelectError,
    PylockValidationError,
    is_valid_pylock_path,
)
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from hermetic.errors import BadInput
from hermetic.locks.types import LockedWheel
from hermetic.locks.validate import (
    SCHEME,
    WHEELS_ONLY,
    basename,
    no_wheel,
    parse_filename,
    parse_marker,
    resolve_location,
)
from hermetic.tomlutil import KeyPath, TomlDoc, check_keys, expect_type, get_key, parse_toml

PEP_751 = ("fix the key named (the format: https://packaging.python.org/en/latest/specifications/pylock-toml/), "
           "or lock again with a current `pip lock` or uv")


def read_pylock(path: Path, raw: bytes, env: dict[str, Any], tags: list[Tag]) -> tuple[list[LockedWheel], list[str]]:
    """The wheels chosen for ``env`` and ``tags`` from the lock ``raw`` (read from ``path``), and the warnings
    about keys tolerated in a lock of a newer 1.x minor version."""
    if not is_valid_pylock_path(path):
        raise BadInput(f"{path.name!r} is not a PEP 751 lock file name", where=str(path),
                       hint="name it pylock.toml or pylock.NAME.toml, with no dot in NAME")
    doc = parse_toml(path, raw)
    checks = _Checks(doc, [])
    files = checks.lock()
    pylock = _validated(doc)
    return _Selection(doc, pylock, files, env).wheels(tags), checks.warnings


_TOP_KEYS = {"lock-version", "environments", "requires-python", "extras", "dependency-groups",
             "default-groups", "created-by", "packages", "tool"}
_PACKAGE_KEYS = {"name", "version", "marker", "requires-python", "dependencies", "index", "vcs", "directory",
                 "archive", "sdist", "wheels", "attestation-identities", "tool"}
_FILE_KEYS = {"name", "upload-time", "url", "path", "size", "hashes", "tool"}
_SOURCES = {"vcs": "a VCS checkout", "directory": "a source directory", "archive": "an archive",
            "sdist": "an sdist"}


# --- 1. hermetic's checks: the whole file, every mistake at its line ------------------------------------

@dataclass
class _Checks:
    doc: TomlDoc
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

    def specifier(self, table: dict[str, Any], kp: KeyPath) -> None:
        spec = get_key(self.doc, table, "requires-python", str, kp)
        try:
            SpecifierSet(spec or "")
        except InvalidSpecifier as e:
            raise BadInput(f"invalid requires-python {spec!r}: {e}", where=self.doc.where(*kp, "requires-python"),
                           hint="write a version specifier such as >=3.11") from None

    def lock(self) -> dict[tuple[int, int], LockedWheel]:
        """Every wheel entry of every package, checked, by (package index, wheel index)."""
        doc, data = self.doc, self.doc.data
        lock_version = get_key(doc, data, "lock-version", str, (), required=True) or ""
        m = re.fullmatch(r"(\d+)\.(\d+)", lock_version)
        if m is None or m.group(1) != "1":
            raise BadInput(f"unsupported lock-version {lock_version!r}", where=doc.where("lock-version"),
                           hint="hermetic reads PEP 751 lock-version 1.x; re-lock with a current pip or uv")
        self.strict = m.group(2) == "0"
        self.keys(data, _TOP_KEYS, ())
        get_key(doc, data, "created-by", str, (), required=True)
        for key in ("extras", "dependency-groups", "default-groups"):
            self.strings(data, key, ())
        for i, text in enumerate(self.strings(data, "environments", ())):
            parse_marker(text, doc.where("environments", i))
        self.specifier(data, ())
        files: dict[tuple[int, int], LockedWheel] = {}
        for i, entry in enumerate(get_key(doc, data, "packages", list, (), required=True) or []):
            pkg = expect_type(doc, entry, dict, ("packages", i))
            for j, wheel in enumerate(self.package(pkg, ("packages", i))):
                files[i, j] = wheel
        return files

    def package(self, pkg: dict[str, Any], kp: KeyPath) -> list[LockedWheel]:
        doc = self.doc
        self.keys(pkg, _PACKAGE_KEYS, kp)
        name = canonicalize_name(get_key(doc, pkg, "name", str, kp, required=True) or "")
        version = get_key(doc, pkg, "version", str, kp)
        try:
            Version(version or "0")
        except InvalidVersion:
            raise BadInput(f"invalid version {version!r} for {name!r}", where=doc.where(*kp, "version"),
                           hint="write a PEP 440 version") from None
        get_key(doc, pkg, "index", str, kp)
        get_key(doc, pkg, "dependencies", list, kp)  # informational only: installers must not use it
        for j, ident in enumerate(get_key(doc, pkg, "attestation-identities", list, kp) or []):
            ikp = (*kp, "attestation-identities", j)
            get_key(doc, expect_type(doc, ident, dict, ikp), "kind", str, ikp, required=True)
        marker = get_key(doc, pkg, "marker", str, kp)
        if marker is not None:
            parse_marker(marker, doc.where(*kp, "marker"))
        self.specifier(pkg, kp)
        sources = [k for k in ("vcs", "directory", "archive") if k in pkg]
        if len(sources) + ("sdist" in pkg or "wheels" in pkg) != 1:
            given = sources + [k for k in ("sdist", "wheels") if k in pkg]
            raise BadInput(f"package {name!r} needs exactly one source, found {', '.join(given) or 'none'}",
                           where=doc.where(*kp), hint="give wheels (hermetic installs wheels only)")
        if "sdist" in pkg:
            self.file(expect_type(doc, pkg["sdist"], dict, (*kp, "sdist")), (*kp, "sdist"), name)
        wheels = get_key(doc, pkg, "wheels", list, kp)
        if wheels == [] and "sdist" not in pkg:
            raise BadInput(f"package {name!r} has an empty wheels list", where=doc.where(*kp, "wheels"),
                           hint="list at least one wheel, with its url or path and its hashes")
        files = []
        for j, entry in enumerate(wheels or []):
            wkp = (*kp, "wheels", j)
            wheel = self.file(expect_type(doc, entry, dict, wkp), wkp, name)
            assert wheel.filename is not None
            wheel_name, wheel_version = parse_filename(wheel.filename, wheel.where)
            if wheel_name != name or (version is not None and Version(wheel_version) != Version(version)):
                raise BadInput(f"wheel {wheel.filename!r} is not a wheel of {name} {version or ''}".rstrip(),
                               where=wheel.where, hint="fix the package name/version or the wheel")
            files.append(replace(wheel, version=version or wheel_version))
        return files

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
            if text is not None and bool(SCHEME.match(text)) != (key == "url"):
                raise BadInput(f"{key} {text!r} is {'not an absolute URL' if key == 'url' else 'a URL'}",
                               where=doc.where(*kp, key), hint="put URLs in `url`, local paths in `path`")
        url, path = resolve_location(url_text, base, doc.where(*kp, "url")) if url_text else (None, None)
        if path_text is not None:
            path = resolve_location(path_text, base, doc.where(*kp, "path"))[1]
        filename = get_key(doc, entry, "name", str, kp) or basename(url_text or path_text or "")
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


# --- 2. packaging's validation ---------------------------------------------------------------------------

def _validated(doc: TomlDoc) -> Pylock:
    """packaging's model of the lock. Names are normalized first: PEP 751 asks lockers to write them so,
    and hermetic has always read ``Foo_Bar`` as ``foo-bar``, as installers do."""
    data = dict(doc.data)
    data["packages"] = [{**p, "name": canonicalize_name(p["name"])} for p in data["packages"]]
    try:
        with _without_packaging_warnings():
            return Pylock.from_dict(data)
    except PylockValidationError as e:
        raise BadInput(f"not a valid PEP 751 lock: {e.message}", where=doc.where(*_key_path(e.context)),
                       hint=PEP_751) from None


@contextmanager
def _without_packaging_warnings() -> Iterator[None]:
    # packaging logs "pylock minor version 1.x is not supported" for a newer minor version; hermetic says
    # instead which keys it ignored, and where (the warnings read_pylock returns).
    log = logging.getLogger("packaging.pylock")
    log.addFilter(_drop)
    try:
        yield
    finally:
        log.removeFilter(_drop)


def _drop(record: logging.LogRecord) -> bool:
    return False


def _key_path(context: str | None) -> KeyPath:
    """``packages[2].wheels[0].hashes`` (packaging's context) as a key path."""
    kp: list[str | int] = []
    for part in (context or "").split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[\d+\])*)", part)
        if m is None:
            break
        kp += [m.group(1), *map(int, re.findall(r"\d+", m.group(2)))]
    return tuple(kp)


# --- 3. packaging's selection, and what hermetic installs ------------------------------------------------

@dataclass
class _Selection:
    doc: TomlDoc
    pylock: Pylock
    files: dict[tuple[int, int], LockedWheel]
    env: dict[str, Any]

    def wheels(self, tags: list[Tag]) -> list[LockedWheel]:
        try:
            selected = list(self.pylock.select(environment=cast(Environment, self.env), tags=tags))
        except PylockSelectError as e:
            raise self.select_error(str(e), tags) from None
        except (UndefinedComparison, UndefinedEnvironmentName) as e:  # parsed, but cannot be evaluated here
            raise self.marker_error(e) from None
        position = {id(p): i for i, p in enumerate(self.pylock.packages)}
        return [self.installable(position[id(package)], package, dist, tags) for package, dist in selected]

    def installable(self, i: int, package: Package, dist: object, tags: list[Tag]) -> LockedWheel:
        kp: KeyPath = ("packages", i)
        if isinstance(dist, PackageWheel):
            wheel = self.files[i, next(j for j, w in enumerate(package.wheels or ()) if w is dist)]
            # Only the chosen file is fetched, so only its hashes must be ones hermetic can check.
            if not wheel.hashes:
                raise BadInput(f"the hashes of {wheel.filename} have no sha256 entry", where=wheel.where,
                               hint='hermetic checks every file with sha256: add sha256 = "<64 hex digits>"')
            return replace(wheel, index=package.index)
        if isinstance(dist, PackageSdist) and package.wheels:
            raise self.no_wheel(i, package, tags)
        what = next(k for k in ("vcs", "directory", "archive", "sdist") if getattr(package, k) is dist)
        raise BadInput(f"package {package.name!r} is locked as {_SOURCES[what]}: hermetic installs wheels only",
                       where=self.doc.where(*kp, what), hint=WHEELS_ONLY)

    def no_wheel(self, i: int, package: Package, tags: list[Tag]) -> BadInput:
        return no_wheel(package.name, [w.filename for w in package.wheels or ()], tags,
                        self.doc.where("packages", i, "wheels"), self.env)

    def select_error(self, message: str, tags: list[Tag]) -> BadInput:
        """packaging's selection error in hermetic's words, at the line of the key it concerns."""
        doc, pylock = self.doc, self.pylock
        at = [int(n) for n in re.findall(r"packages\[(\d+)\]", message)]
        python = str(self.env["python_full_version"]).rstrip("+")
        if "Python version requirement" in message:
            kp: KeyPath = ("packages", at[0]) if at else ()
            spec = pylock.packages[at[0]].requires_python if at else pylock.requires_python
            return BadInput(f"requires Python {spec}, but the interpreter is Python {python}",
                            where=doc.where(*kp, "requires-python"),
                            hint="use an interpreter that matches, or re-lock for this one")
        if "environments" in message and not at:
            envs = "; ".join(str(m) for m in pylock.environments or ())
            return BadInput("the lock supports none of this interpreter's environments",
                            where=doc.where("environments"),
                            hint=f"it was locked for: {envs}; re-lock for this interpreter")
        if message.startswith("Multiple packages") and len(at) == 2:
            first = pylock.packages[at[1]]
            also = doc.where("packages", at[1], "wheels") if first.wheels else doc.where("packages", at[1])
            return BadInput(f"{first.name!r} is locked twice for this environment (also at {also})",
                            where=doc.where("packages", at[0]),
                            hint="give the entries markers that exclude each other")
        if message.startswith("No wheel") and at:
            return self.no_wheel(at[0], pylock.packages[at[0]], tags)
        where = doc.where("packages", at[0]) if at else str(doc.path)  # a message of a later packaging
        return BadInput(f"cannot install from this lock: {message}", where=where, hint=PEP_751)

    def marker_error(self, e: Exception) -> BadInput:
        """The marker that raised ``e`` in select: evaluated again one by one, on this error path only."""
        env = {**self.env, "extras": frozenset(), "dependency_groups": frozenset(self.pylock.default_groups or ())}
        markers: list[tuple[KeyPath, Marker, str]] = [
            (("environments", i), m, "requirement") for i, m in enumerate(self.pylock.environments or ())]
        markers += [(("packages", i, "marker"), p.marker, "lock_file")
                    for i, p in enumerate(self.pylock.packages) if p.marker is not None]
        for kp, marker, context in markers:
            try:
                marker.evaluate(env, context)  # type: ignore[arg-type]
            except (UndefinedComparison, UndefinedEnvironmentName) as found:
                return BadInput(f"cannot evaluate marker {str(marker)!r}: {found}", where=self.doc.where(*kp),
                                hint="use PEP 508 marker variables; compare versions only with versions")
        return BadInput(f"cannot select from this lock: {e}", where=str(self.doc.path), hint=PEP_751)
