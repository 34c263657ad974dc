"""The error hierarchy. Every failure a user can cause or meet is one of these.

A message says what went wrong, where (file and line, or key), and what to do. The CLI maps each class to
the exit code of PRODUCT.md in one place (``exit_code``) and prints no traceback for them.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from pathlib import PurePath

WORK_NEEDED = 4   # `realize --check`: the recipe is not up to date (not a failure: nothing was attempted)


class HermeticError(Exception):
    """Base class: the work failed (exit 1)."""

    exit_code = 1
    kind = "failed"

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.where = where
        self.hint = hint

    def render(self) -> str:
        head = f"{self.where}: {self.what}" if self.where else self.what
        return f"error: {head}" + (f"\n  hint: {self.hint}" if self.hint else "")

    def as_record(self) -> dict[str, object]:
        return {"kind": self.kind, "what": self.what, "where": self.where, "hint": self.hint}


class WorkFailed(HermeticError):
    """A compile error, a failed check, corruption found (exit 1)."""


class FetchFailed(WorkFailed):
    """A network or transfer failure after retries (exit 1)."""

    kind = "fetch-failed"


class SandboxRefused(WorkFailed):
    """A child tried to write outside the scratch root and the lock folder, the sandbox refused, and the child
    failed (exit 1): the work wrote where it must not, as a failed compile is the work failing."""

    kind = "sandbox-refused"


class BadInput(HermeticError):
    """Invalid TOML, unknown key, wrong type, missing file, hash or size mismatch, hostile archive (exit 2)."""

    exit_code = 2
    kind = "bad-input"


class BadRecord(BadInput):
    """A record read back from the root or an archive that fails its check (docs/layout.md, "A bad record"):
    exit 2, naming the file; what each command does about it is that table's row."""

    kind = "bad-record"


class PreconditionFailed(HermeticError):
    """A lock wait timed out, the GPU is busy, the toolchain does not match torch (exit 3)."""

    exit_code = 3
    kind = "precondition"


# OSErrors about a path that a user causes: a path they named (--root, a recipe, a lock, a patch, the lock
# folder) or a file they changed (a cache, the root). Any other OSError is a bug and keeps its traceback.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_PATH_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR,
                errno.EEXIST, errno.ENAMETOOLONG, errno.EXDEV)


def path_error(e: OSError, *, doing: str = "", hint: str | None = None,
               place: str | None = None) -> HermeticError | None:
    """The clear error an OSError about a path is: what the path's trouble is, the path as ``where``, what to
    do (``hint`` adds what the caller knows, e.g. which setting named the path); None for an OSError no user
    causes. A full disk is the work failing (exit 1); everything else here is bad input (exit 2). ``place``
    names where a full disk happened when the error names no file (a failed write() names none)."""
    filename = e.filename if e.filename is not None or e.errno not in _NO_SPACE else place
    if filename is None or e.errno not in (*_NO_SPACE, *_PATH_ERRNOS):
        return None
    path = os.fsdecode(filename)
    second = os.fsdecode(e.filename2) if e.filename2 is not None else None
    renamed_over = False
    if second is not None and _temp_of(path, second):   # an atomic write's rename: the user knows its target
        path, second, renamed_over = second, None, True
    other = f" (and {second})" if second is not None else ""
    if e.errno == errno.EXDEV:   # a rename between two file systems: name the mount that splits them
        path, other = _across_mounts(path, second)
    what, advice = _explain(e.errno, path, below=e.filename is None, renamed_over=renamed_over)
    what = f"{doing}: {what}{other}" if doing else what + other
    full = f"{advice}; {hint}" if hint else advice
    if e.errno in _NO_SPACE:
        return WorkFailed(what, where=path, hint=full)
    return BadInput(what, where=path, hint=full)


def _temp_of(tmp: str, target: str) -> bool:
    """Whether ``tmp`` is the temp file an atomic write renames over ``target`` (``.<name>.<anything>.tmp``
    beside it): an internal name a message never shows."""
    name = os.path.basename(tmp)
    return name.startswith(f".{os.path.basename(target)}.") and name.endswith(".tmp") and \
        os.path.dirname(tmp) in ("", os.path.dirname(target))


def _explain(code: int, path: str, *, below: bool = False, renamed_over: bool = False) -> tuple[str, str]:
    if code in _NO_SPACE:
        quota = " (the disk quota is full)" if code == errno.EDQUOT else ""
        return (f"no space left on the device while writing {'below ' if below else ''}{path}{quota}",
                "free space there (`hermetic gc` deletes what no root needs) or choose another --root; what was "
                "half written is garbage `hermetic gc` removes")
    if code == errno.ENOENT:
        return f"{path} does not exist", "check the path (was it removed while hermetic ran? then run again)"
    if code == errno.ENOTDIR:
        blocking = _first_ancestor(path, _no_folder)
        what = _kind(blocking) if blocking else None
        if blocking and what and what.startswith("a symbolic link"):   # opened without following it
            return (f"{blocking} is {what} where a folder belongs: hermetic does not follow a link there, so "
                    f"{path} cannot be used", _REMOVE_LINK)
        if blocking == path:
            return f"{path} is {what or 'a file'}, not a folder", "choose a folder, or move that file away"
        return (f"{blocking or 'a folder on the path'} is {what or 'a file'}, not a folder, so {path} cannot exist",
                "choose a path whose folders are folders, or move that file away")
    if code == errno.ELOOP:
        looping = _first_ancestor(path, _loops)
        if looping is None and os.path.islink(path):   # opened with O_NOFOLLOW: a link where a file belongs
            return (f"{path} is {_kind(path)} where hermetic opens a file without following links",
                    _REMOVE_LINK)
        return (f"{looping or path} is a loop of symbolic links",
                "fix or remove the symbolic link (`ls -l` shows where it points)")
    if code in (errno.EACCES, errno.EPERM):
        existing = path if os.path.lexists(path) else _first_ancestor(path, os.path.exists, last=True)
        whose = f" for uid {os.geteuid()}" if hasattr(os, "geteuid") else ""
        place = path if existing == path else f"{existing}, so {path} cannot be created"
        return (f"permission denied{whose}: {place}",
                "give this user access (read for inputs; write for the scratch root and the lock folder), or "
                "choose a path it may use")
    if code == errno.EROFS:
        mount = _mount_of(path, _mount_points())
        return (f"{path} is on a read-only file system" + (f" (the mount at {mount})" if mount else ""),
                "choose a path on a writable file system (the scratch root and the lock folder are written to)")
    if code == errno.EXDEV:
        return (f"{path} is a mount point inside the scratch root, so hermetic cannot move files across it (it "
                "publishes and removes by renaming within one file system)",
                "unmount it (a read-only or bind mount over a folder of the root, such as store/entries, is not "
                "supported); keep the whole root on one file system")
    if code == errno.EISDIR and renamed_over:
        return (f"{path} is a folder where hermetic writes a file",
                "move it away (under the scratch root, `hermetic verify --repair` removes it)")
    if code == errno.EISDIR:
        return f"{path} is a folder, not a file", "give the path of a file"
    if code == errno.EEXIST:
        return f"{path} is in the way: something exists where hermetic creates it", "move it away"
    return f"the path {path} is too long", "choose a shorter path"


def _across_mounts(path: str, path2: str | None) -> tuple[str, str]:
    """(the mount point that lies between the two paths of a failed rename, what else to say): the deepest
    mount on either path that is not on the other (a bind mount of the same file system too, which st_dev
    cannot tell)."""
    mounts = _mount_points()
    first, second = _mount_of(path, mounts), _mount_of(path2, mounts) if path2 else None
    moving = f" (moving {path} to {path2})" if path2 else ""
    if first == second or (first is None and second is None):
        return path, moving
    return max((m for m in (first, second) if m is not None), key=len), moving


def _mount_points() -> list[str]:
    """Every mount point of this process's mount namespace (Linux's /proc/self/mountinfo); none elsewhere."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:   # octal escapes for space, tab, newline and backslash in the mount point
            found.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return found


def _mount_of(path: str, mounts: list[str]) -> str | None:
    """The deepest mount point at or above ``path``."""
    full = os.path.abspath(path)
    best = None
    for m in mounts:
        if (full == m or full.startswith(m.rstrip("/") + "/")) and (best is None or len(m) > len(best)):
            best = m
    return best


_REMOVE_LINK = ("remove the link (`ls -l` shows where it points; in the scratch root, `hermetic verify --repair` "
                "removes it, leaving what it points at)")


def _no_folder(p: str) -> bool:
    """Something stands at ``p`` that is no real folder: a file, a FIFO, a symbolic link (to a folder too)."""
    try:
        return not stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _kind(p: str) -> str | None:
    """What stands at ``p``, in words ("a file", "a symbolic link to /x", "a FIFO"), read with lstat."""
    try:
        mode = os.lstat(p).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(p)}"
        except OSError:
            return "a symbolic link"
    for test, what in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a device file"


def _loops(p: str) -> bool:
    try:
        os.stat(p)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _first_ancestor(path: str, test: Callable[[str], bool], *, last: bool = False) -> str | None:
    """The first folder on ``path``, from the top, that passes ``test`` (``last``: the deepest one)."""
    full = os.path.abspath(path)
    chain = [*reversed([str(p) for p in PurePath(full).parents]), full]
    found = [p for p in chain if test(p)]
    return (found[-1] if last else found[0]) if found else None


# what a child's output says ran out, when it was not its own code that failed (a compiler's, a linker's)
_DISK_FULL = ("no space left on device", "disk quota exceeded")
_NO_MEMORY = ("virtual memory exhausted", "cannot allocate memory", "out of memory", "std::bad_alloc")


def ran_out(output: str, address_space: int | None = None) -> str | None:
    """The hint for a child that failed because something ran out, as its output says (a full disk; memory,
    under the recipe's ``[limits] address_space`` or not), else None: the child's own error is the cause."""
    low = output.lower()
    if any(words in low for words in _DISK_FULL):
        return ("the disk is full (the output above says so): free space there (`hermetic gc` deletes what no root "
                "needs) or choose another --root, then realize again; what compiled is kept")
    if any(words in low for words in _NO_MEMORY):
        if address_space is not None:
            return (f"memory ran out under the recipe's [limits] address_space ({address_space / (1 << 20):.0f} "
                    "MiB for each compiler process): raise it, or leave the key out for no limit")
        return "memory ran out (the output above says so): lower [limits] jobs, or free memory on this machine"
    return None
