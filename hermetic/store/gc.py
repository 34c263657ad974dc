"""gc: delete what no root reaches. Roots are roots/*.json, receipts/*.json, profiles and the temp roots of
running hermetic processes. An entry is invalidated (renamed into trash/) before it is deleted, so a crash
mid-gc leaves garbage, never a half-deleted valid entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hermetic import fs
from hermetic.errors import BadRecord, PreconditionFailed
from hermetic.root import CACHES, Root, refuse_folders
from hermetic.store import Store, blob_name, layout_problems, list_names, live_temproots, split_refs
from hermetic.store.records import files_of
from hermetic.store.roots import drop_root, recipe_names, root_refs


@dataclass
class GcPlan:
    live_entries: set[str] = field(default_factory=set)
    live_blobs: set[str] = field(default_factory=set)
    dead_entries: list[str] = field(default_factory=list)
    dead_blobs: list[Path] = field(default_factory=list)
    garbage: list[Path] = field(default_factory=list)  # tmp/ and trash/ leftovers of dead processes
    damaged: dict[str, str] = field(default_factory=dict)  # reachable entries whose record cannot be read
    kept_unprovable: list[str] = field(default_factory=list)  # unreached entries a damaged record may name
    dropped: list[str] = field(default_factory=list)   # the roots and profiles --drop-root forgot (or would)

    @property
    def blobs_unprovable(self) -> bool:
        """A damaged reachable record may name any blob: none is proven dead, none is deleted."""
        return bool(self.damaged)


# What a record of each kind may reference among entries (docs/layout.md): an object only blobs, a module its
# objects, an unpacked wheel only its wheel's blob, a source tree only its archive's blob, any other tree
# anything (unpacked wheels, modules, objects, the toolchain's and the sources' trees).
def _may_reference(store: Store, name: str, candidate: str) -> bool:
    label = name[33:]
    if label.startswith(("obj-", "src-")):
        return False
    if label.startswith("mod-"):
        return candidate[33:].startswith("obj-")
    # the folder tells a tree (its out/) from an unpacked wheel's record, which references no entry
    return (store.entry_path(name) / "out").is_dir()


def plan(root: Root, store: Store, dropped: set[str]) -> GcPlan:
    refs = root_refs(root, dropped)
    temp_refs, oldest_live = live_temproots(store)
    refs |= temp_refs
    result = GcPlan()
    pending, blobs = split_refs(refs)
    result.live_blobs = set(blobs)
    while pending:
        name = pending.pop()
        if name in result.live_entries or not store.has_entry(name):
            continue
        result.live_entries.add(name)
        try:
            rec = store.record(name)
        except BadRecord as damage:  # what it references is unknown: gc goes on, and proves less
            result.damaged[name] = damage.what
            continue
        result.live_blobs.update(blob_name(digest, executable) for digest, executable in files_of(rec).values())
        entries, blobs = split_refs(rec["refs"])
        pending += entries
        result.live_blobs.update(blobs)
    unreached = [e for e in store.iter_entries() if e not in result.live_entries]
    # an entry a damaged reachable record may name is not proven dead, nor is what that entry names
    kept = {e for e in unreached if any(_may_reference(store, d, e) for d in result.damaged)}
    frontier = list(kept)
    while frontier:
        name = frontier.pop()
        try:
            named, _ = split_refs(store.record(name)["refs"])
        except (BadRecord, OSError):
            named = [e for e in unreached if _may_reference(store, name, e)]
        for e in named:
            if e not in kept and e in unreached:
                kept.add(e)
                frontier.append(e)
    result.kept_unprovable = sorted(kept)
    result.dead_entries = [e for e in unreached if e not in kept]
    if result.blobs_unprovable:
        return _without_blobs(root, store, result, oldest_live)
    for digest, executable, path in store.iter_blobs():
        name = blob_name(digest, executable)
        if name in result.live_blobs:
            continue
        # a blob newer than a running process may be one it is about to reference: leave it
        if oldest_live is not None and os.lstat(path).st_ctime_ns >= oldest_live:
            continue
        result.dead_blobs.append(path)
    return _without_blobs(root, store, result, oldest_live)


def _without_blobs(root: Root, store: Store, result: GcPlan, oldest_live: int | None) -> GcPlan:
    """The rest of the plan: leftovers in tmp/ and trash/, old cache folders. A folder a live process holds
    locked (an import's staging: ``Store.work_dir``; an entry's staging) is never garbage, nor anything newer
    than the oldest live process (one about to lock it)."""
    for folder in (store.tmp, store.trash):
        for name, st, held in _leftovers(folder):
            if not held and (oldest_live is None or st.st_ctime_ns < oldest_live):
                result.garbage.append(folder / name)
    result.garbage += stale_caches(root)
    return result


def _leftovers(folder: Path) -> list[tuple[str, os.stat_result, bool]]:
    """What ``folder`` holds, read through its own descriptor (``O_NOFOLLOW``: a link at its name lists
    nothing), each with its lstat and whether a live process holds it locked."""
    try:
        fd = fs.open_dir(folder)
    except (FileNotFoundError, NotADirectoryError, OSError):
        return []
    found = []
    try:
        for name in sorted(os.listdir(fd)):
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            found.append((name, st, stat.S_ISDIR(st.st_mode) and _held(name, fd)))
    finally:
        os.close(fd)
    return found


def _held(name: str, parent: int) -> bool:
    """Whether a live process holds the folder ``name`` locked (flock)."""
    try:
        fd = fs.open_dir(name, dir_fd=parent)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)   # closing drops the probe's lock


def stale_caches(root: Root) -> list[Path]:
    """Folders under state/ of an earlier format of one of hermetic's buckets (root.CACHES): ``<name>-v<N>`` for
    a bucket's name and another version. Nothing else there is hermetic's: a user's README, notes/ or
    mydata-v1/ is never opened, never deleted (outside attack r1, finding 8)."""
    current = {c.folder for c in CACHES.values()}
    return [root.state / name for name, _st, _held in _leftovers(root.state)
            if name not in current and _bucket_folder(name)]


def _bucket_folder(name: str) -> bool:
    """Whether ``name`` is ``<bucket>-v<N>`` for one of hermetic's bucket names (root.CACHES)."""
    bucket, sep, version = name.rpartition("-v")
    return bool(sep) and bucket in CACHES and version.isascii() and version.isdigit()


def collect(root: Root, *, dry_run: bool, dropped: set[str], timeout: float = 600,
            on_wait: Callable[[str], None] | None = None) -> tuple[GcPlan, int]:
    """gc: what no root, profile or live process holds, deleted (``dry_run``: only listed); with ``dropped``, those
    roots forgotten first (``gc --drop-root``). ``on_wait(what)`` is said once when it waits for a build."""
    store = Store(root.store)
    if not store.exists():
        return GcPlan(), 0
    # a folder of someone's files (a mistyped --root, a planted store/FORMAT) is never collected in
    root.refuse_unmarked("gc --drop-root" if dropped else "gc")
    # nothing is deleted through a link where the root's or the store's own folder belongs (store/trash linked
    # to a folder of the user's would have it emptied): refused, exit 2, as for a root that cannot be read
    refuse_folders(layout_problems(root, store, readable=True))
    store.open()
    with contextlib.ExitStack() as builds:
        if dropped and not dry_run:
            for lock in _running_builds(root, dropped, timeout):
                builds.enter_context(_waited(lock, on_wait))
        return _collect_locked(root, store, dry_run, dropped, timeout)


def _running_builds(root: Root, names: set[str], timeout: float) -> list[fs.FileLock]:
    """The build locks (``build/<name>/.lock``, the one a realize of that recipe holds while it compiles and
    links) of the recipes ``gc --drop-root`` forgets, in one order: the build names CUDA through the toolchain's
    profile, which the drop removes, so the drop waits for a running build, taking these before the gc lock as
    the realize does. Only a lock file that is there, a plain file in plain folders, is taken: none is made."""
    locks = []
    for name in sorted(names):
        lock = root.build_lock(name)
        try:
            plain = all(stat.S_ISDIR(os.lstat(f).st_mode) for f in (lock.parent.parent, lock.parent)) and \
                stat.S_ISREG(os.lstat(lock).st_mode)
        except OSError:
            plain = False
        if plain:
            locks.append(fs.FileLock(lock, timeout=timeout, what=f"the build of {name}"))
    return locks


@contextlib.contextmanager
def _waited(lock: fs.FileLock, on_wait: Callable[[str], None] | None) -> Iterator[None]:
    told: list[bool] = []

    def waiting(_seconds: float) -> None:
        if on_wait is not None and not told:
            told.append(True)
            on_wait(lock.what)

    lock.acquire(on_wait=waiting)
    try:
        yield
    finally:
        lock.release()


def _collect_locked(root: Root, store: Store, dry_run: bool, dropped: set[str],
                    timeout: float) -> tuple[GcPlan, int]:
    with store.gc_lock(exclusive=True, timeout=timeout):
        dropped = recipe_names(root, dropped) if dropped else dropped   # its toolchain and variants too
        p = plan(root, store, dropped)
        p.dropped = sorted(dropped)
        if dry_run:
            return p, sum(_size(store.entry_path(e)) for e in p.dead_entries) + \
                sum(os.lstat(b).st_size for b in p.dead_blobs)
        freed = 0
        for name in dropped:
            drop_root(root, name)
        for name in p.dead_entries:
            trash = store.invalidate(name)
            if trash is not None:
                freed += fs.remove_tree(trash)
        for blob in p.dead_blobs:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(blob)
                blob.unlink()
                freed += st.st_size if st.st_nlink == 1 else 0
        for g in p.garbage:
            freed += fs.remove_tree(g)
        _prune_index(store)
        return p, freed


def _prune_index(store: Store) -> None:
    """Drop object-index links whose entry is gone (a stale link is only a miss, but it costs a lookup). Its
    folders are listed with lstat (``list_names``): a link where one belongs is never followed."""
    index = store.path / "index"
    for shard in list_names(index):
        for key in list_names(index / shard):
            folder = index / shard / key
            for name in list_names(folder):
                link = folder / name
                if link.is_symlink() and not link.exists():
                    link.unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()  # only empty ones go
        with contextlib.suppress(OSError):
            (index / shard).rmdir()


def check_remove_all(root: Root) -> bool:
    """Whether ``gc --all`` has anything to remove (False: no folder, or an empty one, which is no root);
    raises when the folder is one it must never remove (``Root.refuse_removal``)."""
    if not os.path.lexists(root.path):
        return False
    if os.path.isdir(root.path) and not os.path.islink(root.path) and not os.listdir(root.path):
        return False
    root.refuse_removal()
    return True


def remove_all(root: Root) -> int:
    """gc --all: the whole scratch root, once no other hermetic process is using it; only a folder that is a
    marked scratch root, never /, the home folder, the current folder or a checkout (``Root.refuse_removal``).
    An empty folder without a marker is no root and is left as it is."""
    if not check_remove_all(root):
        return 0
    store = Store(root.store)
    if store.exists():
        with store.gc_lock(exclusive=True, timeout=0.5):
            refs, _ = live_temproots(store)
            if refs:
                raise PreconditionFailed("another hermetic process is using this scratch root",
                                         where=str(root.path), hint="wait for it to finish, then retry")
    return fs.remove_tree(root.path)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _d, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            if st.st_nlink == 1:
                total += st.st_size
    return total
