"""The content-addressed store: blobs by sha256, immutable entries published by rename.

Invariant (written once, enforced here): a path under ``entries/`` or ``blobs/`` is complete and valid.
Everything is built under ``tmp/`` and renamed into place under a per-entry lock after re-checking that
no one beat us to it; gc renames an entry into ``trash/`` (invalidating it) before deleting it. A crash
therefore leaves garbage in ``tmp/`` or ``trash/``, never a half-valid entry.

Layout (docs/layout.md):
    FORMAT              store format version
    blobs/ab/<sha256>   file contents, read-only; ``<sha256>x`` for executable files
    entries/<name>/     meta.json (+ out/ for trees); read-only
    locks/<name>.lock   per-entry build locks
    temproots/<pid>-*   entries and blobs held alive by running hermetic processes
    gc.lock             shared by users of entries, exclusive for gc

The rest of the package: ``trees`` (trees of hard links to blobs, profiles), ``roots`` (gc roots), ``gc``,
``verify``, ``archive`` (export and import), ``substitute`` (another store a blob may come from).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from hermetic import fs
from hermetic.errors import BadInput, BadRecord, WorkFailed
from hermetic.root import Root, not_a_folder, refuse_folders

if TYPE_CHECKING:  # the record types: not imported at run time, so a no-op realize never creates them
    from hermetic.store.records import (
        EntryRecord,
        FileMap,
        ModuleRecord,
        ObjectRecord,
        TreeRecord,
        UnpackedRecord,
    )

STORE_FORMAT = 1
ENTRY_META = "meta.json"
KINDS = ("unpacked", "tree", "object", "module")   # the kinds of entry store.records types


# references: what records, roots and temp roots hold --------------------------------------------------
def entry_ref(name: str) -> str:
    return f"entry:{name}"


def blob_ref(blob: str) -> str:
    """``blob`` is a blob's file name: its sha256, with an ``x`` for an executable file."""
    return f"blob:{blob}"


def split_refs(refs: list[str] | set[str]) -> tuple[list[str], list[str]]:
    """(entry names, blob names) of a list of references; anything else is ignored (a newer kind, or a name no
    entry or blob has, which could only be a path: never followed)."""
    entries, blobs = [], []
    for ref in refs:
        kind, _, name = ref.partition(":")
        if kind == "entry" and is_entry_name(name):
            entries.append(name)
        elif kind == "blob" and is_blob_name(name):
            blobs.append(name)
    return entries, blobs


def entry_name(key: str, label: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._+-" else "_" for c in label)[:80]
    return f"{key[:32]}-{safe}"


def blob_name(digest: str, executable: bool) -> str:
    """A blob's file name: its sha256, and an ``x`` for an executable file (a blob's mode is part of it)."""
    return digest + ("x" if executable else "")


def split_blob_name(name: str) -> tuple[str, bool]:
    return name.rstrip("x"), name.endswith("x")


_HEX = frozenset("0123456789abcdef")
_LABEL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-")


def is_blob_name(name: str) -> bool:
    """Whether ``name`` is a blob's file name: 64 lowercase hex digits, and an ``x`` for an executable."""
    digest = name[:-1] if name.endswith("x") else name
    return len(digest) == 64 and set(digest) <= _HEX


def is_entry_name(name: str) -> bool:
    """Whether ``name`` is an entry's folder name (``entry_name``): 32 hex digits, a dash and a label."""
    return len(name) > 33 and name[32] == "-" and set(name[:32]) <= _HEX and set(name[33:]) <= _LABEL


def describe(mode: int) -> str:
    """What a file-system object is, for a message: "a folder", "a symbolic link", "a FIFO"..."""
    for test, what in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "an unknown kind of file"


class Stray:
    """Something in the store that is no blob and no entry: hermetic never opens, follows or deletes it,
    except where it sits at a blob's or an entry's name (``at_store_name``), which only ``verify --repair``
    clears (the blob is then fetched or built again)."""

    __slots__ = ("path", "what", "at_store_name")

    def __init__(self, path: Path, what: str, at_store_name: bool) -> None:
        self.path, self.what, self.at_store_name = path, what, at_store_name


def lstat_or_none(path: Path | str) -> os.stat_result | None:
    """``os.lstat``, None for a path that is gone (or whose folder is no longer a folder)."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def list_names(folder: Path) -> list[str]:
    """The sorted names in ``folder``; none when it is gone or not a folder (never followed: a symbolic link
    to a folder lists nothing)."""
    st = lstat_or_none(folder)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return []
    try:
        return sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


class NotRegular(Exception):
    """A path that should hold a regular file holds something else (a folder, a link, a FIFO)."""

    def __init__(self, path: Path | str, mode: int) -> None:
        super().__init__(f"{path} is {describe(mode)}, not a file")
        self.path, self.mode = path, mode


def hash_regular(path: Path | str) -> tuple[str, int]:
    """sha256 and size of a regular file, never opening anything else: lstat first, then an open that neither
    follows a link nor waits on a FIFO, and the open file checked to be the regular file lstat saw."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(path, st.st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):
            raise NotRegular(path, now.st_mode)
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, fs.CHUNK):
            h.update(chunk)
            size += len(chunk)
        return h.hexdigest(), size
    finally:
        os.close(fd)


def layout_problems(root: Root, store: Store, *, readable: bool = False) -> list[tuple[Path, str]]:
    """Every folder of the root's and the store's own that is no real folder (``Root.folder_problems``,
    ``Store.folder_problems``), parents first: (path, what stands there)."""
    found = root.folder_problems()
    if not any(p == store.path for p, _w in found):
        found += [(p, w) for p, w in store.folder_problems(readable=readable) if p != store.path]
    return sorted(found)


class Store:
    def __init__(self, path: Path, *, durable: bool | None = None, read_only: bool = False) -> None:
        """``read_only``: a plan's view (``realize --dry-run``): ``use`` and ``use_blob`` only look (nothing is
        pinned, no temp-roots file made), ``open`` makes nothing, and every writer raises: the invariant "a plan
        writes nothing" kept here, in one place."""
        self.path = path
        self.read_only = read_only
        self.blobs = path / "blobs"
        self._blobs_text = str(self.blobs)
        self.entries = path / "entries"
        self.locks = path / "locks"
        self.tmp = path / "tmp"
        self.trash = path / "trash"
        self.temproots_dir = path / "temproots"
        # fsync of every blob is off by default, as in Nix (fsync-store-paths): a killed process loses
        # nothing the kernel already holds; HERMETIC_FSYNC=1 also survives power loss.
        self.durable = fs.durable_default() if durable is None else durable
        self._temproots: TempRoots | None = None

    def _writing(self, what: str) -> None:
        if self.read_only:
            raise RuntimeError(f"{what} in a read-only view of the store {self.path}")

    # opening ---------------------------------------------------------------
    def open(self, *, check: bool = True) -> Store:
        """Ready the store for use: its format checked, a store made where there is none (a read-only view
        stays without); ``check``: refuse (exit 2) when one of its own folders is no real folder
        (``folder_problems``): nothing is ever written or deleted through a link there. verify and show look
        without it, to report what they find."""
        fmt = self.path / "FORMAT"
        if os.path.lexists(fmt):
            try:
                found = fs.read_regular(fmt, 4096).decode(errors="replace").strip()
            except (fs.NotRegularFile, ValueError):
                raise WorkFailed("the store's FORMAT is not a small regular file", where=str(fmt),
                                 hint="move it away if hermetic did not write it; `hermetic gc --all` starts "
                                      "the root afresh") from None
            if found != f"hermetic-store {STORE_FORMAT}":
                raise WorkFailed(f"the store has format {found!r}; this hermetic reads format {STORE_FORMAT}",
                                 where=str(fmt), hint="use a matching hermetic, or `hermetic gc --all`")
        if not self.read_only:   # a new store, or an own folder gone missing (made again, empty: derived)
            for d in (self.blobs, self.entries, self.locks, self.tmp, self.trash, self.temproots_dir):
                if not os.path.lexists(d):
                    d.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(fmt):
                fs.atomic_write(fmt, f"hermetic-store {STORE_FORMAT}\n".encode())
        if check:
            refuse_folders(self.folder_problems())
        return self

    OWN = ("blobs", "entries", "locks", "tmp", "trash", "temproots", "index")

    def folder_problems(self, *, readable: bool = False) -> list[tuple[Path, str]]:
        """The store's own folders (the store itself, ``OWN``, and the blob folders ``blobs/XY``) that are no real
        folder: a symbolic link (never followed), a file, a FIFO; with ``readable``, also a blob folder this user
        cannot list (mode 000). (path, what stands there) for each: verify reports them, repair makes each an
        empty real folder again, gc and realize refuse to work through them. Read with lstat and the folder
        listing's own file types: a few system calls."""
        found = []
        for path in (self.path, *(self.path / name for name in self.OWN)):
            what = not_a_folder(path)
            if what is not None:
                found.append((path, what))
        if any(p in (self.path, self.blobs) for p, _w in found):
            return found
        try:
            shards = sorted(os.scandir(self.blobs), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return found
        for e in shards:
            if len(e.name) != 2 or not set(e.name) <= _HEX:
                continue   # a stray of no shard's name: a warning of scan_blobs, never hermetic's
            path = self.blobs / e.name
            what = None if e.is_dir(follow_symlinks=False) else not_a_folder(path)
            if what is None and readable:
                try:
                    os.close(fs.open_dir(path))
                except PermissionError:
                    what = "a blob folder this user cannot read (its mode)"
                except FileNotFoundError:
                    continue
            if what is not None:
                found.append((path, what))
        return found

    def exists(self) -> bool:
        return (self.path / "FORMAT").exists()

    @property
    def temproots(self) -> TempRoots:
        if self._temproots is None:
            self._temproots = _process_temproots(self.temproots_dir)
        return self._temproots

    def gc_lock(self, *, exclusive: bool = False, timeout: float | None = None) -> fs.FileLock:
        return fs.FileLock(self.path / "gc.lock", shared=not exclusive, timeout=timeout,
                           what="the store's gc lock")

    def work_dir(self, prefix: str) -> Path:
        """A fresh folder of this process under ``tmp/`` (an import's staging; the caller removes it). It is
        locked (flock) for the rest of the process, as temp roots are: gc spares a locked folder and removes
        one whose lock is free (its process is gone). This process's temp root is made first, so that gc also
        spares the folder, newer than it, in the instant before its lock is taken."""
        _ = self.temproots
        path = self.tmp / f"{prefix}{os.getpid()}-{os.urandom(4).hex()}"
        os.mkdir(path)
        fd = fs.open_dir(path)
        _WORK_LOCKS.append(fd)
        fcntl.flock(fd, fcntl.LOCK_EX)   # nobody else knows it yet (gc's probe may hold it for an instant)
        return path

    def pin_entry(self, name: str) -> None:
        """Hold an entry alive for the rest of this process (a temp root gc reads; none in a read-only view)."""
        if not self.read_only:
            self.temproots.add(entry_ref(name))

    def pin_blob(self, name: str) -> None:
        """Hold a blob (by its file name, ``blob_name``) alive for the rest of this process."""
        if not self.read_only:
            self.temproots.add(blob_ref(name))

    # blobs -----------------------------------------------------------------
    def blob_path(self, digest: str, executable: bool = False) -> Path:
        return self.blobs / digest[:2] / blob_name(digest, executable)

    def blob_text(self, digest: str, executable: bool = False) -> str:
        """``blob_path`` as a string, for loops over thousands of files (pathlib costs more than a link)."""
        return f"{self._blobs_text}/{digest[:2]}/{blob_name(digest, executable)}"

    def blob_file(self, name: str) -> Path:
        """The path of a blob by its file name (``blob_name``)."""
        return self.blobs / name[:2] / name

    def has_blob(self, digest: str, executable: bool = False) -> bool:
        """Whether the blob is there: a regular file at its name (a link, a folder or a FIFO there is a stray,
        which a blob put in its place replaces or ``verify --repair`` removes)."""
        st = lstat_or_none(self.blob_text(digest, executable))
        return st is not None and stat.S_ISREG(st.st_mode)

    def use_blob(self, digest: str, executable: bool = False) -> bool:
        """Pin a blob for this process (a temp root); False if it does not exist. Like ``use``, atomic with
        respect to gc: a blob found here stays until this process ends. A read-only view only looks."""
        if self.read_only:
            return self.has_blob(digest, executable)
        with self.gc_lock():
            self.pin_blob(blob_name(digest, executable))
            return self.has_blob(digest, executable)

    def put_blob_file(self, src: Path, digest: str, executable: bool = False) -> Path:
        """Move a verified temp file (on the store's file system) into place as a read-only blob (pinned)."""
        self._writing("a blob put")
        dst = self.blob_path(digest, executable)
        if self.use_blob(digest, executable):
            src.unlink()
            return dst
        os.chmod(src, 0o555 if executable else 0o444)
        if self.durable:
            fd = os.open(src, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        while True:
            shard = self._shard_fd(dst.parent.name)
            try:
                # over a stray link or FIFO at the blob's name too: the blob takes its place; by name in the
                # shard's own descriptor, so never into a folder a link at the shard's name points at
                os.replace(src, dst.name, dst_dir_fd=shard)
                return dst
            except FileNotFoundError:  # drop_blob removed the empty shard folder in between: make it again
                if not src.exists():
                    raise
            except IsADirectoryError:
                raise WorkFailed(f"a folder stands where the blob {dst.name} belongs", where=str(dst),
                                 hint="run `hermetic verify --repair`, which removes it") from None
            finally:
                os.close(shard)

    def _shard_fd(self, shard: str) -> int:
        """The blob folder ``blobs/<shard>`` opened as itself (``O_NOFOLLOW`` from the store down), made when
        missing; a link, a file or a FIFO at its name (or at ``blobs``) is refused, exit 2 naming it."""
        fd = -1
        try:
            fd = fs.open_dir(self.path)
            for name in ("blobs", shard):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                inner = fs.open_dir(name, dir_fd=fd)
                os.close(fd)
                fd = inner
        except OSError as e:
            if fd >= 0:
                os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                refuse_folders([(p, what) for p in (self.path, self.blobs, self.blobs / shard)
                                if (what := not_a_folder(p)) is not None])
            raise
        return fd

    def put_blob_stream(self, stream: IO[bytes], executable: bool = False) -> tuple[str, int]:
        """Hash while copying to a temp file; publish as a blob unless it already exists."""
        self._writing("a blob put")
        with fs.scratch_file(self.tmp, "blob-") as tmp:
            digest, size = fs.copy_hashed(stream, tmp, fresh=False)
            self.put_blob_file(tmp, digest, executable)
        return digest, size

    def put_blob_copy(self, src: Path) -> tuple[str, int]:
        """A copy of a file that stays where it is (an object in a build folder, which the next compile
        rewrites): the blob must be an inode of its own. Returns (sha256, size)."""
        with open(src, "rb") as f:
            return self.put_blob_stream(f)

    def put_blob_bytes(self, data: bytes, executable: bool = False) -> str:
        """Publish ``data`` as a blob; an existing blob of that name whose bytes are no longer ``data`` (a
        flipped bit) is healed in place, so every tree that links it is right again."""
        self._writing("a blob put")
        digest = hashlib.sha256(data).hexdigest()
        if not self.use_blob(digest, executable):
            with fs.scratch_file(self.tmp, "blob-") as tmp:
                fs.write_hashed([data], tmp, fresh=False)
                self.put_blob_file(tmp, digest, executable)
        elif hash_regular(self.blob_path(digest, executable))[0] != digest:
            self.heal_blob(digest, executable, data)
        return digest

    def heal_blob(self, digest: str, executable: bool, data: bytes) -> None:
        """Rewrite a corrupt blob's bytes in place (its inode is shared by every tree that holds the file)."""
        self._writing("a blob healed")
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"healing blob {digest} with other bytes")
        path = self.blob_path(digest, executable)
        os.chmod(path, 0o644)
        try:
            with open(path, "r+b") as f:
                f.write(data)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.chmod(path, 0o555 if executable else 0o444)

    def drop_blob(self, digest: str, executable: bool = False) -> None:
        """Remove a blob that must not stay (corrupt, or a hostile download no entry will ever name)."""
        self._writing("a blob removed")
        path = self.blob_path(digest, executable)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(OSError):  # only an empty shard goes (put_blob_file makes it again if need be)
            path.parent.rmdir()

    def iter_blobs(self) -> Iterator[tuple[str, bool, Path]]:
        """Every blob (a regular file at a blob's name in its shard); strays are skipped (``scan_blobs``)."""
        for digest, executable, path, _st in self.scan_blobs()[0]:
            yield digest, executable, path

    def scan_blobs(self) -> tuple[list[tuple[str, bool, Path, os.stat_result]], list[Stray]]:
        """The blobs, each with its lstat, and the strays among them: a shard that is no folder of a shard's
        name (a ``.DS_Store``), a name no blob has, and anything but a regular file at a blob's name. Read with
        lstat only; what vanishes while it is read is skipped."""
        blobs: list[tuple[str, bool, Path, os.stat_result]] = []
        strays: list[Stray] = []
        for shard in list_names(self.blobs):
            folder = self.blobs / shard
            st = lstat_or_none(folder)
            if st is None:
                continue
            if len(shard) != 2 or not set(shard) <= _HEX:
                strays.append(Stray(folder, f"{describe(st.st_mode)} where only blob folders belong", False))
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue   # no folder at a blob folder's name: one of folder_problems, never followed
            try:
                names = list_names(folder)
            except PermissionError:
                continue   # a blob folder this user cannot read: folder_problems(readable=True) says it
            for name in names:
                path = folder / name
                st = lstat_or_none(path)
                if st is None:
                    continue
                if not is_blob_name(name) or not name.startswith(shard):
                    strays.append(Stray(path, f"{describe(st.st_mode)} whose name no blob has", False))
                elif not stat.S_ISREG(st.st_mode):
                    strays.append(Stray(path, f"{describe(st.st_mode)} where a blob belongs", True))
                else:
                    blobs.append((*split_blob_name(name), path, st))
        return blobs, strays

    # entries ---------------------------------------------------------------
    def entry_path(self, name: str) -> Path:
        return self.entries / name

    def has_entry(self, name: str) -> bool:
        """Whether the entry is there: a folder (never a link) holding its record. A record that is damaged
        (not a file, not JSON) still says the entry is there: reading it (``record``) says what is wrong."""
        folder = lstat_or_none(self.entries / name)
        return folder is not None and stat.S_ISDIR(folder.st_mode) and \
            lstat_or_none(self.entries / name / ENTRY_META) is not None

    def record(self, name: str) -> EntryRecord:
        """An entry's record (OSError when the entry does not exist; BadRecord, exit 2, when its record fails its
        check: docs/layout.md, "A bad record")."""
        from hermetic.store.records import entry_problem, read_checked
        path = self.entries / name / ENTRY_META
        try:
            meta: Any = read_checked(path, lambda m: entry_problem(m, name), f"record of store entry {name}")
        except BadRecord as e:
            raise BadRecord(f"store entry {name} is corrupt: {e.what}", where=str(path),
                            hint="run `hermetic verify --repair`") from None
        return cast("EntryRecord", meta)

    def _record_of(self, name: str, kind: str) -> EntryRecord:
        rec = self.record(name)
        if rec["kind"] != kind:
            raise BadRecord(f"store entry {name} is a {rec['kind']} entry where a {kind} entry was expected",
                             where=str(self.entries / name / ENTRY_META), hint="run `hermetic verify --repair`")
        return rec

    def object_record(self, name: str) -> ObjectRecord:
        return cast("ObjectRecord", self._record_of(name, "object"))

    def module_record(self, name: str) -> ModuleRecord:
        return cast("ModuleRecord", self._record_of(name, "module"))

    def tree_record(self, name: str) -> TreeRecord:
        return cast("TreeRecord", self._record_of(name, "tree"))

    def unpacked_record(self, name: str) -> UnpackedRecord:
        return cast("UnpackedRecord", self._record_of(name, "unpacked"))

    def iter_entries(self) -> list[str]:
        """Every entry's name (a folder of an entry's name); strays are skipped (``scan_entries``)."""
        return [name for name, _st in self.scan_entries()[0]]

    def scan_entries(self) -> tuple[list[tuple[str, os.stat_result]], list[Stray]]:
        """The entries (folders of an entry's name), each with its folder's lstat, and the strays: anything
        else under ``entries/`` (a file, a link, a FIFO; a folder of a name no entry has)."""
        entries: list[tuple[str, os.stat_result]] = []
        strays: list[Stray] = []
        for name in list_names(self.entries):
            path = self.entries / name
            st = lstat_or_none(path)
            if st is None:
                continue
            if not is_entry_name(name):
                strays.append(Stray(path, f"{describe(st.st_mode)} whose name no entry has", False))
            elif not stat.S_ISDIR(st.st_mode):
                strays.append(Stray(path, f"{describe(st.st_mode)} where an entry belongs", True))
            else:
                entries.append((name, st))
        return entries, strays

    def entry_lock(self, name: str) -> fs.FileLock:
        return fs.FileLock(self.locks / f"{name}.lock", what=f"store entry {name}",
                           hint="run `hermetic verify --repair`, which removes it (never opened or followed)")

    @contextlib.contextmanager
    def build_entry(self, name: str) -> Iterator[Staging | None]:
        """Build an entry once: yields a Staging to fill, or None when it already exists.

        Concurrent builders of the same entry wait on its lock and then find it built. A build that fails
        (a hostile wheel, a compile error) leaves neither its staging nor its lock file: the lock file is
        unlinked while held, which ``fs.FileLock`` makes safe for a waiter (it re-opens a lock whose file
        was replaced or removed while it waited).
        """
        self._writing(f"entry {name} built")
        with self.entry_lock(name) as lock:
            if self.use(name):
                yield None
                return
            staging = Staging(self, name)
            try:
                yield staging
                staging.publish()
            except BaseException:
                lock.remove()
                raise
            finally:
                staging.discard()

    def use(self, name: str) -> bool:
        """Pin an existing entry for this process (a temp root); False if it does not exist.

        Pin and check happen under the gc lock (shared): gc plans and deletes under it (exclusive), so it
        either sees this pin or has finished deleting before the check. Without the lock, gc could plan,
        this process pin and find the entry, and gc delete it anyway (tests/test_concurrency.py). An entry
        whose record is no regular file (a FIFO, a folder, a link in its place) is never used: BadRecord. A
        read-only view only looks.
        """
        if self.read_only:
            present = self.has_entry(name)
        else:
            with self.gc_lock():
                self.pin_entry(name)
                present = self.has_entry(name)
        if present:
            meta = lstat_or_none(self.entries / name / ENTRY_META)
            if meta is not None and not stat.S_ISREG(meta.st_mode):
                self.record(name)   # raises BadRecord naming it
        return present

    def invalidate(self, name: str) -> Path | None:
        """Rename an entry into trash/: from this moment it is invalid garbage. Returns its trash path."""
        self._writing(f"entry {name} invalidated")
        src = self.entries / name
        if not src.exists():
            return None
        self.trash.mkdir(exist_ok=True)
        dst = self.trash / f"{name}.{os.urandom(4).hex()}"
        os.chmod(src, 0o755)  # renaming a folder needs write permission on the folder itself
        os.replace(src, dst)
        return dst

    def drop_entry(self, name: str) -> None:
        """Invalidate an entry and delete it now (a corrupt one found in use: it is built again)."""
        trash = self.invalidate(name)
        if trash is not None:
            fs.remove_tree(trash)

    def unpublish(self, names: list[str]) -> None:
        """Take back entries this process published just now (an import that failed midway), except those
        another process pinned meanwhile: under the gc lock, like gc's deletions, and for the same reason."""
        if not names:
            return
        with self.gc_lock(exclusive=True):
            pinned, _ = live_temproots(self)
            for name in names:
                if entry_ref(name) not in pinned:
                    self.drop_entry(name)

    # the index: entries listed under a lookup key (objects by what must be equal to compare their inputs)
    def index_add(self, key: str, name: str) -> Path:
        self._writing("an index entry added")
        link = self.path / "index" / key[:2] / key / name
        fs.atomic_symlink(os.path.relpath(self.entry_path(name), link.parent), link)
        return link

    def index_list(self, key: str) -> list[str]:
        folder = self.path / "index" / key[:2] / key
        return list_names(folder)   # a link where the folder belongs lists nothing: never followed (a miss)


class Staging:
    """A folder under tmp/ that becomes ``entries/<name>`` on publish (or is deleted)."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = name
        store.tmp.mkdir(parents=True, exist_ok=True)
        self.path = store.tmp / f"entry-{name}.{os.getpid()}.{os.urandom(4).hex()}"
        self.path.mkdir()
        self._lock: int | None = fs.open_dir(self.path)   # gc spares a staging folder its process holds locked
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.record: EntryRecord | None = None       # the builder sets it; publish writes it as meta.json
        self.readonly_dirs: list[str] | None = None  # set when the builder knows its folders: no walk needed
        self._staged_blobs: list[tuple[Path, str, bool]] = []
        self._published = False

    @property
    def out(self) -> Path:
        return self.path / "out"

    def stage_blob(self, stream: IO[bytes], executable: bool) -> tuple[str, int]:
        """A file's bytes held in the staging folder, hashed, until ``commit_blobs`` (when the whole input
        proved sound: a wheel whose RECORD matched) or until the staging is discarded. (sha256, size)."""
        folder = self.path / "blobs"
        folder.mkdir(exist_ok=True)
        tmp = folder / str(len(self._staged_blobs))
        digest, size = fs.copy_hashed(stream, tmp)
        self._staged_blobs.append((tmp, digest, executable))
        return digest, size

    def commit_blobs(self) -> None:
        for tmp, digest, executable in self._staged_blobs:
            self.store.put_blob_file(tmp, digest, executable)
        self._staged_blobs.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.path / "blobs").rmdir()

    def ingest(self) -> FileMap:
        """Turn the files written under ``out/`` into blobs and hard links to them (the tree's files are then
        the store's); their file map."""
        files: FileMap = {}
        store = self.store
        for dirpath, dirnames, names in os.walk(self.out):
            for n in names + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                p = Path(dirpath) / n
                rel = p.relative_to(self.out).as_posix()
                # only regular files become blobs: a symlink would be hashed, chmodded and moved through
                if not stat.S_ISREG(os.lstat(p).st_mode):
                    raise BadInput(f"{rel} in the tree of {self.name} is not a regular file",
                                   where=str(p), hint="a tree's files are regular files: nothing was stored")
                executable = os.access(p, os.X_OK)
                digest, _size = fs.sha256_file(p, follow=False)
                # pinned under the gc lock (an existing blob too): gc cannot delete it before the link below
                blob = store.put_blob_file(p, digest, executable)
                fs.link_or_copy(blob, p)
                files[rel] = (digest, executable)
        return dict(sorted(files.items()))

    def publish(self) -> None:
        if self.record is None:
            raise RuntimeError(f"staging {self.name} published without a record")
        if self.record["name"] != self.name or self.record["format"] != STORE_FORMAT:
            raise RuntimeError(f"staging {self.name} holds the record of {self.record['name']}")
        fs.atomic_write_json(self.path / ENTRY_META, self.record, durable=self.store.durable)
        if self.readonly_dirs is None:
            fs.make_tree_readonly(self.path)
        else:
            for d in reversed(self.readonly_dirs):
                os.chmod(d, 0o555)
            os.chmod(self.path / ENTRY_META, 0o444)
        os.chmod(self.path, 0o755)  # the entry folder stays renamable, for gc's invalidation
        dst = self.store.entries / self.name
        with self.store.gc_lock():
            os.replace(self.path, dst)
            self.store.pin_entry(self.name)
        if self.store.durable:
            fs.fsync_dir(self.store.entries)
        self._published = True
        self._unlock()

    def discard(self) -> None:
        try:
            if not self._published and self.path.exists():
                fs.remove_tree(self.path)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


class TempRoots:
    """Entries and blobs this process uses, in a file locked for the process's life.

    gc treats the contents of every still-locked temproots file as roots; a file whose lock it can take
    belonged to a dead process and is removed.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}-{os.urandom(4).hex()}"
        self.lock = fs.FileLock(self.path)
        self.lock.acquire()
        assert self.lock.fd is not None
        # the file's ctime moves with every pin written to it: its first line keeps when the process began
        # using the store, which gc's "newer than the oldest running process" needs
        self.created = os.fstat(self.lock.fd).st_ctime_ns
        os.write(self.lock.fd, f"{CREATED}{self.created}\n".encode())
        self.seen: set[str] = set()

    def add(self, ref: str) -> None:
        if ref in self.seen:
            return
        self.seen.add(ref)
        assert self.lock.fd is not None
        os.write(self.lock.fd, (ref + "\n").encode())

    def created_ns(self) -> int:
        return self.created


_WORK_LOCKS: list[int] = []   # the locks of this process's work folders (``Store.work_dir``)
CREATED = "created:"   # the first line of a temp-roots file: its ctime before anything was written to it
_OPEN_TEMPROOTS: dict[Path, TempRoots] = {}


def _process_temproots(directory: Path) -> TempRoots:
    """One temp-roots file per store per process, shared by every Store object opened on it."""
    key = directory.resolve()
    if key not in _OPEN_TEMPROOTS:
        # the first pin of this process: its file goes in the store's own folder, never through a link there
        refuse_folders([(p, what) for p in (directory.parent, directory) if (what := not_a_folder(p)) is not None])
        _OPEN_TEMPROOTS[key] = TempRoots(directory)
    return _OPEN_TEMPROOTS[key]


def release_temproots() -> None:
    """At the end of a command: its entries are now held by roots, or by nothing."""
    for tr in _OPEN_TEMPROOTS.values():
        with contextlib.suppress(FileNotFoundError):
            tr.path.unlink()
        tr.lock.release()
    _OPEN_TEMPROOTS.clear()
    while _WORK_LOCKS:
        os.close(_WORK_LOCKS.pop())


def inherit_pins() -> None:
    """Let the program this process execs (``hermetic env RECIPE -- CMD``) inherit its temp roots' locks: what
    it pinned stays alive until that program, and every child it hands the descriptor to, has exited."""
    for tr in _OPEN_TEMPROOTS.values():
        assert tr.lock.fd is not None
        os.set_inheritable(tr.lock.fd, True)


def _read_regular_text(path: Path) -> str:
    """A temp-roots file's text: opened only as a regular file (never a FIFO, never through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(path, st.st_mode)
        chunks = []
        while chunk := os.read(fd, fs.CHUNK):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def live_temproots(store: Store) -> tuple[set[str], int | None]:
    """Refs held by running processes, and the creation time of the oldest live temproots file."""
    refs: set[str] = set()
    oldest: int | None = None
    if not store.temproots_dir.exists():
        return refs, oldest
    mine = _OPEN_TEMPROOTS.get(store.temproots_dir.resolve())
    own = mine.path if mine else None
    for name in list_names(store.temproots_dir):
        p = store.temproots_dir / name
        st = lstat_or_none(p)
        if p == own or st is None or not stat.S_ISREG(st.st_mode):
            continue  # a stray (a folder, a link, a FIFO) is no process's: never opened
        probe = fs.FileLock(p)
        try:
            if probe.acquire(blocking=False):
                probe.release()
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                continue
        except FileNotFoundError:
            continue
        with contextlib.suppress(FileNotFoundError, NotRegular, UnicodeDecodeError):
            lines = _read_regular_text(p).splitlines()
            ctime = os.stat(p).st_ctime_ns  # a file without its first line (a hermetic before it): an upper bound
            if lines and lines[0].startswith(CREATED) and lines[0][len(CREATED):].isdigit():
                ctime = int(lines[0][len(CREATED):])
            refs.update(line for line in lines if line and not line.startswith(CREATED))
            oldest = ctime if oldest is None else min(oldest, ctime)
    return refs, oldest

