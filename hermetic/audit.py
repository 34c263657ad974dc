"""The outside-root audit: what appeared outside the scratch root while a realize or run worked.

Children get HOME, TMPDIR, XDG_*_HOME and the tools' cache variables pointed inside the root; this audit
checks that promise where a child could still leak: the real HOME's cache and config folders (``.cache``,
``.nv``, ``.triton``, ``.config``, ``.local``, ``.torch``, ``.pip``), new top-level entries of HOME, the
temp folders (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``$TMPDIR``), the lock folder (where only lock files may
appear: anything else there is a leak) and the current folder. It snapshots each place before the work
(``start``) and compares after it (``finish``).

The walk goes to any depth (a change five folders below /tmp is found), but for HOME's top (one level) and
the current folder (two), listed under ``shallow``; it has an entry budget per place, follows no
symlink and skips the root, its contents and its ancestors. What it could not check (a place past its budget,
a folder it cannot list, a lock folder not watched from the start) is listed under ``unchecked``, and then
``clean`` is ``"unknown"``, never true. It reports what it sees
(``created``, ``changed``, ``removed``: on a shared machine other processes' files in /tmp too) and judges
each of those files (``files``: ``ours`` yes, no or unknown, with the reason), from what hermetic knows of its
own children (``finish(children=...)``: when each ran, and whether in the sandbox) and what the file says of
itself. hermetic itself writes nothing outside the root and the lock folder (every write goes through
``hermetic.fs`` and the store, tests/test_architecture.py), so only a child can leak:

* not ours: a file owned by another user; one whose last change (its ctime, which no program can set) fell
  when no child of hermetic ran outside the sandbox (none at all, or every one in the sandbox, where the
  place was read-only); one another live process holds open;
* unknown: a file removed (nothing is left to ask), or one changed while an unsandboxed child ran in a place
  where another writer was seen during the same work;
* ours: the rest: changed by this user while an unsandboxed child of hermetic ran, no other writer seen there.

``clean``: false when a file is ours; else ``"unknown"`` when something was unchecked; else true. A shallow
place is checked to its depth only: where a child ran outside the sandbox, what lies deeper is listed under
``unchecked`` (a file written four folders below HOME moves no folder's time at the limit), so ``clean`` is
then ``"unknown"`` at best. In a lock folder only the lock files this command itself opened are left out
(``fs.LOCKS_OPENED``): a new file there, ``*.lock`` or not, and a changed lock file this command did not hold
are judged like any other (a lock file whose only content is another process's holder line, "pid N on HOST
since TIME", is that process's: the same user's other commands share the folder).

Processes: a child's processes that left its session (setsid) and outlived it are stopped when the child ends
(``procs.stop_escaped``); ``finish`` stops any left and lists them all under ``escaped``. What one did is judged
as a child's (its span runs from its child's start until it was stopped), and since it may have written where
the audit does not look, ``clean`` is then ``"unknown"`` at best. A file held open by a process that carries a
child's mark (``procs.carries_mark``) is held by a child of hermetic, not by another process.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

AUDIT_VERSION = 4   # 4: shallow places unchecked below their depth when a child ran unsandboxed; escaped processes
                    # 3: every place but HOME's top and the current folder walked whole; clean may be "unknown"
HOME_DIRS = (".cache", ".nv", ".triton", ".config", ".local", ".torch", ".pip")
TEMP_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
HOME_DEPTH = 1          # HOME itself is watched at its top only: new entries there (its caches are places of
                        # their own, walked whole); the record lists it under "shallow"
CWD_DEPTH = 2           # the current folder (a checkout, often large) to two levels, listed under "shallow" too:
                        # children never run in it (their folder is in the root), so only an absolute path leaks
ALL = None              # every other place is walked to any depth: a change five folders down is found
MAX_ENTRIES = 50_000    # per place: past it the place is "unchecked" and the audit's clean is "unknown"
MAX_LISTED = 200        # paths listed per kind in the result; the counts are always complete
SLACK_S = 0.05          # file times come from a coarse clock: a change this close to a child's span is in it

# a child of hermetic: (started, ended) as time.time() gives them, the program, and whether it ran in the sandbox
Child = tuple[float, float, str, bool]
_Snapshot = dict[str, tuple[int, int, int, int, bool]]  # relpath -> (mode, size, mtime_ns, ino, at the limit)


class _Place:
    def __init__(self, path: Path, depth: int | None, skip: frozenset[str] = frozenset(), *,
                 locks: bool = False) -> None:
        self.path, self.depth, self.skip, self.locks = path, depth, skip, locks
        self.truncated = False
        self.unreadable: list[str] = []   # folders it could not list: what is in them was not checked
        self.seen = 0


class OutsideRootAudit:
    """Snapshot the places a child could leak to before the work; report what appeared after it.

    ``home`` defaults to the caller's HOME; ``temp_dirs`` to /tmp, /var/tmp, /dev/shm and $TMPDIR;
    ``cwd`` to the current folder; ``extra`` adds places; ``lock_folders`` (default: the machine's lock folder,
    ``root.lock_dir``) are watched too, where only lock files (``*.lock``) may appear.
    """

    def __init__(self, root_path: Path, *, home: Path | None = None, extra: Sequence[Path] = (),
                 temp_dirs: Sequence[Path] | None = None, cwd: Path | None = None,
                 lock_folders: Sequence[Path] | None = None) -> None:
        self.root = Path(os.path.realpath(root_path))
        self._root_text = str(self.root)
        home = Path(home) if home is not None else Path(os.environ.get("HOME") or os.path.expanduser("~"))
        if temp_dirs is None:
            tmpdir = os.environ.get("TMPDIR")
            temp_dirs = [*TEMP_DIRS, *([Path(tmpdir)] if tmpdir else [])]
        if lock_folders is None:
            from hermetic.root import lock_dir
            lock_folders = [lock_dir(None)]
        self.lock_folders = [os.path.realpath(p) for p in lock_folders]
        wanted: list[tuple[Path, int | None, frozenset[str]]] = [(home, HOME_DEPTH, frozenset(HOME_DIRS))]
        wanted += [(home / d, ALL, frozenset()) for d in HOME_DIRS]
        wanted += [(Path(t), ALL, frozenset()) for t in temp_dirs]
        wanted.append((Path(cwd) if cwd is not None else Path.cwd(), CWD_DEPTH, frozenset()))
        wanted += [(Path(p), ALL, frozenset()) for p in [*extra, *lock_folders]]
        self.places: list[_Place] = []
        seen: set[str] = set()
        for path, depth, skip in wanted:
            real = os.path.realpath(path)
            if self._inside_root(real):
                continue
            if real in self.lock_folders:  # a lock folder that is another place too is watched as a lock folder
                self.places = [p for p in self.places if str(p.path) != real]
            elif real in seen:
                continue
            seen.add(real)
            self.places.append(_Place(Path(real), depth, skip, locks=real in self.lock_folders))
        self._before: list[_Snapshot] | None = None
        self._seconds = 0.0
        self.started = 0.0

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
            except FileNotFoundError:
                continue
            except OSError as e:
                place.unreadable.append(f"{folder} ({e.strerror or e})")
                continue
            for child in children:
                if depth == 1 and child.name in place.skip:
                    continue
                full = child.path
                if self._inside_root(full) or (full in self.lock_folders and not place.locks):
                    continue  # the root is not outside; a lock folder is a place of its own
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
                at_limit = is_dir and place.depth is not None and depth >= place.depth
                snap[rel] = (cst.st_mode, cst.st_size if not is_dir else 0, cst.st_mtime_ns, cst.st_ino, at_limit)
                if is_dir and not at_limit:
                    stack.append((full, rel, depth + 1))
        return snap

    def start(self) -> None:
        """Snapshot every place (before the work)."""
        t = time.monotonic()
        self.started = time.time()
        self._before = [self._snapshot(p) for p in self.places]
        self._seconds = time.monotonic() - t

    def finish(self, *, children: Sequence[Child] | None = None, exclude: Sequence[Path] = ()) -> dict[str, Any]:
        """What appeared, changed or went away outside the root since ``start``, each judged ours or not: a
        JSON-ready record. ``children``: every child hermetic ran meanwhile (``procs.SPANS``); None when the
        caller cannot say, which counts the whole time since ``start`` as one unsandboxed child's. ``exclude``:
        the lock folders (the same as ``lock_folders`` at the start): there, only lock files are left out; a
        lock folder not watched since ``start`` is listed as unchecked."""
        if self._before is None:
            raise RuntimeError("OutsideRootAudit.finish() called before start()")
        t = time.monotonic()
        if children is None:
            children = [(self.started, time.time(), "the work audited", False)]
        escaped = _escaped_since(self.started)
        free = [c for c in children if not c[3]]
        # what an escaped process did is a child's doing, until it was stopped
        children = [*children, *((min((c[0] for c in free), default=self.started), e["stopped_at"],
                                  f"pid {e['pid']} ({e['program']}), which {e['left_by'] or 'a child'} left running",
                                  False) for e in escaped)]
        named = [os.path.realpath(p) for p in exclude if os.path.realpath(p) not in self.lock_folders]
        # a lock folder named only now was walked all the same where it lies inside a place walked whole
        covered = [f for f in named if any(p.depth is ALL and (f == str(p.path) or f.startswith(str(p.path) + os.sep))
                                           for p in self.places)]
        late = [f for f in named if f not in covered]
        locks = [*self.lock_folders, *covered]
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
        # in a lock folder, lock files come and go on purpose (hermetic's and other users'); anything else is not
        created, changed, removed = (
            {p for p in paths if not _a_lock_file(p, locks)} for paths in (created, changed, removed))
        unchecked = [f"{p.path}: more than {MAX_ENTRIES} entries, past the audit's budget" for p in self.places
                     if p.truncated]
        unchecked += [f"{u}: cannot be listed" for u in dict.fromkeys(u for p in self.places for u in p.unreadable)]
        unchecked += [f"{p}: the lock folder, not watched since the work began" for p in late]
        if free or escaped:   # a child could write anywhere: what a shallow place holds deeper was not looked at
            unchecked += [f"{p.path}: walked {p.depth} level{'s' if p.depth != 1 else ''} deep only, and a child of "
                          f"hermetic ran outside the sandbox: a change deeper was not checked"
                          for p in self.places if p.depth is not None]
        unchecked += [f"what pid {e['pid']} ({e['program']}) did: {e['left_by'] or 'a child'} left it running outside "
                      f"its session; stopped, it may have written where the audit does not look" for e in escaped]
        files = _judge(self.places, [(p, "created") for p in created] + [(p, "changed") for p in changed]
                       + [(p, "removed") for p in removed], children)
        by = {v: [f for f in files if f["ours"] == v] for v in ("yes", "unknown", "no")}
        self._seconds += time.monotonic() - t
        return {
            "version": AUDIT_VERSION,
            "watched": [str(p.path) for p in self.places],
            "excluded": [f"{p}/*.lock" for p in locks],
            "shallow": [str(p.path) for p in self.places if p.depth is not None],
            "created": _listed(created),
            "changed": _listed(changed),
            "removed": _listed(removed),
            "files": [f for v in ("yes", "unknown", "no") for f in by[v][:MAX_LISTED]],
            "counts": {"created": len(created), "changed": len(changed), "removed": len(removed),
                       "ours": len(by["yes"]), "unknown": len(by["unknown"]), "not_ours": len(by["no"]),
                       "entries_walked": sum(p.seen for p in self.places)},
            "children": {"ran": len(children), "sandboxed": sum(1 for c in children if c[3])},
            "truncated": [str(p.path) for p in self.places if p.truncated],
            "escaped": escaped[:MAX_LISTED],
            "unchecked": unchecked,
            # a leak found is unclean; a place not fully checked leaves it unknown, never clean
            "clean": False if by["yes"] else "unknown" if unchecked else True,
            "complete": not unchecked,
            "seconds": round(self._seconds, 4),
        }


def _escaped_since(started: float) -> list[dict[str, Any]]:
    """Every process a child of this hermetic left running outside its session, stopped since ``started``:
    those still running are stopped now."""
    procs = sys.modules.get("hermetic.procs")   # not loaded: no child ran (a no-op imports no more)
    if procs is None:
        return []
    procs.stop_escaped(left_by="a child of hermetic (found by the audit)")
    return [e.record() for e in procs.ESCAPED if e.stopped >= started]


def _a_lock_file(path: str, lock_folders: Sequence[str]) -> bool:
    """A lock file this command held in a lock folder: ``*.lock`` right inside it, opened by this process
    (``fs.LOCKS_OPENED``), a regular file (or gone again). Any other file there is judged."""
    from hermetic.fs import LOCKS_OPENED
    folder, name = os.path.split(path)
    if folder not in lock_folders or not name.endswith(".lock"):
        return False
    if path not in LOCKS_OPENED and os.path.join(os.path.realpath(folder), name) not in LOCKS_OPENED:
        return False
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True


_HOLDER_LINE = re.compile(rb"pid (\d+) on \S+ since \S+\n")


def _other_holder(path: str) -> int | None:
    """The pid of another process (live or not) whose holder line is all a lock file ``path`` says (a lock
    another hermetic holds or held: the same user's other commands share the lock folder), else None."""
    if not path.endswith(".lock"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, 200)
    except OSError:
        return None
    finally:
        os.close(fd)
    m = _HOLDER_LINE.fullmatch(data)
    if m is None:
        return None
    pid = int(m.group(1))
    return None if pid == os.getpid() else pid


def _judge(places: list[_Place], found: list[tuple[str, str]], children: Sequence[Child]) -> list[dict[str, str]]:
    """Each file seen: ``ours`` yes, no or unknown, and why (the module's docstring has the rules)."""
    me = os.geteuid()
    free = [c for c in children if not c[3]]       # children that could write outside the root
    boxed = len(children) - len(free)
    itself = "hermetic itself writes only inside the root and the lock folder"
    none_ran = ("every child of hermetic ran in the sandbox, where this path was read-only" if boxed else
                "no child of hermetic ran") + f"; {itself}"
    out: list[dict[str, str]] = []
    pending: list[tuple[dict[str, str], float, Child]] = []
    lockers: set[str] = set()   # another hermetic's lock files: lock folders are shared on purpose
    for path, change in sorted(found):
        rec = {"path": path, "change": change}
        out.append(rec)
        if not free:
            rec.update(ours="no", reason=none_ran)
            continue
        try:
            st = os.lstat(path)
        except OSError:
            rec.update(ours="unknown", reason="it is gone: nothing is left to tell who removed it, and a child of "
                                              "hermetic ran outside the sandbox meanwhile")
            continue
        if st.st_uid != me:
            rec.update(ours="no", reason=f"owned by uid {st.st_uid}; hermetic runs as uid {me}")
            continue
        other = _other_holder(path)
        if other is not None:
            rec.update(ours="no", reason=f"a lock file whose only words are the holder line of pid {other}, a "
                                         f"process other than this hermetic")
            lockers.add(path)
            continue
        when = st.st_ctime_ns / 1e9
        during = next((c for c in free if c[0] - SLACK_S <= when <= c[1] + SLACK_S), None)
        if during is None:
            rec.update(ours="no", reason=f"last changed at {_clock(when)}, when no child of hermetic ran outside the "
                                         f"sandbox ({itself})")
            continue
        pending.append((rec, when, during))
    if pending:
        holders = _holders({rec["path"] for rec, _w, _c in pending})
        for rec, _when, _child in pending:
            if rec["path"] in holders:
                pid, name = holders[rec["path"]]
                rec.update(ours="no", reason=f"held open by pid {pid} ({name}), which is neither this hermetic nor "
                                         f"a child of it")
    writers: dict[str, str] = {}   # place -> a file another writer changed there during the work
    for rec in out:
        if rec.get("ours") == "no" and free and rec["path"] not in lockers:
            writers.setdefault(_place_of(places, rec["path"]), rec["path"])
    for rec, when, child in pending:
        if "ours" in rec:
            continue
        place = _place_of(places, rec["path"])
        if place in writers:
            rec.update(ours="unknown", reason=f"changed at {_clock(when)}, while {child[2]} (a child of hermetic, "
                                              f"not in the sandbox) ran, but another process wrote in {place} "
                                              f"during the work too ({writers[place]})")
        else:
            rec.update(ours="yes", reason=f"changed by this user at {_clock(when)}, while {child[2]} (a child of "
                                          f"hermetic, not in the sandbox) ran; no other writer was seen in {place}")
    return out


def _place_of(places: list[_Place], path: str) -> str:
    best = ""
    for p in places:
        base = str(p.path)
        if (path == base or path.startswith(base.rstrip(os.sep) + os.sep)) and len(base) > len(best):
            best = base
    return best


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def _holders(paths: set[str]) -> dict[str, tuple[int, str]]:
    """Which of ``paths`` a live process other than this one and its children holds open: path -> (pid, name).
    A process that carries a child's mark (``procs.carries_mark``: a child's descendant, even one that left its
    session) is hermetic's own, whatever holds it open."""
    procs = sys.modules.get("hermetic.procs")
    found: dict[str, tuple[int, str]] = {}
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if pid == me or (procs is not None and procs.carries_mark(pid)):
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in paths and target not in found:
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        name = f.read().strip()
                except OSError:
                    name = "?"
                found[target] = (pid, name)
    return found


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
