"""Careful file-system primitives: the one place that hashes, writes atomically, links and locks.

Nothing else in the package opens files for writing in the store; it calls these.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hermetic.errors import PreconditionFailed

CHUNK = 1 << 20
Fingerprint = tuple[int, int, int, int]  # size, mtime_ns, inode, ctime_ns


def sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


def make_tree_readonly(top: Path) -> None:
    """Drop write bits on every file and folder below ``top`` (symlinks are left alone)."""
    for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o222:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o222)
        os.chmod(dirpath, 0o555)


def remove_tree(top: Path) -> int:
    """Delete a (possibly read-only) tree; returns the bytes of regular files whose last link went."""
    freed = 0
    if top.is_symlink() or top.is_file():
        st = top.lstat()
        top.unlink()
        return st.st_size if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else 0
    if not top.exists():
        return 0
    for dirpath, _dirnames, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                freed += st.st_size
    shutil.rmtree(top)
    return freed


def link_or_copy(src: str | Path, dst: str | Path) -> bool:
    """Hard-link ``src`` to ``dst``; copy (keeping mtime) across file systems or past the link limit.

    Returns True when a link was made. A copy keeps the blob's mtime so that identical bytes still
    look identical to ninja.
    """
    try:
        os.link(src, dst)
        return True
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
            raise
    shutil.copy2(src, dst)
    return False


def atomic_symlink(target: str, link: Path) -> bool:
    """Point ``link`` at ``target`` by renaming a fresh symlink over it; False when it already pointed there."""
    if link.is_symlink() and os.readlink(link) == target:
        return False
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)
    if durable_default():
        fsync_dir(link.parent)
    return True


def cached_by_fingerprint(cache_dir: Path, path: Path, what: str, compute: Callable[[], str]) -> str:
    """A fact about a file (a tool's answer, its hash), recomputed only when its stat fingerprint changes."""
    cache = cache_dir / (sha256_bytes(f"{what}\0{path}".encode())[:24] + ".json")
    fp = list(fingerprint(path) or [])
    try:
        rec = json.loads(cache.read_text())
        if rec["fp"] == fp:
            return str(rec["value"])
    except (OSError, ValueError, KeyError):
        pass
    value = compute()
    atomic_write(cache, canonical_json({"fp": fp, "value": value}), durable=False)
    return value


class FileLock:
    """An flock on a lock file, exclusive or shared, with a wait limit and a clear timeout error."""

    def __init__(self, path: Path, *, shared: bool = False, timeout: float | None = None,
                 what: str = "the store") -> None:
        self.path, self.shared, self.timeout, self.what = path, shared, timeout, what
        self.fd: int | None = None

    def acquire(self, *, blocking: bool = True) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, op | fcntl.LOCK_NB)
                    self.fd = fd
                    return True
                except BlockingIOError:
                    if not blocking:
                        os.close(fd)
                        return False
                    if deadline is None:
                        fcntl.flock(fd, op)
                        self.fd = fd
                        return True
                    if time.monotonic() >= deadline:
                        raise PreconditionFailed(
                            f"timed out after {self.timeout:g} s waiting for the lock on {self.what}",
                            where=str(self.path),
                            hint="another hermetic process holds it; wait, or raise the lock timeout") from None
                    time.sleep(0.05)
        except BaseException:
            if self.fd is None:
                os.close(fd)
            raise

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
