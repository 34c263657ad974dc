"""Every locked wheel as an *unpacked entry* of the store, fetched only when no entry and no blob has it.

A wheel is unpacked once, by the ``installer`` library (``wheels.unpack``), into blobs: its unpacked entry is
the list of (path, blob, executable) it holds, named by the wheel's sha256. Trees are laid out from these
lists (``store.trees``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hermetic import fs
from hermetic.errors import BadInput, HermeticError, PreconditionFailed
from hermetic.keys import unpacked_key
from hermetic.locks.types import Lock, LockedWheel
from hermetic.reporter import Reporter, plural
from hermetic.store import Staging, Store, entry_name
from hermetic.store.records import EntryPoint
from hermetic.store.substitute import Substituter
from hermetic.store.trees import FileMap

if TYPE_CHECKING:
    from packaging.tags import Tag

    from hermetic.fetch.download import Fetcher


@dataclass(frozen=True)
class Unpacked:
    entry: str
    wheel_sha256: str
    files: FileMap
    scripts: tuple[EntryPoint, ...] = ()
    filename: str = ""
    shebangs: tuple[str, ...] = ()   # its scripts whose first line is #!python (wheels.scripts.with_shebangs)


class WheelTally:
    """What became of a realize's locked wheels (realize turns it into its ``Counts``)."""
    __slots__ = ("wheels", "fetched", "fetched_bytes", "unpacked", "reused")

    def __init__(self) -> None:
        self.wheels = self.fetched = self.fetched_bytes = self.unpacked = self.reused = 0

    def __add__(self, other: WheelTally) -> WheelTally:
        out = WheelTally()
        for a in self.__slots__:
            setattr(out, a, getattr(self, a) + getattr(other, a))
        return out


def unpacked_entry_name(wheel_sha256: str, label: str) -> str:
    return entry_name(unpacked_key(wheel_sha256), label)


def load_unpacked(store: Store, name: str) -> Unpacked:
    rec = store.unpacked_record(name)
    return Unpacked(name, rec["wheel"], {p: (d, bool(x)) for p, (d, x) in rec["files"].items()},
                    tuple((n, m, a, s) for n, m, a, s in rec.get("scripts", [])), rec["filename"],
                    tuple(rec.get("shebangs", [])))


def wheel_label(w: LockedWheel) -> str:
    """How messages name a locked wheel: name==version, else its file name, else its name."""
    return f"{w.name}=={w.version}" if w.version else (w.filename or w.name)


OFFLINE_HINT = ("run without --offline (and HERMETIC_OFFLINE unset) where the index is reachable, or bring the "
                "files in with `hermetic import`; `hermetic realize --dry-run` lists what a realize would fetch")


def offline_error(missing: Sequence[tuple[str, str]]) -> PreconditionFailed:
    """``--offline``, and something must be fetched: exit 3 naming each (label, where: the lock file and line)."""
    listing = "; ".join(f"{label} ({where})" for label, where in missing)
    what = "1 file is" if len(missing) == 1 else f"{len(missing)} files are"
    return PreconditionFailed(f"offline: {what} not in the store and would have to be fetched: {listing}",
                              where=missing[0][1] if len(missing) == 1 else None, hint=OFFLINE_HINT)


class WheelStep(NamedTuple):
    """What a realize decides of one locked wheel (``plan_wheels``): ``reuse`` its unpacked entry (``found``),
    ``unpack`` its file, a blob of the store (``blob``), or ``fetch`` it; with what a plan says of it (its file's
    name and size, the URL it comes from, or the problem that would stop the fetch)."""
    part: str                           # "environment" or "toolchain"
    wheel: LockedWheel
    action: str
    found: Unpacked | None = None
    blob: Path | None = None
    filename: str | None = None
    bytes: int | None = None
    url: str | None = None
    problem: str | None = None

    @property
    def label(self) -> str:
        return wheel_label(self.wheel)

    def record(self) -> dict[str, object]:
        """The dry run's JSON line of it."""
        w = self.wheel
        out: dict[str, object] = {"part": self.part, "name": w.name, "version": w.version, "label": self.label,
                                  "where": w.where, "filename": self.filename, "bytes": self.bytes, "url": self.url,
                                  "entry": self.found.entry if self.found else None, "action": self.action}
        if self.problem is not None:
            out["problem"] = self.problem
        return out


def plan_wheels(store: Store, locks: list[Lock], accepts: Accepts, part: str) -> list[WheelStep]:
    """Each unique locked wheel: its unpacked entry this interpreter accepts (loaded once, for the execution
    too), else its file in the store, else a fetch. On a writable store what is found is pinned (a temp root),
    so nothing gc collects meanwhile is missing when the realize goes on; a read-only one only looks."""
    out = []
    for w in unique_wheels(locks):
        found = _existing_unpacked(store, w, accepts)
        if found is not None:
            out.append(WheelStep(part, w, "reuse", found, filename=found.filename, bytes=w.size))
            continue
        blob = _stored_blob(store, w, accepts)
        if blob is not None:
            out.append(WheelStep(part, w, "unpack", blob=blob, filename=w.filename or filename_from_wheel(w, blob),
                                 bytes=blob.stat().st_size))
        else:
            out.append(WheelStep(part, w, "fetch", filename=w.filename, bytes=w.size))
    return out


def missing(steps: Sequence[WheelStep]) -> list[tuple[str, str]]:
    """(label, where) of each wheel a plan must fetch: what an offline realize cannot get."""
    return [(s.label, s.wheel.where) for s in steps if s.action == "fetch"]


def locate(step: WheelStep, fetcher: Fetcher | None, reporter: Reporter) -> WheelStep:
    """Where a wheel to fetch comes from and its size: the lock's, else the index's (``fetcher``; None
    offline: the size of a local file the lock names, else unknown). A wheel that cannot be found keeps its
    problem, said as a warning: the realize would fail there."""
    w = step.wheel
    if fetcher is None:
        if step.bytes is None and w.path is not None and os.path.isfile(w.path):
            return step._replace(bytes=os.path.getsize(w.path))
        return step
    try:
        found = fetcher.locate(w)
    except HermeticError as e:
        reporter.warn(f"{step.label}: {e.what}", wheel=step.label)
        return step._replace(problem=e.render().removeprefix("error: "))
    return step._replace(filename=found.filename, bytes=found.size, url=found.url)


def plan_fetcher(tmp: Path, accepts: Accepts) -> Fetcher:
    """A fetcher that only locates (pip's configuration, this interpreter's tags), for a plan."""
    from hermetic.fetch.download import Fetcher
    from hermetic.fetch.pipconfig import load_pip_config
    return Fetcher(load_pip_config(), tmp, None, tags=accepts.tag_list())


def fetch_and_unpack(store: Store, steps: list[WheelStep], reporter: Reporter, share: Substituter | None,
                     accepts: Accepts, *, offline: bool = False) -> tuple[list[Unpacked], WheelTally]:
    """The plan's wheels (``plan_wheels``) unpacked in the store for the interpreter of ``accepts``, fetching
    only what is missing.

    A pin by name and version (a pip hash lock's ``name==version``, hashes of several files) is satisfied
    by a file whose tags the interpreter accepts: an entry unpacked for another interpreter is not reused.

    The unpacked entry's lock is held while its wheel is fetched, so concurrent realizes of one recipe
    download and unpack each wheel once; the others wait and reuse it (a plan is the decision as of then: its
    execution checks again). ``offline``: nothing is fetched; a wheel to fetch is a failed precondition naming
    every such wheel, before any work. Returns the unpacked entries and what it did.
    """
    counts = WheelTally()
    counts.wheels = len(steps)
    out: list[Unpacked] = []
    get = _Acquire(store, reporter, counts, None if offline else share, accepts, offline)
    if offline and (lacking := missing(steps)):
        raise offline_error(lacking)
    if lacking_steps := [s for s in steps if s.action == "fetch"]:  # said before the index is asked
        sizes = [s.wheel.size for s in lacking_steps]
        size = f", {sum(s for s in sizes if s) / 1e6:.1f} MB" if all(sizes) else ""
        reporter.event("fetch-start", f"fetching {plural(len(lacking_steps), 'wheels')} the store lacks{size}: "
                                      + ", ".join(s.label for s in lacking_steps),
                       wheels=[s.wheel.name for s in lacking_steps])
    for step in steps:
        w = step.wheel
        if step.found is not None:
            out.append(step.found)
            counts.reused += 1
            continue
        # A pin with the hashes of several files means the one this interpreter installs: which one is known
        # only once it is found, and the entry is named by that file (not by the lock's first hash).
        got = get(w) if w.filename is None and len(w.hashes) > 1 else None
        name = unpacked_entry_name(got[0].name if got else w.hashes[0], w.name)
        with store.build_entry(name) as staging:
            if staging is not None:
                blob, filename, fresh = got or get(w)
                store.pin_blob(blob.name)
                reporter.event("phase", phase="materializing")
                try:
                    _unpack_blob(staging, blob, blob.name, filename, w.where)
                except BadInput:
                    if blob == fresh:  # a hostile wheel fetched just now does not stay in the store
                        store.drop_blob(blob.name)
                    raise
                if fresh is not None and share is not None:
                    share.upload_blob(fresh.name)  # only once it unpacked whole: no hostile wheel for the team
                counts.unpacked += 1
                reporter.event("unpacked", f"unpacked {filename}", wheel=filename)
            else:
                counts.reused += 1
        out.append(load_unpacked(store, name))
    return sorted(out, key=lambda u: u.entry), counts


def _make_fetcher(store: Store, reporter: Reporter, accepts: Accepts) -> Fetcher:
    from hermetic.fetch.download import Fetcher
    from hermetic.fetch.pipconfig import load_pip_config
    return Fetcher(load_pip_config(), store.tmp, reporter, tags=accepts.tag_list())


class _Acquire:
    """A locked wheel's file as a blob of the store: one already there, else the remote cache's, else fetched
    (requests and pip's configuration are loaded only when a fetch is needed). Returns (blob, file name, the
    blob when fetched just now)."""

    def __init__(self, store: Store, reporter: Reporter, counts: WheelTally, share: Substituter | None,
                 accepts: Accepts, offline: bool = False) -> None:
        self.store, self.reporter, self.counts, self.share, self.accepts = store, reporter, counts, share, accepts
        self.offline = offline
        self.fetcher: Fetcher | None = None

    def usable(self, w: LockedWheel, blob: Path) -> bool:
        return bool(w.filename) or self.accepts(filename_from_wheel(w, blob))

    def stored(self, w: LockedWheel) -> Path | None:
        """A blob of the store that is this wheel's file (pinned), else None."""
        return _stored_blob(self.store, w, self.accepts)

    def __call__(self, w: LockedWheel) -> tuple[Path, str, Path | None]:
        store, share, counts = self.store, self.share, self.counts
        blob = self.stored(w)
        if blob is None and share is not None and (shared := share.fetch_blob(w.hashes, w.size, what="wheel")) \
                and self.usable(w, store.blob_path(shared)):
            blob = store.blob_path(shared)            # from the remote cache, verified
            size = blob.stat().st_size
            counts.fetched += 1
            counts.fetched_bytes += size
            self.reporter.event("fetched", f"fetched {w.filename or w.name} from the remote cache ({size} bytes)",
                                wheel=w.filename or w.name, sha256=shared, bytes=size, remote=True)
        if blob is not None:
            return blob, w.filename or filename_from_wheel(w, blob), None
        if self.offline:  # gone since the plan looked (gc): still nothing is fetched
            raise offline_error([(wheel_label(w), w.where)])
        if self.fetcher is None:
            self.fetcher = _make_fetcher(store, self.reporter, self.accepts)
        self.reporter.event("phase", phase="fetching")
        fetched, filename = _fetch(store, self.fetcher, w, self.reporter, counts)
        return fetched, filename, fetched


class Accepts:
    """Whether a wheel's file name is installable by the interpreter of ``tags`` (parsed when first asked)."""

    def __init__(self, tags: Sequence[str] | None) -> None:
        self.tags = tags
        self.rank: dict[Tag, int] | None = None

    def tag_list(self) -> list[Tag]:
        from packaging.tags import Tag, sys_tags
        return [Tag(*t.split("-", 2)) for t in self.tags] if self.tags is not None else list(sys_tags())

    def __call__(self, filename: str) -> bool:
        from hermetic.locks.validate import tag_rank
        if self.rank is None:
            self.rank = {t: i for i, t in enumerate(self.tag_list())}
        return tag_rank(filename, self.rank) is not None


def _fetch(store: Store, fetcher: Fetcher, w: LockedWheel, reporter: Reporter,
           counts: WheelTally) -> tuple[Path, str]:
    got = fetcher.fetch(w)
    store.pin_blob(got.sha256)
    blob = store.put_blob_file(got.path, got.sha256)
    counts.fetched += 1
    counts.fetched_bytes += got.size
    reporter.event("fetched", f"fetched {got.filename} ({got.size} bytes)", wheel=got.filename,
                   sha256=got.sha256, bytes=got.size)
    return blob, got.filename


def unique_wheels(locks: list[Lock]) -> list[LockedWheel]:
    """Each wheel of ``locks`` once, by name (one locked twice with different hashes is bad input)."""
    seen: dict[str, LockedWheel] = {}
    for lock in locks:
        for w in lock.wheels:
            if w.name in seen and set(seen[w.name].hashes) != set(w.hashes):
                raise BadInput(f"{w.name} is locked twice with different hashes",
                               where=w.where, hint=f"see also {seen[w.name].where}; keep one pin")
            seen[w.name] = w
    return [seen[k] for k in sorted(seen)]


def _existing_unpacked(store: Store, w: LockedWheel, accepts: Accepts) -> Unpacked | None:
    """A wheel already unpacked under any of its locked hashes needs no fetch, not even its file; for a pin
    without a file name, only one this interpreter can install."""
    for h in w.hashes:
        name = unpacked_entry_name(h, w.name)
        if store.use(name):
            found = load_unpacked(store, name)
            if w.filename or accepts(found.filename):
                return found
    return None


def _stored_blob(store: Store, w: LockedWheel, accepts: Accepts) -> Path | None:
    """A blob of the store that is this wheel's file and this interpreter installs (pinned), else None."""
    return next((store.blob_path(h) for h in w.hashes
                 if store.use_blob(h) and (w.filename or accepts(filename_from_wheel(w, store.blob_path(h))))), None)


def filename_from_wheel(w: LockedWheel, blob: Path) -> str:
    """Rebuild a stored wheel's file name from its own dist-info (the store names blobs by hash)."""
    import zipfile
    try:
        with zipfile.ZipFile(blob) as zf:
            wheel_meta = next(n for n in zf.namelist() if n.count("/") == 1
                              and n.endswith(".dist-info/WHEEL"))
            tag = next(line.split(":", 1)[1].strip() for line in zf.read(wheel_meta).decode().splitlines()
                       if line.startswith("Tag:"))
    except (zipfile.BadZipFile, StopIteration, OSError, UnicodeDecodeError):
        raise BadInput(f"the stored wheel for {w.name} has no readable WHEEL tag", where=w.where,
                       hint="run `hermetic verify --repair`") from None
    return f"{wheel_meta.split('/')[0][: -len('.dist-info')]}-{tag}.whl"


def _unpack_blob(staging: Staging, blob: Path, sha: str, filename: str, where: str) -> None:
    # installer reads the distribution's name from the file name, so give the blob its name via a link
    named = staging.path / "wheel" / filename
    named.parent.mkdir()
    os.symlink(blob, named)
    try:
        from hermetic.wheels.unpack import unpack_wheel  # installer is imported only when a wheel is unpacked
        unpack_wheel(staging, named, sha, where=where)
    finally:
        fs.remove_tree(named.parent)
