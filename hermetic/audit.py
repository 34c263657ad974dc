"""The outside-root audit: what appeared outside the scratch root while a realize or run worked.

Children get HOME, TMPDIR, XDG_*_HOME and the tools' cache variables pointed inside the root; this audit
checks that promise where a child could still leak: the real HOME's cache and config folders (``.cache``,
``.nv``, ``.triton``, ``.config``, ``.local``, ``.torch``, ``.pip``), new top-level entries of HOME, the
temp folders (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``$TMPDIR``) and the current folder. It snapshots each
place before the work (``start``) and compares after it (``finish``).

The walk is bounded (a depth per place, an entry budget per place; a place that exceeds it is reported as
truncated), follows no symlink and skips the root, its contents and its ancestors. The audit reports what it
sees: on a shared machine another process writing to /tmp shows up too. A change deeper than a place's depth
shows as a ``changed`` folder at the depth limit (its mtime moved), not as the file itself.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

AUDIT_VERSION = 1
HOME_DIRS = (".cache", ".nv", ".triton", ".config", ".local", ".torch", ".pip")
TEMP_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
HOME_DEPTH = 1          # new top-level entries of HOME
HOME_DIR_DEPTH = 4      # ~/.cache/pip/http-v2/a/...: deep enough for the tools' own layouts
TEMP_DEPTH = 2          # /tmp/<new>, /tmp/<existing>/<new>
CWD_DEPTH = 2
EXTRA_DEPTH = 3
MAX_ENTRIES = 20_000    # per place: a huge cache is reported as truncated, not walked for seconds
MAX_LISTED = 200        # paths listed per kind in the result; the counts are always complete

_Snapshot = dict[str, tuple[int, int, int, int, bool]]  # relpath -> (mode, size, mtime_ns, ino, at the limit)


class _Place:
    def __init__(self, path: Path, depth: int, skip: frozenset[str] = frozenset()) -> None:
        self.path, self.depth, self.skip = path, depth, skip
        self.truncated = False
        self.seen = 0


class OutsideRootAudit:
    """Snapshot the places a child could leak to before the work; report what appeared after it.

    ``home`` defaults to the caller's HOME; ``temp_dirs`` to /tmp, /var/tmp, /dev/shm and $TMPDIR;
    ``cwd`` to the current folder; ``extra`` adds places (walked 3 levels deep).
    """

    def __init__(self, root_path: Path, *, home: Path | None = None, extra: Sequence[Path] = (),
                 temp_dirs: Sequence[Path] | None = None, cwd: Path | None = None) -> None:
        self.root = Path(os.path.realpath(root_path))
        self._root_text = str(self.root)
        home = Path(home) if home is not None else Path(os.environ.get("HOME") or os.path.expanduser("~"))
        if temp_dirs is None:
            tmpdir = os.environ.get("TMPDIR")
            temp_dirs = [*TEMP_DIRS, *([Path(tmpdir)] if tmpdir else [])]
        wanted: list[tuple[Path, int, frozenset[str]]] = [(home, HOME_DEPTH, frozenset(HOME_DIRS))]
        wanted += [(home / d, HOME_DIR_DEPTH, frozenset()) for d in HOME_DIRS]
        wanted += [(Path(t), TEMP_DEPTH, frozenset()) for t in temp_dirs]
        wanted.append((Path(cwd) if cwd is not None else Path.cwd(), CWD_DEPTH, frozenset()))
        wanted += [(Path(p), EXTRA_DEPTH, frozenset()) for p in extra]
        self.places: list[_Place] = []
        seen: set[str] = set()
        for path, depth, skip in wanted:
            real = os.path.realpath(path)
            if real in seen or self._inside_root(real):
                continue
            seen.add(real)
            self.places.append(_Place(Path(real), depth, skip))
        self._before: list[_Snapshot] | None = None
        self._seconds = 0.0

    # the root, its contents and its ancestors are not "outside" ----------------------------------------
    def _inside_root(self, path: str) -> bool:
        return path == self._root_text or path.startswith(self._root_text + os.sep)

    def _on_the_way(self, path: str) -> bool:
        return self._inside_root(path) or self._root_text.startswith(path.rstrip(os.sep) + os.sep)

    # walking ---------------------------------------------------------------------------------------
    def _snapshot(self, place: _Place) -> _Snapshot:
        snap: _Snapshot = {}
        place.seen = 0
        place.truncated = False
        try:
            st = os.lstat(place.path)
        except OSError:
            return snap  # a place that does not exist yet: anything in it later is new
        if not stat.S_ISDIR(st.st_mode):
            return snap
        stack: list[tuple[str, str, int]] = [(str(place.path), "", 1)]
        while stack:
            folder, rel_folder, depth = stack.pop()
            try:
                with os.scandir(folder) as it:
                    children = list(it)
            except OSError:
                continue
            for child in children:
                if depth == 1 and child.name in place.skip:
                    continue
                full = child.path
                if self._inside_root(full):
                    continue
                if place.seen >= MAX_ENTRIES:
                    place.truncated = True
                    return snap
                try:
                    cst = child.stat(follow_symlinks=False)
                except OSError:
                    continue
                place.seen += 1
                rel = f"{rel_folder}/{child.name}" if rel_folder else child.name
                is_dir = stat.S_ISDIR(cst.st_mode)
                at_limit = is_dir and depth >= place.depth
                snap[rel] = (cst.st_mode, cst.st_size if not is_dir else 0, cst.st_mtime_ns, cst.st_ino, at_limit)
                if is_dir and not at_limit:
                    stack.append((full, rel, depth + 1))
        return snap

    def start(self) -> None:
        """Snapshot every place (before the work)."""
        t = time.monotonic()
        self._before = [self._snapshot(p) for p in self.places]
        self._seconds = time.monotonic() - t

    def finish(self) -> dict[str, Any]:
        """What appeared, changed or went away outside the root since ``start``: a JSON-ready record."""
        if self._before is None:
            raise RuntimeError("OutsideRootAudit.finish() called before start()")
        t = time.monotonic()
        created: set[str] = set()
        changed: set[str] = set()
        removed: set[str] = set()
        for place, before in zip(self.places, self._before, strict=True):
            truncated_before = place.truncated
            after = self._snapshot(place)
            place.truncated |= truncated_before
            base = str(place.path)
            for rel, now in after.items():
                full = os.path.join(base, rel)
                old = before.get(rel)
                if old is None:
                    if not place.truncated:  # past the budget, "not seen before" proves nothing
                        created.add(full)
                elif _changed(old, now) and not self._on_the_way(full):
                    changed.add(full)
            if not place.truncated:
                removed.update(os.path.join(base, rel) for rel in before if rel not in after)
        # a new folder's contents are new too: list the top of each new subtree only
        created = {p for p in created if os.path.dirname(p) not in created}
        created = {p for p in created if not self._on_the_way(p)}
        self._seconds += time.monotonic() - t
        return {
            "version": AUDIT_VERSION,
            "watched": [str(p.path) for p in self.places],
            "created": _listed(created),
            "changed": _listed(changed),
            "removed": _listed(removed),
            "counts": {"created": len(created), "changed": len(changed), "removed": len(removed),
                       "entries_walked": sum(p.seen for p in self.places)},
            "truncated": [str(p.path) for p in self.places if p.truncated],
            "clean": not (created or changed or removed),
            "complete": not any(p.truncated for p in self.places),
            "seconds": round(self._seconds, 4),
        }


def _changed(old: tuple[int, int, int, int, bool], now: tuple[int, int, int, int, bool]) -> bool:
    mode, size, mtime, ino, at_limit = now
    if stat.S_IFMT(mode) != stat.S_IFMT(old[0]) or ino != old[3]:
        return True
    if stat.S_ISDIR(mode):
        return at_limit and mtime != old[2]  # inside a folder we do not list, something moved
    return size != old[1] or mtime != old[2]


def _listed(paths: set[str]) -> list[str]:
    ordered = sorted(paths)
    return ordered[:MAX_LISTED] + ([f"... and {len(ordered) - MAX_LISTED} more"] if len(ordered) > MAX_LISTED
                                   else [])
