"""verify: re-hash every blob, check every entry and tree against its record; --repair mends.

Tree files are hard links to blobs, so a tree file that shares its blob's inode is checked by the blob's
hash; a copied file (another file system) is hashed itself.

Beside other commands (docs/layout.md, "Who holds what"): the pass holds the gc lock shared, so nothing is
deleted from the store while it runs, and it judges a snapshot, the entries listed first and the blobs after
(every entry's blobs were published before the entry, so a listed entry's blobs are listed too). What is
published later is not its business. A problem is reported only once it is found again on a second look:
the entry still the same folder with the same record, the blob still the same file; a realize that heals a
blob or drops a corrupt entry meanwhile is not reported against. ``repair`` removes under the gc lock held
exclusive, each item looked at once more there: one another process pins, or one that is no longer the item
the snapshot saw, is left and said.

Nothing but the regular files and folders expected is ever opened: lstat first, then opened without
following a link or waiting on a FIFO (``store.hash_regular``). Strays (a ``.DS_Store``, a FIFO, a folder or
a link where a blob or an entry belongs) are reported, never followed; only one at a blob's or an entry's
name is a problem (repair removes it, and the blob or entry is fetched or built again).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hermetic import fs
from hermetic.errors import BadRecord
from hermetic.root import CACHES, Root
from hermetic.store import (
    ENTRY_META,
    NotRegular,
    Store,
    Stray,
    blob_name,
    blob_ref,
    describe,
    entry_ref,
    hash_regular,
    is_blob_name,
    layout_problems,
    list_names,
    live_temproots,
    lstat_or_none,
    split_blob_name,
)
from hermetic.store.records import RECORD_LIMIT, entry_problem, read_checked
from hermetic.store.roots import read_receipt, read_root, root_files
from hermetic.store.trees import profile_entry, tree_problem

Identity = tuple[int, int]   # (st_dev, st_ino): the same file, whatever happened to its links and mode



@dataclass(frozen=True)
class Problem:
    kind: str       # blob, entry, tree, stray, root, receipt, profile, cache, bytecode, folder, lock, index
    name: str       # blob name, entry name, or the path of the file (a stray, a root, a cache record...)
    what: str


@dataclass
class VerifyReport:
    blobs: int = 0
    entries: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)  # strays hermetic owns nothing of: reported, left
    # what the pass judged, for repair: the entries' folders and the blobs (and strays at their names) as seen
    seen_entries: dict[str, Identity] = field(default_factory=dict)
    seen_blobs: dict[str, Identity] = field(default_factory=dict)
    seen_strays: dict[str, Identity] = field(default_factory=dict)


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


def verify(store: Store, root: Root) -> VerifyReport:
    report = VerifyReport()
    folders = layout_problems(root, store, readable=True)
    report.problems += [Problem("folder", str(p), f"is {what} where hermetic's own folder belongs (never followed)")
                        for p, what in folders]
    bad = {p for p, _w in folders}
    if store.path not in bad and store.exists():
        _check_store(store, report)
        report.problems += _check_locks_and_index(store, bad)
    report.problems += _check_roots(root)
    report.problems += _check_profiles(store, root)
    report.problems += _check_caches(root)
    if root.home not in bad:
        report.problems += _check_bytecode(root)
    return report


def _check_store(store: Store, report: VerifyReport) -> None:
    with store.gc_lock():   # shared: no deletion while the pass runs; realizes publish on beside it
        entries, entry_strays = store.scan_entries()   # entries first: their blobs were published before them
        blobs, blob_strays = store.scan_blobs()
        report.seen_entries = {name: _identity(st) for name, st in entries}
        report.seen_blobs = {blob_name(d, x): _identity(st) for d, x, _p, st in blobs}
        blob_problems = _check_blobs(report, blobs)
        inodes = {split_blob_name(name): ino for name, (_dev, ino) in report.seen_blobs.items()}
        bad_blobs = {p.name for p in blob_problems}
        entry_problems: dict[str, list[Problem]] = {}
        for name, _st in entries:
            report.entries += 1
            found = _check_entry(store, name, inodes, bad_blobs)
            if found:
                entry_problems[name] = found
        # the second look: only what is still wrong, on the same files, is reported
        blob_problems = [p for p in blob_problems if _blob_still_bad(store, p, report.seen_blobs)]
        bad_blobs = {p.name for p in blob_problems}
        report.problems += blob_problems
        for name, found in entry_problems.items():
            report.problems += _entry_still_bad(store, name, report.seen_entries[name], bad_blobs, found)
        for stray in [*blob_strays, *entry_strays]:
            _stray(report, store, stray)


# blobs ------------------------------------------------------------------------------------------------
def _check_blobs(report: VerifyReport, blobs: list[tuple[str, bool, Path, os.stat_result]]) -> list[Problem]:
    problems = []
    for digest, executable, path, st in blobs:
        report.blobs += 1
        name = blob_name(digest, executable)
        what = _blob_problem(path, digest, st, report)
        if what is not None:
            problems.append(Problem("blob", name, what))
    return problems


def _blob_problem(path: Path, digest: str, st: os.stat_result, report: VerifyReport | None = None) -> str | None:
    try:
        actual, size = hash_regular(path)
    except NotRegular as e:
        return f"is {describe(e.mode)}, not a file"
    except FileNotFoundError:
        return "is missing"
    except PermissionError:
        return "cannot be read by this user (its mode)"
    if report is not None:
        report.bytes += size
    if actual != digest:
        return f"content hashes to {actual[:16]}…"
    if st.st_mode & 0o222:
        return "is writable (store files must be read-only)"
    return None


def _blob_still_bad(store: Store, p: Problem, seen: dict[str, Identity]) -> bool:
    """A blob problem, looked at again: reported only while the blob is the same file and still wrong (a
    realize may have healed it in place, or dropped it, meanwhile)."""
    path = store.blob_file(p.name)
    st = lstat_or_none(path)
    if st is None or _identity(st) != seen.get(p.name):
        return False
    return _blob_problem(path, split_blob_name(p.name)[0], st) is not None


# entries ----------------------------------------------------------------------------------------------
def _check_entry(store: Store, name: str, inodes: dict[tuple[str, bool], int] | None,
                 bad_blobs: set[str]) -> list[Problem]:
    """An entry against its record and its blobs. ``inodes``: the blobs' inodes as the snapshot saw them;
    None to look each blob up now (the second look)."""
    problems: list[Problem] = []
    path = store.entry_path(name)
    try:
        meta = read_checked(path / ENTRY_META, lambda m: entry_problem(m, name), "record (meta.json)")
    except FileNotFoundError:
        return [Problem("entry", name, "meta.json is missing")]
    except BadRecord as e:
        return [Problem("entry", name, e.what)]

    def blob_inode(digest: str, executable: bool) -> int | None:
        if inodes is not None:
            return inodes.get((digest, executable))
        try:
            st = lstat_or_none(store.blob_text(digest, executable))
        except PermissionError:   # a blob folder this user cannot search: a 'folder' problem of its own
            return None
        return st.st_ino if st is not None and stat.S_ISREG(st.st_mode) else None

    files = {p: (d, bool(x)) for p, (d, x) in meta.get("files", {}).items()}
    for rel, (digest, executable) in files.items():
        bname = blob_name(digest, executable)
        if bname in bad_blobs:
            problems.append(Problem("entry", name, f"{rel} uses corrupt blob {digest[:16]}…"))
        elif meta.get("kind") != "tree" and blob_inode(digest, executable) is None:
            problems.append(Problem("entry", name, f"{rel}: blob {digest[:16]}… is missing"))
    if meta.get("kind") == "tree":
        why = tree_problem(files, meta.get("links", {}))   # a file laid out through a link, a link leaving the tree
        if why is not None:
            return [Problem("entry", name, f"a bad record: {why}")]
        out = path / "out"
        st = lstat_or_none(out)
        if st is not None and not stat.S_ISDIR(st.st_mode):   # never walked through: a link there leads outside
            what = f"a symbolic link to {os.readlink(out)}" if stat.S_ISLNK(st.st_mode) else describe(st.st_mode)
            return [*problems, Problem("tree", name, f"out is {what} where the tree's folder belongs (never "
                                                     "followed)")]
        problems += _check_tree(out, name, files, meta.get("links", {}), blob_inode)
    packed = meta.get("packed")
    for key in ("object", "so"):  # objects and modules: their one blob must be there and sound
        digest = packed.get("blob") if key == "object" and isinstance(packed, dict) else meta.get(key)
        if isinstance(digest, str):
            if digest in bad_blobs:
                problems.append(Problem("entry", name, f"its {key} blob {digest[:16]}… is corrupt"))
            elif blob_inode(digest, False) is None:
                problems.append(Problem("entry", name, f"its {key} blob {digest[:16]}… is missing"))
    return problems


def _entry_still_bad(store: Store, name: str, seen: Identity, bad_blobs: set[str],
                     found: list[Problem]) -> list[Problem]:
    """An entry's problems, looked at again: none once the entry is gone or is another folder (dropped, or
    built again), else what a check against the blobs as they are now still finds."""
    st = lstat_or_none(store.entry_path(name))
    if st is None or _identity(st) != seen:
        return []
    return _check_entry(store, name, None, bad_blobs)


def _check_tree(out: Path, name: str, files: dict[str, tuple[str, bool]], links: dict[str, str],
                blob_inode: Callable[[str, bool], int | None]) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[str] = set()
    for dirpath, dirs, names in os.walk(out):
        for fname in [*names, *(d for d in dirs if os.path.islink(os.path.join(dirpath, d)))]:
            full = os.path.join(dirpath, fname)
            rel = os.path.relpath(full, out)
            seen.add(rel)
            st = lstat_or_none(full)
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                if links.get(rel) != os.readlink(full):
                    problems.append(Problem("tree", name, f"{rel}: unexpected symlink"))
                continue
            spec = files.get(rel)
            if spec is None:
                problems.append(Problem("tree", name, f"{rel}: {describe(st.st_mode)} not in the record"))
            elif not stat.S_ISREG(st.st_mode):
                problems.append(Problem("tree", name, f"{rel}: {describe(st.st_mode)} where a file belongs"))
            elif blob_inode(*spec) != st.st_ino:
                try:
                    same = hash_regular(full)[0] == spec[0]
                except (NotRegular, FileNotFoundError):
                    same = False
                if not same:
                    problems.append(Problem("tree", name, f"{rel}: content differs from the record"))
    for rel in sorted(set(files) - seen):
        problems.append(Problem("tree", name, f"{rel}: missing"))
    for rel in sorted(set(links) - seen):
        if not os.path.islink(out / rel):
            problems.append(Problem("tree", name, f"{rel}: symlink missing"))
    return problems


# the entry locks and the object index ----------------------------------------------------------------
def _check_locks_and_index(store: Store, bad: set[Path]) -> list[Problem]:
    """Each name under ``store/locks`` a regular file (an entry's lock: a FIFO, a link or a folder there makes
    every build of that entry exit 2), each ``store/index/XY`` and ``store/index/XY/<lookup>`` a real folder
    (a link there makes every publish under that key exit 2). Read with lstat only: never opened or followed."""
    problems = []
    if store.locks not in bad:
        for name in list_names(store.locks):
            what = _not_regular(store.locks / name)
            if what is not None:
                problems.append(Problem("lock", str(store.locks / name),
                                        f"is {what} where an entry's lock file belongs (never opened)"))
    index = store.path / "index"
    if index not in bad:
        for shard in list_names(index):
            folders = [index / shard]
            if _not_folder(index / shard) is None:
                folders += [index / shard / key for key in list_names(index / shard)]
            for folder in folders:
                what = _not_folder(folder)
                if what is not None:
                    problems.append(Problem("index", str(folder), f"is {what} where a folder of the object index "
                                                                  "belongs (never followed)"))
    return problems


def _not_regular(path: Path) -> str | None:
    st = lstat_or_none(path)
    if st is None or stat.S_ISREG(st.st_mode):
        return None
    return _what(path, st)


def _not_folder(path: Path) -> str | None:
    st = lstat_or_none(path)
    if st is None or stat.S_ISDIR(st.st_mode):
        return None
    return _what(path, st)


def _what(path: Path, st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link to {os.readlink(path)}"
        except OSError:
            return "a symbolic link"
    return describe(st.st_mode)


# strays, profiles, derived state ---------------------------------------------------------------------
def _stray(report: VerifyReport, store: Store, stray: Stray) -> None:
    st = lstat_or_none(stray.path)
    if st is None:
        return  # gone on a second look
    if stray.at_store_name:
        report.seen_strays[str(stray.path)] = _identity(st)
        report.problems.append(Problem("stray", str(stray.path), f"is {stray.what}"))
    else:
        report.warnings.append(Problem("stray", str(stray.path), f"{stray.path} is {stray.what}: left as it is "
                                                                 "(hermetic owns nothing of that name)"))


def _check_roots(root: Root) -> list[Problem]:
    """Every gc root and receipt must pass its check: a bad one makes gc refuse to collect."""
    problems = []
    for kind, folder, read in (("root", root.roots, read_root), ("receipt", root.receipts, read_receipt)):
        for path in root_files(folder):
            try:
                read(path)
            except FileNotFoundError:
                continue
            except BadRecord as e:
                problems.append(Problem(kind, str(path), e.what))
    return problems


def _check_profiles(store: Store, root: Root) -> list[Problem]:
    """Each profile must be a link to an entry's ``out/`` folder that is there."""
    problems = []
    for name in list_names(root.profiles):
        link = root.profiles / name
        if name.startswith(".") and name.endswith(".tmp"):
            continue  # a profile being swapped (fs.atomic_symlink)
        for _look in range(2):   # a profile swapped by a realize meanwhile is looked at again
            what = _profile_problem(store, link)
            if what is None:
                break
        if what is not None:
            problems.append(Problem("profile", str(link), what))
    return problems


def _profile_problem(store: Store, link: Path) -> str | None:
    entry, why = profile_entry(store, link)
    if why is not None:
        return why
    if entry is not None and not store.has_entry(entry):
        return "points at a missing entry"
    return None   # sound, or dropped meanwhile (gc --drop-root)


def _check_caches(root: Root) -> list[Problem]:
    """The derived caches' records (``root.CACHES``): each a regular file holding a record of its kind. The
    compiled kernels are the tools' own caches (Inductor, Triton), which those tools check themselves."""
    problems = []
    for cache in CACHES.values():
        if cache.name == "kernels":
            continue
        folder = root.state / cache.folder
        for name in list_names(folder):
            path = folder / name
            if name.startswith(".") and name.endswith(".tmp"):
                continue  # an atomic write in progress, or garbage of a killed one
            what = _cache_problem(path)
            if what is not None:
                problems.append(Problem("cache", str(path), what))
    return problems


def _cache_problem(path: Path) -> str | None:
    try:
        record = json.loads(fs.read_regular(path, RECORD_LIMIT))
    except fs.NotRegularFile as e:
        return f"is {e.strerror}"
    except FileNotFoundError:
        return None   # replaced meanwhile (an atomic write)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"unreadable: {e}"
    if path.name in ("inputs.json", "includes.json"):   # a fs.FingerprintTable: file -> [fingerprint, fact]
        if isinstance(record, dict) and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], list)
                                            for v in record.values()):
            return None
        return "not a table of fingerprints and facts"
    if isinstance(record, dict) and isinstance(record.get("key"), str) and isinstance(record.get("inputs"), dict) \
            and "value" in record:
        return None
    return "not a cache record (key, inputs, value)"


def _check_bytecode(root: Root) -> list[Problem]:
    """The children's bytecode cache (``home/.cache/pycache``): a ``.pyc`` of this interpreter's version that
    does not load (a disk that filled while Python wrote it leaves one cut short, and every later import of
    its module fails with "marshal data too short"). Others' versions cannot be read here."""
    import importlib.util
    import marshal
    magic = importlib.util.MAGIC_NUMBER
    problems = []
    for dirpath, _dirs, names in os.walk(root.pycache):
        for fname in names:
            if not fname.endswith(".pyc"):
                continue
            path = os.path.join(dirpath, fname)
            st = lstat_or_none(path)
            if st is None:
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(Problem("bytecode", path, f"is {describe(st.st_mode)}, not a file"))
                continue
            try:
                data = fs.read_regular(path, RECORD_LIMIT)
            except (OSError, ValueError):
                continue   # replaced meanwhile: a child wrote it again
            if data[:4] != magic:
                continue
            try:
                marshal.loads(memoryview(data)[16:])
            except (EOFError, ValueError, TypeError) as e:
                problems.append(Problem("bytecode", path, f"does not load ({e}): cut short or damaged"))
    return problems


# repair -----------------------------------------------------------------------------------------------
@dataclass
class Repaired:
    healed: list[str] = field(default_factory=list)     # folders of the root's and the store's own, made again
    removed: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)     # pinned by another process: left
    changed: list[str] = field(default_factory=list)    # no longer what verify saw (published again): left


def repair(store: Store, root: Root, report: VerifyReport, *, timeout: float = 600) -> Repaired:
    """Remove what ``report`` found: corrupt blobs, strays at a blob's or an entry's name, the entries that are
    damaged or use a corrupt blob, bad profiles, cache records and bytecode. The store's removals happen
    under the gc lock held exclusive, each looked at once more there."""
    done = Repaired()
    by_kind: dict[str, set[str]] = {}
    for p in report.problems:
        by_kind.setdefault(p.kind, set()).add(p.name)
    folders = sorted(by_kind.get("folder", ()))   # parents first
    inside = [f for f in folders if Path(f).is_relative_to(store.path) and Path(f) != store.path]
    for spath in folders:   # the root's own first: the gc lock lives in the store folder
        if spath not in inside and _heal_folder(Path(spath)):
            done.healed.append(spath)
    with store.gc_lock(exclusive=True, timeout=timeout):
        for spath in inside:
            if _heal_folder(Path(spath)):
                done.healed.append(spath)
        pinned, _oldest = live_temproots(store)
        shards = {store.blob_file(name).parent for name in by_kind.get("blob", ())}
        shards |= {Path(p).parent for p in by_kind.get("stray", ()) if Path(p).parent.parent == store.blobs}
        for folder in sorted(shards):   # a blob folder of mode 555 (`chmod -R a-w ROOT`): its mode back first
            if _writable(folder):
                done.healed.append(str(folder))
        for name in sorted(by_kind.get("blob", ())):
            path = store.blob_file(name)
            _remove(done, path, report.seen_blobs.get(name), blob_ref(name) in pinned, f"blob {name}")
        for spath in sorted(by_kind.get("stray", ())):
            path = Path(spath)
            ref = blob_ref(path.name) if is_blob_name(path.name) else entry_ref(path.name)
            _remove(done, path, report.seen_strays.get(spath), ref in pinned, os.path.relpath(path, store.path))
        for spath in sorted(by_kind.get("lock", set()) | by_kind.get("index", set())):
            path = Path(spath)   # removed (never followed) only while still no lock file, no index folder
            if (_not_regular if path.parent == store.locks else _not_folder)(path) is not None:
                fs.remove_tree(path)
                done.removed.append(spath)
        for name in sorted(by_kind.get("entry", set()) | by_kind.get("tree", set())):
            path = store.entry_path(name)
            _remove(done, path, report.seen_entries.get(name), entry_ref(name) in pinned, f"entry {name}",
                    entry=(store, name))
    for kind in ("root", "receipt", "profile", "cache"):   # the root's own records: written again as needed
        for spath in sorted(by_kind.get(kind, ())):
            if lstat_or_none(spath) is not None:
                fs.remove_tree(Path(spath))   # a folder in a record's place too; never followed
                done.removed.append(spath)
    if by_kind.get("bytecode") and root.clear_pycache():
        done.removed.append(str(root.pycache))
    return done


def _heal_folder(path: Path) -> bool:
    """Make ``path`` one of hermetic's own folders again: a link, a file or a FIFO there is renamed aside and
    removed (never followed: what a link points at is left as it is), and an empty folder made in its place; a
    folder this user cannot read gets its mode back. False when it is a sound folder by now."""
    st = lstat_or_none(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return _writable(path)
    if st is not None:
        aside = path.with_name(f".{path.name}.damaged.{os.getpid()}.{os.urandom(3).hex()}")
        os.replace(path, aside)
        os.unlink(aside)
    path.mkdir(parents=True, exist_ok=True)
    return True


def _writable(folder: Path) -> bool:
    """Give one of the store's own folders that this user may not list or write (mode 000, 555) its mode back
    (``| 0o755``), through a descriptor of the folder itself: a link there is never followed (ELOOP, ENOTDIR:
    left to the folder check). True when its mode was changed."""
    try:
        fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o700 == 0o700:
            return False
        os.chmod(f"/proc/self/fd/{fd}", mode | 0o755)   # fchmod refuses an O_PATH descriptor
        return True
    finally:
        os.close(fd)


def _remove(done: Repaired, path: Path, seen: Identity | None, pinned: bool, label: str,
            entry: tuple[Store, str] | None = None) -> None:
    st = lstat_or_none(path)
    if st is None:
        return
    if seen is None or _identity(st) != seen:
        done.changed.append(label)
        return
    if pinned:
        done.in_use.append(label)
        return
    if entry is not None:
        trash = entry[0].invalidate(entry[1])
        if trash is not None:
            fs.remove_tree(trash)
    elif stat.S_ISDIR(st.st_mode):
        fs.remove_tree(path)
    else:
        os.unlink(path)
    done.removed.append(label)

