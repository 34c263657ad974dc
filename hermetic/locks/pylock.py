"""The PEP 751 lock, pylock.toml: checked strictly, then one wheel chosen per package for this interpreter.

Unknown keys are errors in a lock-version 1.0 file and warnings in a newer 1.x one, as the spec asks.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
    eval_marker,
    no_wheel,
    parse_filename,
    resolve_location,
    tag_rank,
)
from hermetic.tomlutil import KeyPath, TomlDoc, check_keys, expect_type, get_key, parse_toml


def read_pylock(path: Path, raw: bytes, env: dict[str, Any], tags: list[Tag]) -> tuple[list[LockedWheel], list[str]]:
    """The wheels chosen for ``env`` and ``tags`` from the lock ``raw`` (read from ``path``), and the warnings
    about keys tolerated in a lock of a newer 1.x minor version."""
    if not re.fullmatch(r"pylock\.([^.]+\.)?toml", path.name):
        raise BadInput(f"{path.name!r} is not a PEP 751 lock file name", where=str(path),
                       hint="name it pylock.toml or pylock.NAME.toml, with no dot in NAME")
    warnings: list[str] = []
    return _Pylock(parse_toml(path, raw), env, tags, warnings).read(), warnings


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
        if envs and not any(eval_marker(e, self.env, doc.where("environments", i), lock_file=True)
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
        if marker and not eval_marker(marker, self.env, doc.where(*kp, "marker"), lock_file=True):
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
                           where=doc.where(*kp, what), hint=WHEELS_ONLY)
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

    def choose(self, name: str, version: str | None, index: str | None, files: list[LockedWheel],
               kp: KeyPath) -> LockedWheel:
        """The wheel whose best tag ranks first for this interpreter: a file of the lock, never another."""
        rank = {t: i for i, t in enumerate(self.tags)}
        best: tuple[int, LockedWheel, str] | None = None
        for f in files:
            assert f.filename is not None
            wheel_name, wheel_version = parse_filename(f.filename, f.where)
            if wheel_name != name or (version is not None and Version(wheel_version) != Version(version)):
                raise BadInput(f"wheel {f.filename!r} is not a wheel of {name} {version or ''}".rstrip(),
                               where=f.where, hint="fix the package name/version or the wheel")
            r = tag_rank(f.filename, rank)
            if r is not None and (best is None or r < best[0]):
                best = (r, f, wheel_version)
        if best is None:
            raise no_wheel(name, [f.filename or "" for f in files], self.tags, self.doc.where(*kp, "wheels"),
                           self.env)
        _, chosen, wheel_version = best
        # Only the chosen file is fetched, so only its hashes must be ones hermetic can check.
        if not chosen.hashes:
            raise BadInput(f"the hashes of {chosen.filename} have no sha256 entry", where=chosen.where,
                           hint='hermetic checks every file with sha256: add sha256 = "<64 hex digits>"')
        return replace(chosen, version=version or wheel_version, index=index)
