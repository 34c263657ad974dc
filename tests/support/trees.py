"""What a tree or a store holds, to show that a command left it as it was (or changed only what it should)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# the store's scratch parts: a process's temp roots, entry locks and staging come and go with every command
SCRATCH = ("temproots", "locks", "tmp")


def tree_snapshot(top: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (inode, mtime_ns, sha256) of every regular file under ``top`` (following the profile)."""
    snap = {}
    for dirpath, _dirs, files in os.walk(top, followlinks=False):
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                continue
            st = p.stat()
            snap[str(p.relative_to(top))] = (st.st_ino, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return snap


def listing(top: Path, *, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every path under ``top`` (but those under a first-level folder named in ``skip``): (size, mtime_ns) of
    a file, (0, 0) of anything else."""
    out: dict[str, tuple[int, int]] = {}
    if not top.exists():
        return out
    for dirpath, dirs, files in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        if rel.split(os.sep)[0] in skip:
            continue
        for f in files + dirs:
            p = Path(dirpath) / f
            if p.relative_to(top).parts[0] in skip:
                continue
            st = p.lstat()
            out[str(p.relative_to(top))] = (st.st_size, st.st_mtime_ns) if p.is_file() else (0, 0)
    return out


def store_listing(root: Path) -> dict[str, tuple[int, int]]:
    """Everything under a root's store but its scratch parts."""
    return listing(root / "store", skip=SCRATCH)


def bad_records(root: Path) -> dict[str, str]:
    """Every record under ``root`` that fails its check (docs/layout.md, "A bad record"): path -> why."""
    from hermetic.errors import BadRecord
    from hermetic.store.records import entry_problem, read_checked, receipt_problem, root_problem

    found: dict[str, str] = {}
    checks = [(p, lambda v, n=p.parent.name: entry_problem(v, n), "entry record")
              for p in sorted((root / "store" / "entries").glob("*/meta.json"))]
    checks += [(p, root_problem, "gc root") for p in sorted((root / "roots").glob("*.json"))]
    checks += [(p, receipt_problem, "receipt") for p in sorted((root / "receipts").glob("*.json"))]
    for path, problem, what in checks:
        try:
            read_checked(path, problem, what)
        except BadRecord as e:
            found[str(path.relative_to(root))] = e.what
    return found


def plant_special(path: Path, kind: str) -> None:
    """A FIFO (``kind`` "fifo" or "FIFO") or a bound unix socket ("socket") at ``path``: what a source folder
    must never hold (the socket's file stays after it is closed)."""
    if kind.lower() == "fifo":
        os.mkfifo(path)
        return
    import socket
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
    finally:
        s.close()
