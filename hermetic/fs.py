"""Careful file-system primitives: the one place that hashes, writes atomically, links and locks.

Nothing outside this module and the store writes files by hand: they call these (tests/test_architecture.py
fails on a write-mode ``open``, a rename, a ``shutil.copy*``, ``tempfile`` or ``Path.write_*`` elsewhere).
Derived caches go through ``FingerprintCache``; their folders and versions are declared in ``root.CACHES``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from hermetic.errors import BadInput, PreconditionFailed

CHUNK = 1 << 20
Fingerprint = tuple[int, int, int, int]  # size, mtime_ns, inode, ctime_ns


def sha256_file(path: Path | str, *, follow: bool = True) -> tuple[str, int]:
    """(sha256, size) of a regular file's bytes (``open_regular``: a FIFO or a device is ``NotRegularFile``,
    never a read that waits or never ends); ``follow=False``: never through a symlink either."""
    h = hashlib.sha256()
    size = 0
    with open(open_regular(path, follow=follow), "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TooLarge(Exception):
    """More bytes arrived than the caller allowed (a bomb, a lying header): nothing past the limit is kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit


def write_hashed(chunks: Iterable[bytes], path: Path | str, *, limit: int | None = None,
                 progress: Callable[[int], None] | None = None, fresh: bool = True) -> tuple[str, int]:
    """Write ``chunks`` to ``path``, hashing them on the way; (sha256, size). ``fresh``: the file must not exist
    yet (else FileExistsError); otherwise it is an empty file made for this (``new_temp_file``). Past ``limit``
    bytes: TooLarge, with what was written left for the caller to remove."""
    h, size = hashlib.sha256(), 0
    with open(path, "xb" if fresh else "wb") as out:
        for chunk in chunks:
            size += len(chunk)
            if limit is not None and size > limit:
                raise TooLarge(limit)
            h.update(chunk)
            out.write(chunk)
            if progress is not None:
                progress(len(chunk))
    return h.hexdigest(), size


def chunks_of(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


def copy_hashed(stream: IO[bytes], path: Path | str, *, limit: int | None = None,
                fresh: bool = True) -> tuple[str, int]:
    """A stream into a file, hashed on the way (``write_hashed``)."""
    return write_hashed(chunks_of(stream), path, limit=limit, fresh=fresh)


def new_temp_file(directory: Path, prefix: str, suffix: str = "") -> Path:
    """An empty file of a fresh name in ``directory``: the caller fills it, then moves it or removes it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    os.close(fd)
    return Path(name)


def fingerprint(path: Path | str) -> Fingerprint | None:
    """The stat facts a no-op trusts: any rewrite changes mtime_ns or ctime_ns or the inode."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def durable_default() -> bool:
    """Power-loss durability is opt-in, as Nix's fsync-store-paths: ``HERMETIC_FSYNC=1`` fsyncs blobs, records
    and folders. Without it every write is still atomic (temp file, rename), so a killed process never leaves
    half a record; syncing records alone would not help after a power cut that loses unsynced blob data."""
    return os.environ.get("HERMETIC_FSYNC") == "1"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, durable: bool | None = None) -> None:
    """Write to a temp file beside ``path``, rename over: readers see old or new, never half. ``durable``
    (default: ``durable_default()``) also fsyncs the file before the rename and its folder after."""
    if durable is None:
        durable = durable_default()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temp path beside ``path`` for a writer that wants a file name (a plot, an archive stream); renamed over
    ``path`` when the block ends without an error, removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, compact separators: hashes reproducibly, and the C encoder keeps large records fast."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def pretty_json(obj: Any) -> bytes:
    """Sorted keys, one item a line: for records people read and diff (receipts, roots)."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def atomic_write_json(path: Path, obj: Any, *, mode: int = 0o644, durable: bool | None = None,
                      pretty: bool = False) -> None:
    atomic_write(path, pretty_json(obj) if pretty else canonical_json(obj), mode=mode, durable=durable)


def read_json(path: Path) -> Any:
    with open(path, "rb") as f:
        return json.load(f)


class NotRegularFile(OSError):
    """``read_regular`` found something else at the path: a folder, a FIFO, a device, a symbolic link."""


def open_regular(path: Path | str, *, follow: bool = True) -> int:
    """A read-only descriptor of a regular file: opened without blocking on a FIFO or a device and without
    making a terminal ours (O_NONBLOCK, O_NOCTTY), then checked by fstat before a byte is read; with ``follow``
    False, a symbolic link at ``path`` is not followed either. OSError as open raises it; ``NotRegularFile``
    (its strerror says what it is: "a FIFO", "a character device", ...) for anything but a regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow and os.path.islink(path):
            raise NotRegularFile(errno.ELOOP, "a symbolic link, not a regular file", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind_of(st.st_mode)})", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path | str, limit: int, *, follow: bool = False) -> bytes:
    """The bytes of a regular file, read without following a symbolic link at ``path`` (unless ``follow``) and
    without blocking on a FIFO or a device (``open_regular``). OSError as open raises it; ``NotRegularFile``
    for anything but a regular file; ValueError when it holds more than ``limit`` bytes."""
    fd = open_regular(path, follow=follow)
    try:
        st = os.fstat(fd)
        if st.st_size > limit:
            raise ValueError(f"{path} holds {st.st_size} bytes, more than the {limit} a record may")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"{path} holds more than the {limit} bytes a record may")
        return data
    finally:
        os.close(fd)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words: "a folder", "a FIFO", "a character device", ..."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a file"


def make_tree_readonly(top: Path) -> None:
    """Drop write bits on every file and folder below ``top``, through the folders' descriptors: a symlink
    is never followed (nor chmodded), so a link in the tree cannot make this change a file outside it."""
    top_fd = open_dir(top)
    try:
        for _dirpath, _dirnames, filenames, dir_fd in os.fwalk(dir_fd=top_fd, topdown=False):
            for name in filenames:
                st = os.lstat(name, dir_fd=dir_fd)
                if stat.S_ISREG(st.st_mode) and st.st_mode & 0o222:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                    try:
                        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o222)
                    finally:
                        os.close(fd)
            os.fchmod(dir_fd, 0o555)
    finally:
        os.close(top_fd)


def remove_tree(top: Path) -> int:
    """Delete a tree, whatever its modes and depth; returns the bytes of regular files whose last link went.
    Every folder is opened by descriptor without following links (a symlink in the tree is removed, never
    followed); one this user may not open or change (mode 000, 555) gets its mode back through an ``O_PATH``
    descriptor of that very folder (never a name a link could stand at); no recursion: a tree of any depth (a
    child's 3000 nested folders made ``shutil.rmtree`` raise RecursionError) is emptied with at most
    ``_REMOVE_DEPTH`` folders open, deeper ones moved up to the top folder first."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(top)
        return st.st_size if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else 0
    top_fd = _open_own_dir(str(top), None)
    try:
        freed = _empty(top_fd)
    finally:
        os.close(top_fd)
    os.rmdir(top)
    return freed


_REMOVE_DEPTH = 64


def _open_own_dir(name: str, dir_fd: int | None) -> int:
    """A descriptor of the folder ``name`` (never a link at it), its mode made 0700 when this user could not
    list or change it as it was."""
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)   # the folder this handle holds, whatever its name is now
        finally:
            os.close(handle)
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    with contextlib.suppress(PermissionError):
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)   # a 555 folder: its entries could not be removed
    return fd


def _empty(top_fd: int) -> int:
    """Remove everything in the folder ``top_fd``; the bytes of regular files whose last link went."""
    freed = 0
    moved = 0

    def clear(fd: int) -> list[str]:   # the folder's non-folders removed; its folders' names
        nonlocal freed
        folders = []
        with os.scandir(fd) as entries:
            for e in entries:
                st = os.lstat(e.name, dir_fd=fd)
                if stat.S_ISDIR(st.st_mode):
                    folders.append(e.name)
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    freed += st.st_size
                os.unlink(e.name, dir_fd=fd)
        return folders

    stack: list[tuple[int, str, list[str]]] = [(top_fd, "", clear(top_fd))]
    try:
        while stack:
            fd, name, pending = stack[-1]
            if pending:
                sub = pending.pop()
                if len(stack) >= _REMOVE_DEPTH:   # too deep: moved up to the top folder, emptied from there
                    while True:
                        moved += 1
                        fresh = f".hermetic-deep-{os.getpid()}-{moved}"
                        try:
                            os.stat(fresh, dir_fd=top_fd, follow_symlinks=False)
                        except FileNotFoundError:
                            break
                    os.rename(sub, fresh, src_dir_fd=fd, dst_dir_fd=top_fd)
                    stack[0][2].append(fresh)
                    continue
                child = _open_own_dir(sub, fd)
                stack.append((child, sub, clear(child)))
                continue
            stack.pop()
            if stack:
                os.close(fd)
                os.rmdir(name, dir_fd=stack[-1][0])
    finally:
        for fd, _name, _pending in stack[1:]:
            os.close(fd)
    return freed


def remove_aside(folder: Path) -> bool:
    """Remove a folder whole, renamed aside first (a sibling of a fresh name): whoever writes into it meanwhile
    finds it gone, never half removed. False when there was nothing there. A folder whose parent is a symbolic
    link (``home/.cache`` planted as a link to a folder outside the root) is never reached through it: the link
    itself is removed, what it points at is left as it was."""
    try:
        if stat.S_ISLNK(os.lstat(folder.parent).st_mode):
            os.unlink(folder.parent)
            return True
        st = os.lstat(folder)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(folder)
        return True
    aside = folder.with_name(f".{folder.name}.removed.{os.getpid()}.{os.urandom(3).hex()}")
    os.replace(folder, aside)
    remove_tree(aside)
    return True


def refuse_linked_folders(top: Path, folder: Path) -> None:
    """Each folder from below ``top`` down to ``folder`` (inclusive) that exists must be a real folder, never a
    symbolic link: hermetic makes these folders itself and writes, links and deletes inside them, so a link
    planted there would carry those writes outside the root. BadInput (exit 2) naming the first link."""
    try:
        parts = folder.relative_to(top).parts
    except ValueError:
        return
    path = top
    for part in parts:
        path = path / part
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            raise BadInput(f"{path} is a symbolic link (to {target}) where hermetic's own build folder belongs",
                           where=str(path), hint="remove the link: hermetic makes this folder itself")


def resolve(path: Path) -> Path:
    """``path.resolve()``, a loop of symbolic links raising an OSError that names the path (ELOOP) like every
    other file-system error (Python before 3.13 raises a RuntimeError)."""
    try:
        return path.resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path)) from None


def link_or_copy(src: str | Path, dst: str | Path, *, dst_dir_fd: int | None = None) -> bool:
    """Hard-link ``src`` to ``dst`` (a name in the folder ``dst_dir_fd`` when given); copy (keeping mtime)
    across file systems or past the link limit. Never through a link at ``dst``: an existing name is an error.

    Returns True when a link was made. A copy keeps the blob's mtime so that identical bytes still
    look identical to ninja.
    """
    try:
        os.link(src, dst, dst_dir_fd=dst_dir_fd, follow_symlinks=False)
        return True
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            raise
    copy_file(src, dst, dst_dir_fd=dst_dir_fd)
    return False


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(path: str | Path, *, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``path`` (relative to ``dir_fd`` when given); ELOOP or ENOTDIR when its last
    component is a symlink or no folder: what is opened this way is the folder itself, never a link's target."""
    return os.open(path, _DIR, dir_fd=dir_fd)


def copy_file(src: str | Path, dst: str | Path, *, dst_dir_fd: int | None = None) -> None:
    """Bytes, permission bits and mtime (what ninja and the executable bit care about) into a new file ``dst``;
    neither ``src`` nor ``dst`` is read or written through a symlink (ELOOP), and ``dst`` must not exist."""
    fin = open_regular(src, follow=False)   # a FIFO put in its place is refused, never waited on
    try:
        st = os.fstat(fin)
        fout = os.open(dst, _NEW_FILE, 0o600, dir_fd=dst_dir_fd)
        try:
            while chunk := os.read(fin, CHUNK):
                os.write(fout, chunk)
            os.fchmod(fout, stat.S_IMODE(st.st_mode))
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)


class TreeWriter:
    """Lays out a tree below a fresh folder through folder descriptors, for paths given in sorted order.

    Every folder is made here (``mkdir`` in its parent's descriptor) and opened with ``O_NOFOLLOW``, files are
    linked and symlinks made by name in their folder's descriptor, and a folder's write bits are dropped
    (``fchmod``) once its last entry is in: nothing is ever written, made or chmodded through a symlink, even one
    the tree itself holds. Sorted paths keep each folder's entries together, so one open folder per level
    suffices."""

    def __init__(self, top: Path, *, seal: bool = True) -> None:
        self.seal = seal
        self._open: list[tuple[str, int]] = [("", open_dir(top))]

    def _folder(self, folder: str) -> int:
        while len(self._open) > 1 and not (folder == self._open[-1][0] or
                                           folder.startswith(self._open[-1][0] + "/")):
            self._close_last()
        have = self._open[-1][0]
        rest = folder[len(have):].lstrip("/") if have else folder
        for part in rest.split("/") if rest else ():
            parent = self._open[-1][1]
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=parent)
            name = f"{self._open[-1][0]}/{part}" if self._open[-1][0] else part
            self._open.append((name, open_dir(part, dir_fd=parent)))
        return self._open[-1][1]

    def link(self, rel: str, src: str) -> bool:
        """A hard link (or a copy) of ``src``, a store file, at ``rel``; whether a link was made."""
        folder, _, name = rel.rpartition("/")
        return link_or_copy(src, name, dst_dir_fd=self._folder(folder))

    def symlink(self, rel: str, target: str) -> None:
        folder, _, name = rel.rpartition("/")
        os.symlink(target, name, dir_fd=self._folder(folder))

    def _close_last(self) -> None:
        _name, fd = self._open.pop()
        try:
            if self.seal:
                os.fchmod(fd, 0o555)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop the write bits of every folder still open, the top's last."""
        while self._open:
            self._close_last()

    def abandon(self) -> None:
        for _name, fd in self._open:
            os.close(fd)
        self._open.clear()

    def __enter__(self) -> TreeWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()


def atomic_symlink(target: str, link: Path) -> bool:
    """Point ``link`` at ``target`` by renaming a fresh symlink over it; False when it already pointed there. The
    link is made and renamed by name in its folder's descriptor, a folder that is no symlink (ELOOP)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    dir_fd = open_dir(link.parent)
    try:
        with contextlib.suppress(OSError):
            if os.readlink(link.name, dir_fd=dir_fd) == target:
                return False
        tmp = f".{link.name}.{os.getpid()}.tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            os.symlink(target, tmp, dir_fd=dir_fd)
            os.replace(tmp, link.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as e:   # named by the link's own path, never the temp name relative to a descriptor
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise OSError(e.errno, e.strerror, str(link)) from None
        if durable_default():
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


_LOCK_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
LOCKS_OPENED: set[str] = set()   # every lock file this process opened (absolute): the audit leaves out only these


def open_lock_file(path: Path, what: str = "a lock", *, single_link: bool = False, hint: str | None = None) -> int:
    """A descriptor of the lock file ``path`` (created 0644 when missing), opened without following a symlink at
    its name and without blocking on a FIFO or a device; for anything but a regular file (of one link, with
    ``single_link``: a lock hermetic writes in a folder other users share), BadInput (exit 2) naming it.
    Nothing has been read or written through it. An existing file is opened without
    O_CREAT (which the kernel's protected_regular refuses on another user's file in a sticky folder), a missing
    one created with O_EXCL (never through a dangling link)."""
    try:
        while True:
            try:
                fd = os.open(path, _LOCK_OPEN)
                break
            except FileNotFoundError:
                try:
                    fd = os.open(path, _LOCK_OPEN | os.O_CREAT | os.O_EXCL, 0o644)
                    break
                except FileExistsError:
                    continue   # made meanwhile by another process (or a link is there): open it as it is
    except OSError as e:
        if e.errno == errno.EISDIR:
            raise _refused(path, what, "a folder", hint) from None
        if e.errno != errno.ELOOP:
            raise
        try:
            why = f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            why = "a symbolic link"
        raise _refused(path, what, why, hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, what, kind_of(st.st_mode), hint)
        if single_link and st.st_nlink != 1:
            raise _refused(path, what, f"a file of {st.st_nlink} hard links (another name of some other file)",
                           hint)
    except BaseException:
        os.close(fd)
        raise
    LOCKS_OPENED.add(os.path.abspath(path))
    return fd


def _refused(path: Path, what: str, why: str, hint: str | None = None) -> BadInput:
    return BadInput(f"the lock file of {what} is {why}, not a lock file: hermetic does not open it for writing",
                    where=str(path), hint=hint or "someone may have planted it, in a lock folder other users share: "
                                                  "remove it (`ls -l` shows its owner), or choose another lock "
                                                  "folder (HERMETIC_LOCK_DIR)")


class FileLock:
    """An flock on a lock file, exclusive or shared, with a wait limit and a clear timeout error."""

    def __init__(self, path: Path, *, shared: bool = False, timeout: float | None = None,
                 what: str = "the store", single_link: bool = False, hint: str | None = None) -> None:
        self.path, self.shared, self.timeout, self.what = path, shared, timeout, what
        self.hint = hint   # said when the lock file is no lock file (``open_lock_file``)
        self.single_link = single_link   # a lock of a shared folder, written by ``note``: never a hard link
        self.fd: int | None = None

    def acquire(self, *, blocking: bool = True, on_wait: Callable[[float], None] | None = None) -> bool:
        """Take the lock; ``on_wait(seconds waited)`` is called about twice a second while another holds it.
        The lock file is opened without following a symlink and must be a regular file, of one link with
        ``single_link`` (``open_lock_file``: BadInput, exit 2, for anything else): a lock folder may be shared
        with other users, and a link planted there must never lead hermetic's writes (``note``) elsewhere."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(self.path, self.what, single_link=self.single_link, hint=self.hint)
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        started = time.monotonic()
        deadline = None if self.timeout is None else started + self.timeout
        told = started
        try:
            while True:
                try:
                    fcntl.flock(fd, op | fcntl.LOCK_NB)
                    if not self._current(fd):
                        fd = self._reopen(fd)
                        continue
                    self.fd = fd
                    return True
                except BlockingIOError:
                    if not blocking:
                        os.close(fd)
                        return False
                    if deadline is None and on_wait is None:
                        fcntl.flock(fd, op)
                        if not self._current(fd):
                            fd = self._reopen(fd)
                            continue
                        self.fd = fd
                        return True
                    now = time.monotonic()
                    if on_wait is not None and now - told >= 0.5:
                        told = now
                        on_wait(now - started)
                    if deadline is not None and now >= deadline:
                        raise PreconditionFailed(
                            f"timed out after {self.timeout:g} s waiting for the lock on {self.what}",
                            where=str(self.path),
                            hint="another hermetic process holds it; wait, or raise the lock timeout") from None
                    time.sleep(0.05)
        except BaseException:
            if self.fd is None:
                os.close(fd)
            raise

    def _current(self, fd: int) -> bool:
        """Whether the file locked through ``fd`` is still the one at the path: its holder may have removed
        it (``remove``) while this process waited, and a lock on a removed file excludes nobody."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _reopen(self, fd: int) -> int:
        os.close(fd)
        return open_lock_file(self.path, self.what, single_link=self.single_link, hint=self.hint)

    def remove(self) -> None:
        """Unlink the lock file while holding it (before ``release``): a waiter wakes on the removed file,
        sees that it is no longer the one at the path and takes the lock again on a new one."""
        assert self.fd is not None, "remove() on a lock not held"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def note(self, text: str) -> None:
        """Say in the held lock file who holds it (for the next one who waits): written through the lock's own
        descriptor, so the file is never replaced under another waiter's lock."""
        assert self.fd is not None, "note() on a lock not held"
        data = text.encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def share_with_everyone(self) -> None:
        """Let every user take this lock later (a machine-wide lock folder): mode 0666 through the held
        descriptor, and only on a file this user owns (never another user's, never through a link)."""
        assert self.fd is not None, "share_with_everyone() on a lock not held"
        st = os.fstat(self.fd)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o666:
            with contextlib.suppress(OSError):
                os.fchmod(self.fd, 0o666)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def scratch_file(directory: Path, prefix: str) -> Iterator[Path]:
    """A temp file name inside ``directory`` that is removed unless the caller moved it away."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=prefix)
    os.close(fd)
    path = Path(name)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def scratch_dir(directory: Path, prefix: str) -> Iterator[Path]:
    """A fresh folder inside ``directory``, removed with everything in it when the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=directory, prefix=prefix))
    try:
        yield path
    finally:
        remove_tree(path)


_PROCESS_SCRATCH: dict[str, Path] = {}
_PROCESS_FOLDERS: dict[tuple[str, str], Path] = {}


def folder_for_this_process(directory: Path, prefix: str) -> Path:
    """A fresh folder ``<prefix>*`` in ``directory`` (one of hermetic's own, in the root) for the rest of this
    process: the same one each call, removed with everything in it at exit. It is locked (flock on the folder)
    while this process lives: the first call sweeps the folders of ``prefix`` whose lock is free, those a kill -9
    left (``sweep_process_folders``)."""
    key = (str(directory), prefix)
    if key not in _PROCESS_FOLDERS:
        sweep_process_folders(directory, prefix)
        _PROCESS_FOLDERS[key] = _locked_fresh(directory, prefix, None)
    return _PROCESS_FOLDERS[key]


SCRATCH_MARKER = ".hermetic-scratch"
SCRATCH_MARKER_TEXT = b"made by hermetic for one process; removed at its exit, or by the next command once free\n"


def process_scratch_dir(prefix: str) -> Path:
    """A folder of the system's temp folder for the rest of this process (made on first use, removed with
    everything in it at exit): where a dry run's children write, so that nothing lands in the root. It holds
    hermetic's marker (``SCRATCH_MARKER``) and is locked (flock on the folder) while this process lives: one left
    by a process killed with kill -9 has its lock free, and ``sweep_scratch_dirs`` (run here first) removes it."""
    if prefix not in _PROCESS_SCRATCH:
        sweep_scratch_dirs(prefix)
        _PROCESS_SCRATCH[prefix] = _locked_fresh(Path(tempfile.gettempdir()), prefix, SCRATCH_MARKER)
    return _PROCESS_SCRATCH[prefix]


def _locked_fresh(directory: Path, prefix: str, marker: str | None) -> Path:
    """A new folder ``<prefix><pid>-<random>`` in ``directory``, holding ``marker`` when given, locked before it
    gets a name the sweep looks at and removed at exit (the lock goes with the process, even at kill -9)."""
    import atexit
    fresh = Path(tempfile.mkdtemp(dir=directory, prefix=f".{prefix}new-"))   # not yet a name the sweep looks at
    fd = open_dir(fresh)
    if marker is not None:
        mfd = os.open(marker, _NEW_FILE, 0o444, dir_fd=fd)
        try:
            os.write(mfd, SCRATCH_MARKER_TEXT)
        finally:
            os.close(mfd)
    fcntl.flock(fd, fcntl.LOCK_EX)   # nobody else knows the folder yet: never waits
    path = fresh.with_name(f"{prefix}{os.getpid()}-{fresh.name.rsplit('-', 1)[-1]}")
    os.rename(fresh, path)
    atexit.register(_drop_scratch, path, fd)
    return path


def _drop_scratch(path: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        remove_tree(path)
    os.close(fd)


def _marked(dir_fd: int) -> bool:
    """Whether the folder holds hermetic's scratch marker: a regular file of this user, with hermetic's words."""
    try:
        fd = os.open(SCRATCH_MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and \
            os.read(fd, len(SCRATCH_MARKER_TEXT) + 1) == SCRATCH_MARKER_TEXT
    finally:
        os.close(fd)


def sweep_scratch_dirs(prefix: str) -> list[Path]:
    """Remove this user's folders of ``prefix`` in the system's temp folder that hermetic made (its marker is in
    them) and whose process is gone (their lock is free: a process killed with kill -9 runs no exit handler).
    A folder of that name without the marker is someone's own: never touched. Returns what it removed."""
    return _sweep(Path(tempfile.gettempdir()), prefix, marked=True)


def sweep_process_folders(directory: Path, prefix: str) -> list[Path]:
    """Remove the folders of ``prefix`` in ``directory`` (one of hermetic's own) that ``folder_for_this_process``
    made for a process now gone (their lock is free). Returns what it removed."""
    return _sweep(directory, prefix, marked=False)


def live_process_folders(directory: Path, prefix: str) -> list[Path]:
    """The folders of ``prefix`` in ``directory`` that ``folder_for_this_process`` made for a process that still
    lives (their lock is held)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(prefix))
    except OSError:
        return []
    live = []
    for name in names:
        try:
            if not stat.S_ISDIR(os.lstat(directory / name).st_mode):
                continue   # a link, a file: no folder of a process
        except OSError:
            continue
        try:   # a home its child made mode 000 is opened all the same (its mode mended): the re-attack's B2
            fd = _open_own_dir(str(directory / name), None)
        except OSError:
            live.append(directory / name)   # cannot be told dead: taken as live
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            live.append(directory / name)
        finally:
            os.close(fd)   # a lock taken here goes with the descriptor
    return live


def _sweep(top: Path, prefix: str, *, marked: bool) -> list[Path]:
    try:
        names = [n for n in os.listdir(top) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = top / name
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = _open_own_dir(str(path), None)   # a mode of 000 left on it is mended (the re-attack's B1)
        except OSError:
            continue
        if marked and not _marked(fd):
            os.close(fd)
            continue   # not hermetic's
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue   # its process lives
        try:
            remove_tree(path)
            removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


CACHE_LIMIT = 256 << 20   # a derived cache's record larger than this is damage (the largest, the input hashes of
                          # a build of thousands of files, is a few MB)


class FingerprintCache:
    """A derived fact (a parsed lock, an interpreter's facts, a tool's answer) trusted while the stat
    fingerprints of the files it was derived from are unchanged.

    One record per key, ``<folder>/<sha256(key)[:24]>.json``: the key, the fingerprint of every input and the
    value. ``folder`` is a bucket of ``root.CACHES`` (its name carries its format version, so a format change is
    a new folder and the old one is garbage for gc). Caches are never the only copy of anything: a damaged or
    stale record is a miss.
    """

    def __init__(self, folder: Path, *, read_only: bool = False) -> None:
        self.folder = folder
        self.read_only = read_only   # a dry run's: read, never written (``put`` does nothing)

    def _path(self, key: str) -> Path:
        return self.folder / (sha256_bytes(key.encode())[:24] + ".json")

    def get(self, key: str) -> Any:
        """The value stored under ``key`` while every input it names still has its fingerprint; else None."""
        try:  # a damaged record (cut short, not JSON, a FIFO or a link in its place) is a miss, never a hang
            rec = json.loads(read_regular(self._path(key), CACHE_LIMIT))
            if rec["key"] != key:
                return None
            for path, fp in rec["inputs"].items():
                if fingerprint(path) != (tuple(fp) if fp is not None else None):
                    return None
            return rec["value"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def put(self, key: str, value: Any, inputs: Sequence[Path | str] = ()) -> None:
        """Store ``value`` under ``key``, valid while each of ``inputs`` keeps the fingerprint it has now."""
        if self.read_only:
            return
        record = {"key": key, "inputs": {str(p): fingerprint(p) for p in inputs}, "value": value}
        data = canonical_json(record)
        path = self._path(key)
        with contextlib.suppress(OSError, ValueError):
            if read_regular(path, CACHE_LIMIT) == data:
                return  # unchanged: a no-op writes nothing
        try:
            atomic_write(path, data, durable=False)   # over a damaged one too (rename replaces a FIFO or a link)
        except IsADirectoryError:   # a folder where the record belongs: derived state, removed and written anew
            remove_tree(path)
            atomic_write(path, data, durable=False)

    def values(self) -> Iterator[Any]:
        """Every value still valid, in no particular order."""
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("*.json")):
            try:
                key = json.loads(read_regular(path, CACHE_LIMIT))["key"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not isinstance(key, str):
                continue
            value = self.get(key)
            if value is not None:
                yield value

    def cached(self, key: str, inputs: Sequence[Path | str], compute: Callable[[], Any]) -> Any:
        found = self.get(key)
        if found is None:
            found = compute()
            self.put(key, found, inputs)
        return found


class FingerprintTable:
    """One derived fact per file for thousands of files (the hashes of every compile input), in one record file
    read once and written once: each fact is trusted while its file keeps the fingerprint it had. The same rule
    as ``FingerprintCache``, laid out for many small facts read together."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only   # a dry run's: read, never saved
        try:  # damaged (cut short, a FIFO in its place): every fact a miss, and the table written anew
            loaded = json.loads(read_regular(path, CACHE_LIMIT))
            self.facts: dict[str, list[Any]] = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self.facts = {}
        self.dirty = False

    def get(self, file: str) -> tuple[Fingerprint | None, Any]:
        """(the file's fingerprint now, its fact if that fingerprint is the recorded one, else None: a fact of
        another shape, from a damaged table, is a miss too)."""
        fp = fingerprint(file)
        rec = self.facts.get(file)
        if fp is None or not isinstance(rec, list) or len(rec) != 2 or rec[0] != list(fp):
            return fp, None
        return fp, rec[1]

    def put(self, file: str, fp: Fingerprint, fact: Any) -> None:
        self.facts[file] = [list(fp), fact]
        self.dirty = True

    def save(self) -> None:
        if self.dirty and not self.read_only:
            try:
                atomic_write(self.path, canonical_json(self.facts), durable=False)
            except IsADirectoryError:   # a folder where the table belongs: derived state, removed and written anew
                remove_tree(self.path)
                atomic_write(self.path, canonical_json(self.facts), durable=False)
            self.dirty = False
