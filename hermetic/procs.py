"""Child processes under limits, in their own process group, that never outlive hermetic.

Limits (CPU affinity, nice, an address-space limit) are applied by a tiny exec shim, so every compiler the
build starts inherits them and hermetic itself stays unlimited; no preexec_fn runs in a threaded parent.
The build dies with hermetic however hermetic ends: a reaper process in its own session waits on a pipe
from hermetic and kills the build's whole session when the pipe closes without the word "done" (kill -9
included).

A ``Confinement`` (``hermetic.sandbox`` makes one from bubblewrap) is a wrapper every child's command goes
through while it is in effect (``confined``): the sandbox starts first and the shim inside it, so the shim's
limits and its "cannot run" message are the same either way. A write the sandbox refused is recognized in the
child's output ("Read-only file system" naming a path this user could write outside it); a child that failed
after one is a ``SandboxRefused`` error naming the path, and one that carried on has it listed in
``Confinement.refused`` for the receipt. Every child's lifetime is kept in ``SPANS`` for the outside-root
audit (hermetic.audit), which asks whether a file outside the root appeared while a child ran.

Nothing a child starts outlives it: when the child (its session's leader) ends, what is left of its session
is killed, and so is every process that left the session (setsid, a double fork) but carries the child's mark
in its environment (``MARK_VARIABLE``); those are kept in ``ESCAPED`` for the audit. In the sandbox the pid
namespace (bubblewrap's ``--unshare-pid``) ends them with the child before that. A process that clears its
environment and leaves the session escapes the mark outside the sandbox; at hermetic's exit the marked ones
left are stopped too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic.errors import PreconditionFailed, SandboxRefused

_SHIM = r"""
import json, os, resource, sys
lim = json.loads(sys.argv[1])
if lim.get("gate") is not None:  # start nothing until hermetic says its reaper is in place
    go = os.read(lim["gate"], 1)
    os.close(lim["gate"])
    if go != b"1":
        sys.exit(125)  # hermetic died before it could start the reaper: nothing would ever stop this build
if lim.get("cpus"):
    os.sched_setaffinity(0, [c for c in lim["cpus"] if c in os.sched_getaffinity(0)] or lim["cpus"])
if lim.get("nice"):
    os.nice(lim["nice"])
if lim.get("address_space"):
    resource.setrlimit(resource.RLIMIT_AS, (lim["address_space"], lim["address_space"]))
if lim.get("no_unix_sockets"):  # a seccomp filter: socket(AF_UNIX, ...) and io_uring refused (EACCES), for good
    import ctypes, struct
    machine = os.uname().machine
    arch, nr_socket, nr_uring = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}[machine]
    KILL, DENY, ALLOW = 0x80000000, 0x00050000 | 13, 0x7FFF0000
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, KILL),          # 0-2: another ABI (i386): killed
            (0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, KILL),  # 3-5: x32's numbers: killed
            (0x15, 3, 0, nr_uring), (0x15, 0, 3, nr_socket),                # 6-7: io_uring_setup, socket
            (0x20, 0, 0, 16), (0x15, 0, 1, 1),                              # 8-9: its domain AF_UNIX?
            (0x06, 0, 0, DENY), (0x06, 0, 0, ALLOW)]                        # 10, 11
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *f) for f in prog))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Fprog(len(prog), ctypes.addressof(code))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0 or \
            libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        print(f"hermetic: cannot set the socket filter: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        sys.exit(126)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:  # said like a shell says it, not as a traceback of this shim
    print(f"hermetic: cannot run {sys.argv[2]}: {e.strerror}", file=sys.stderr)
    sys.exit(127)
"""

# ninja starts each command in a process group of its own, so the build is found by its session (the
# child is a session leader): every process whose session id is the leader's pid belongs to it.
_SESSION_KILL = r"""
def kill_session(sid):
    import os, signal
    for _ in range(50):
        found = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # a zombie is dead already (the leader stays one)
                found = True
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not found:
            return
"""

_REAPER = _SESSION_KILL + r"""
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.stdin.buffer.read() != b"done":
    kill_session(int(sys.argv[1]))
"""
_scope: dict[str, object] = {}
exec(_SESSION_KILL, _scope)  # one definition, used here and inside the reaper


CANNOT_RUN = "hermetic: cannot run "  # what the shim says when the program cannot be started (exit 127)


def exec_failure(rc: int, tail: list[str]) -> str | None:
    """Why the program itself never started ("cannot run X: No such file or directory"), else None."""
    if rc == 127 and tail and tail[-1].startswith(CANNOT_RUN):
        return tail[-1].removeprefix("hermetic: ")
    return None


class TimedOut(Exception):
    """A child ran past its time limit; its whole session was stopped."""

    def __init__(self, argv: Sequence[str], seconds: float, tail: list[str]) -> None:
        super().__init__(f"{argv[0]} ran longer than {seconds:g} s and was stopped")
        self.seconds, self.tail = seconds, tail


@dataclass(frozen=True)
class Limits:
    cpus: tuple[int, ...] | None = None
    nice: int = 0
    address_space: int | None = None


@dataclass(frozen=True)
class Refusal:
    """A write the sandbox refused: the path, the program that tried, the line it said."""
    path: str
    program: str
    line: str


@dataclass
class Confinement:
    """A wrapper every child's command goes through (``prefix``: ``bwrap ... --``), the places its children
    may write, and the writes it refused so far (a child that carried on after one)."""
    prefix: tuple[str, ...]
    writable: tuple[str, ...]
    refused: list[Refusal] = field(default_factory=list)
    read_only: tuple[str, ...] = ()     # inside ``writable``, bound read-only over it (the root's records)
    no_unix_sockets: bool = False       # a seccomp filter refuses socket(AF_UNIX) (an ssh-agent, a D-Bus) and io_uring
    homes: tuple[tuple[str, str], ...] = ()   # (the root's home, the children's own): their environment moved there
    temps: tuple[tuple[str, str], ...] = ()   # (the root's tmp/, the children's own): TMPDIR and the like moved there

    def moved(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with every folder in the root's home moved into the children's own (``homes``), and a variable
        naming the root's tmp/ itself (TMPDIR, TMP, TEMP: where a compiler writes its intermediate files) naming
        theirs (``temps``); a folder below tmp/ (a scratch folder hermetic made for this child) stays."""
        out = dict(env)
        for key, value in env.items():
            for home, box in self.homes:
                if value == home or value.startswith(home + "/"):
                    out[key] = box + value[len(home):]
                    break
            else:
                for tmp, own in self.temps:
                    if value.rstrip("/") == tmp:
                        out[key] = own
                        break
        return out


def confined_env(env: dict[str, str]) -> dict[str, str]:
    """The environment a child started now gets: ``env``, moved into the confinement's home if one is in effect."""
    confinement = _CONFINEMENT[0]
    return env if confinement is None else confinement.moved(env)


@dataclass(frozen=True)
class Span:
    """One child's lifetime, wall clock (``time.time()``, as file times are): the audit compares with it."""
    start: float
    end: float
    program: str
    confined: bool


SPANS: list[Span] = []          # every child this process started, in the order they ended
# called as each child ends, with its command line, seconds and exit status (None: stopped): -vv's debug lines
WATCHERS: list[Callable[[Sequence[str], float, int | None], None]] = []
_CONFINEMENT: list[Confinement | None] = [None]
MAX_REFUSALS = 50               # kept per confinement; the first ones say enough

# Every child carries a mark in its environment (``MARK_VARIABLE``: this hermetic's ``MARK``, then the child's
# number), and so does everything it starts unless it clears its environment: a process that left its child's
# session (setsid, a double fork, a daemon a compiler starts) is found by its mark (``escaped``) when the child
# ends, stopped, and kept in ``ESCAPED`` for the audit. In the sandbox none can outlive its child: bubblewrap
# gives the child a pid namespace of its own, whose processes all die when its first one ends.
MARK_VARIABLE = "HERMETIC_CHILD_OF"
MARK = f"{os.getpid()}-{os.urandom(6).hex()}"
_RUNNING: set[int] = set()      # the session leaders of the children running now (their sessions are theirs)
_RUNNING_LOCK = threading.Lock()  # held while a child starts and while /proc is searched: a child just started
                                  # is never taken for an escaped one
_SEQ = [0]


@dataclass(frozen=True)
class Escaped:
    """A process a child of hermetic left running outside the child's session (found by its mark), stopped at
    ``stopped`` (``time.time()``); ``left_by``: the program of the child that started it."""
    pid: int
    program: str
    command: str
    left_by: str = ""
    stopped: float = 0.0

    def record(self) -> dict[str, object]:
        return {"pid": self.pid, "program": self.program, "command": self.command, "left_by": self.left_by,
                "stopped_at": round(self.stopped, 3)}


ESCAPED: list[Escaped] = []     # every process found outliving its child this run, in the order found


def carries_mark(pid: int, mark: str = MARK) -> bool:
    """Whether process ``pid`` carries ``mark`` (this hermetic's, or one child's) in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    wanted = f"{MARK_VARIABLE}={mark}".encode()
    return any(v == wanted or v.startswith(wanted + b".") for v in env)


def escaped(mark: str = MARK) -> list[Escaped]:
    """The live processes that carry ``mark`` (a child's, or by default every child's of this hermetic) and
    belong to no child running now: each left its child's session (setsid, a double fork) and outlived it."""
    me = os.getpid()
    found: list[Escaped] = []
    with _RUNNING_LOCK:
        running = set(_RUNNING)
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return found
        for pid in pids:
            if pid == me or not carries_mark(pid, mark):
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if fields[0] == b"Z" or int(fields[3]) in running:
                    continue   # a zombie is no process any more; a running child's session is its own
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                with open(f"/proc/{pid}/comm", "rb") as f:
                    name = f.read().decode(errors="replace").strip()
            except (OSError, ValueError, IndexError):
                continue   # gone meanwhile, or not ours to read
            found.append(Escaped(pid, name, b" ".join(a for a in argv if a).decode(errors="replace")[:300]))
    return found


def stop_escaped(mark: str = MARK, left_by: str = "") -> list[Escaped]:
    """SIGKILL every process ``escaped(mark)`` finds (nothing may outlive its child), again until none is left
    (one may fork meanwhile); each is added to ``ESCAPED`` and returned."""
    stopped: list[Escaped] = []
    for _ in range(20):
        found = escaped(mark)
        if not found:
            break
        for e in found:
            try:
                os.kill(e.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            stopped.append(Escaped(e.pid, e.program, e.command, left_by, time.time()))
        time.sleep(0.01)
    ESCAPED.extend(stopped)
    return stopped


def _stop_escaped_at_exit() -> None:
    stop_escaped(left_by="a child of hermetic (found at its exit)")


_AT_EXIT: list[bool] = []


@contextlib.contextmanager
def confined(confinement: Confinement | None) -> Iterator[Confinement | None]:
    """Every child started inside the block goes through ``confinement`` (None: no wrapper)."""
    before = _CONFINEMENT[0]
    _CONFINEMENT[0] = confinement
    try:
        yield confinement
    finally:
        _CONFINEMENT[0] = before


# what a refused write says: "Read-only file system" (EROFS: the sandbox's binds are read-only, and the kernel
# says EROFS before it checks permissions, for root and other users alike), with the path quoted or bare
# somewhere on the line (Python, coreutils, the shell, gcc and ld all name it). "Permission denied" is not
# the sandbox's word: it would take a program that is not executable for a refused write.
_REFUSED_WORDS = ("Read-only file system",)
_PATH = re.compile(r"""'(/[^'\\]*)'|"(/[^"\\]*)"|(?<![\w.~/-])(/[^\s:'"(),;\\]+)""")
# Python's form names the path right after the words: it wins over any path named before them on the line (a
# record printed whole, JSON-escaped, names its own files first: 41 N4 named capture.py for a kernel-cache write)
_AFTER = re.compile(r"""\s*:\s*(?:'(/[^'\\]*)'|"(/[^"\\]*)"|(/[^\s:'"(),;\\]+))""")


def refused_write(line: str, writable: Sequence[str], read_only: Sequence[str] = ()) -> str | None:
    """The path of a write the sandbox refused, if ``line`` reports one: the path named nearest before the
    words (``sh: cannot create /tmp/x: Read-only file system``), else the first after them (Python's
    ``[Errno 30] Read-only file system: '/tmp/x'``), outside the writable places, that this user could write
    outside the sandbox (so the refusal is the sandbox's, not the file's own permissions or a file system that
    is read-only anyway); or inside one of the ``read_only`` places bound over them (the root's records)."""
    at = max(line.rfind(w) for w in _REFUSED_WORDS)
    if at < 0:
        return None
    found = [(m.start(), os.path.normpath(next(g for g in m.groups() if g))) for m in _PATH.finditer(line)]
    ordered = [p for s, p in reversed(found) if s < at] + [p for s, p in found if s > at]
    right = _AFTER.match(line, at + len(next(w for w in _REFUSED_WORDS if line.startswith(w, at))))
    if right is not None and any(right.groups()):
        ordered.insert(0, os.path.normpath(next(g for g in right.groups() if g)))
    before = [st for st, _p in found if st < at]
    if before and line[:at].endswith(": ") and line[before[-1]] == "/":
        # bash's and dash's form names the path bare, right before ": Read-only ...": a name with a space in it
        # runs up to there (`sh: 1: cannot create /x/sp ace: Read-only file system`)
        whole = line[before[-1]:at - 2]
        if not any(q in whole for q in "'\""):
            ordered.insert(0 if right is None else 1, os.path.normpath(whole))
    def under(path: str, places: Sequence[str]) -> bool:
        return any(path == w or path.startswith(w.rstrip(os.sep) + os.sep) for w in places)
    for path in ordered:
        if under(path, read_only) and _writable_here(path):
            return path
        if under(path, writable):
            continue
        if _writable_here(path):
            return path
    return None


def _writable_here(path: str) -> bool:
    """Whether this user, outside the sandbox, could write ``path`` (or create it in its nearest folder)."""
    probe = path
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    if os.path.isdir(probe) and probe != path:
        return os.access(probe, os.W_OK | os.X_OK)
    return os.access(probe, os.W_OK)


def _sandbox_failed(rc: int, first: str | None, confinement: Confinement | None) -> PreconditionFailed | None:
    """bubblewrap could not set the sandbox up (it says so first, as "bwrap: ...", and exits 1)."""
    if confinement is None or rc == 0 or first is None or not first.startswith("bwrap: "):
        return None
    return PreconditionFailed(
        f"the sandbox could not be set up: {first}", where=confinement.prefix[0],
        hint="run with --sandbox off (or HERMETIC_SANDBOX=off) to build without it (the outside-root audit then "
             "judges what appears outside the root); the answer that bubblewrap works here is cached in the root's "
             "state/sandbox-v1: delete that folder to ask again (a no is asked again anyway)")


MAX_LINE = 8 << 20     # bytes of a child's output taken as one line at most (a capture's record is one line)
TAIL_LINE = 4000       # characters of a line kept for the tail an error quotes


def tail_line(line: str) -> str:
    """``line`` as a tail keeps it: TAIL_LINE characters at most (a flood of long lines costs bounded memory)."""
    return line if len(line) <= TAIL_LINE else line[:TAIL_LINE] + " ..."


def run_limited(argv: Sequence[str], *, cwd: str, env: dict[str, str], limits: Limits,
                on_line: Callable[[str], None],
                on_start: Callable[[int], None] | None = None,
                timeout: float | None = None, writable_too: Sequence[str] = (),
                read_only_too: Sequence[str] = (), no_unix_sockets: bool = False) -> tuple[int, list[str]]:
    """Run ``argv`` in a new process group under ``limits`` (inside the confinement in effect, if any); stream
    its output lines; return (rc, tail). ``writable_too``: folders this one child may write although the
    confinement binds them read-only (``patch`` in an entry's staging folder under the store); ``read_only_too``:
    files no child of this one may write although they lie in a writable folder (ninja's build.ninja);
    ``no_unix_sockets``: in the confinement, this child gets its seccomp filter too (the import check).

    ``on_start`` gets the pid of the group's leader (the limited child) once it runs, e.g. for a memory guard.
    Past ``timeout`` seconds the whole session is stopped and ``TimedOut`` raised. A child that failed after
    the sandbox refused it a write raises ``SandboxRefused`` naming the path.
    """
    # The child waits at a gate (a pipe) until its reaper runs: a kill -9 between the two starts (no signal
    # mask stops SIGKILL) closes the gate's write end, and the child exits without running anything.
    confinement = _CONFINEMENT[0]
    env = confined_env(env)
    if not _AT_EXIT:   # whatever escaped a child and is still there when hermetic exits is stopped then
        import atexit
        atexit.register(_stop_escaped_at_exit)
        _AT_EXIT.append(True)
    _SEQ[0] += 1
    mark = f"{MARK}.{_SEQ[0]}"
    env = {**env, MARK_VARIABLE: mark}
    gate_r, gate_w = os.pipe()
    wrapper: tuple[str, ...] = ()
    if confinement is not None:
        extra = [a for w in writable_too for a in ("--bind", w, w)] + \
            [a for r in read_only_too for a in ("--ro-bind", r, r)]
        wrapper = (*confinement.prefix[:-1], *extra, confinement.prefix[-1])
    # -I: hermetic's own helpers (this shim, the compile wrappers) ignore PYTHON* variables, so they read the
    # standard library's bytecode from the system's read-only caches, never from a PYTHONPYCACHEPREFIX a child
    # could have filled (a planted json .pyc changed a later rebuild's command: the re-attack's B2), and never
    # import from the current folder, a build folder a child writes (a planted json.py did the same)
    shim = [*wrapper, sys.executable, "-I", "-S", "-c", _SHIM,
            json.dumps({"cpus": list(limits.cpus or ()), "nice": limits.nice,
                        "address_space": limits.address_space, "gate": gate_r,
                        "no_unix_sockets": confinement is not None and (confinement.no_unix_sockets
                                                                        or no_unix_sockets)}), *argv]
    program = os.path.basename(argv[0])
    refused: list[Refusal] = []
    first: str | None = None
    began = time.time()
    # no signal may land between starting the build and starting its reaper
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        try:
            with _RUNNING_LOCK:   # a search for escaped processes never sees this child before it is known
                proc = subprocess.Popen(shim, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(gate_r,))
                _RUNNING.add(proc.pid)
        finally:
            os.close(gate_r)
        try:
            reaper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(proc.pid)], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      env={"PATH": "/usr/bin:/bin"})
            try:
                os.write(gate_w, b"1")
            except BrokenPipeError:
                pass  # the child is gone before its gate (a sandbox that could not start): its status says why
        finally:
            os.close(gate_w)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    tail: list[str] = []
    finished = False
    # the limit stops the session from a timer thread: the output of the stopped child ends, the loop with it
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill_group(proc.pid)
    timer = None if timeout is None else threading.Timer(timeout, expire)
    # when the child ends, whatever it left in its session (a process sent to the background) ends with it,
    # and a process that left the session but holds the output open is stopped: the command never waits on it
    read_all = threading.Event()
    waiter = threading.Thread(target=_end_of_child, args=(proc.pid, mark, program, read_all), name="child-end",
                              daemon=True)
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        if on_start is not None:
            on_start(proc.pid)
        waiter.start()
        assert proc.stdout is not None
        while raw := proc.stdout.readline(MAX_LINE):   # a line without end (a flood) comes in bounded pieces
            line = raw.decode(errors="replace").rstrip("\n")
            if confinement is not None and len(refused) < MAX_REFUSALS:
                path = refused_write(line, confinement.writable, confinement.read_only)
                if path is not None:
                    refused.append(Refusal(path, program, line[-300:]))
            if first is None:
                first = line  # where the sandbox could not start, it says why first
            tail.append(tail_line(line))
            del tail[:-400]
            on_line(line)
        read_all.set()
        waiter.join()   # the leader has ended and its session is stopped: only now may its pid be reaped
        rc = proc.wait()
        finished = True
    finally:
        read_all.set()
        SPANS.append(Span(began, time.time(), program, confinement is not None))
        for watch in WATCHERS:
            watch(argv, SPANS[-1].end - began, proc.returncode)
        if timer is not None:
            timer.cancel()
            timer.join()
        if not finished:  # interrupted: stop the whole group now, not when the reaper notices
            _kill_group(proc.pid)
            if waiter.ident is not None:   # started: it ends once the leader has (its pid kept until then)
                waiter.join()
            proc.wait()
        with _RUNNING_LOCK:
            _RUNNING.discard(proc.pid)
        assert reaper.stdin is not None
        try:
            reaper.stdin.write(b"done" if finished else b"")
            reaper.stdin.close()
        except BrokenPipeError:
            pass
        reaper.wait()
    if expired.is_set():
        raise TimedOut(argv, timeout or 0, tail)
    failed = _sandbox_failed(rc, first, confinement)
    if failed is not None:
        raise failed
    if refused and confinement is not None:
        confinement.refused.extend(refused[:MAX_REFUSALS - len(confinement.refused)])
        if rc != 0:
            raise _refusal_error(refused[0], confinement, rc)
    return rc, tail


HOLD_S = 2.0   # how long the output may stay open once the child and its session have ended


def _end_of_child(pid: int, mark: str, program: str, read_all: threading.Event) -> None:
    """Wait for the child (the session's leader) to end, leaving it unreaped, so that its pid, the session's id,
    cannot be taken by another process; stop what is left of its session and every process it started that left
    the session (``stop_escaped``: kept in ``ESCAPED``); if its output is still held open after ``HOLD_S``, look
    once more."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        return
    kill_session(pid)
    stop_escaped(mark, program)
    if not read_all.wait(HOLD_S):
        stop_escaped(mark, program)


def _refusal_error(r: Refusal, confinement: Confinement, rc: int) -> SandboxRefused:
    """The error of a child that failed after its output named a write the sandbox refuses. The path is the
    child's own words (``refused_write`` checks that the sandbox refuses writes there, not that one was tried:
    a hostile package can print such a line, the attack on issue 41's follow-up): said as what it said, and the
    way out of the sandbox only for tools one trusts."""
    places = " and ".join(confinement.writable)
    said = f"It said: {r.line.strip()}"
    record = next((p for p in confinement.read_only
                   if r.path == p or r.path.startswith(p.rstrip(os.sep) + os.sep)), None)
    if record is not None:
        return SandboxRefused(
            f"{r.program} failed (exit {rc}) after it said a write to {r.path} was refused: {record} holds records "
            f"which only hermetic itself writes, read-only to every child. {said}", where=r.path,
            hint="hermetic's children may write in their own build folder, tmp/ and their home, never the store, "
                 "profiles, gc roots, receipts, state or runs/ (docs/layout.md#what-a-child-may-write); a package that "
                 "does is not one to build here")
    return SandboxRefused(
        f"{r.program} failed (exit {rc}) after it said a write to {r.path} was refused: that is outside the "
        f"scratch root, where the sandbox lets no child write. {said}", where=r.path,
        hint=f"hermetic's children may write only in {places}: point the tool at $HOME, $TMPDIR or its cache "
             f"variable (hermetic sets them inside the root). The path is the child's own words (any package can "
             f"print such a line): turn the sandbox off (--sandbox off, HERMETIC_SANDBOX=off) only for a build "
             f"whose every tool you trust")


def _kill_group(sid: int) -> None:
    """Stop the build: ask ninja to stop its commands, then kill whatever is left of its session."""
    try:
        os.kill(sid, signal.SIGTERM)
        time.sleep(0.5)
    except ProcessLookupError:
        pass
    kill = _scope["kill_session"]
    assert callable(kill)
    kill(sid)


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session ``sid`` (a child started by ``run_limited`` leads its own)."""
    kill = _scope["kill_session"]
    assert callable(kill)
    kill(sid)


RESULT_MARK = "hermetic-probe-result: "

# What Python says when a .pyc it reads is cut short or damaged: importlib checks a .pyc's header, not its body,
# and a body that does not load fails the import (it never falls back to the source). A disk that filled while
# Python wrote a .pyc leaves one cut short: importlib's _write_atomic ignores a short write.
DAMAGED_BYTECODE = ("marshal data too short", "bad marshal data")
BYTECODE_CLEARED: list[str] = []   # the bytecode caches cleared this process, for the command to say so

# Put first in a probe's code: .pyc files it writes from then on are written whole or not at all (a short
# write on a full disk is an error, which importlib then ignores, instead of a .pyc cut short).
# Put first in a probe that cannot run with -I (it needs its environment, or must start Python 2 to name it):
# -c put the current folder, one a child may write, first on sys.path (a json.py planted there was imported).
NO_CWD_IMPORTS = "import sys\nsys.path[:] = [p for p in sys.path if p]\n"
PYC_GUARD = NO_CWD_IMPORTS + r"""
def _hermetic_pyc_guard():
    import importlib._bootstrap_external as be, os
    def _write_atomic(path, data, mode=0o666):
        tmp = "{}.{}".format(path, id(path))
        fd = os.open(tmp, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode & 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
        except OSError:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    be._write_atomic = _write_atomic
_hermetic_pyc_guard()
del _hermetic_pyc_guard
"""


def damaged_bytecode(output: str, env: dict[str, str]) -> str | None:
    """The bytecode cache (``PYTHONPYCACHEPREFIX``) a child that failed with ``output`` found damaged, or None."""
    prefix = confined_env(env).get("PYTHONPYCACHEPREFIX")   # the cache the child used
    if prefix and any(mark in output for mark in DAMAGED_BYTECODE):
        return prefix
    return None


def clear_bytecode(prefix: str) -> None:
    """Remove a damaged bytecode cache (derived: Python writes it again as it imports) and note it."""
    from hermetic import fs
    fs.remove_aside(Path(prefix))
    BYTECODE_CLEARED.append(prefix)


def run_probe(argv: list[str], *, env: dict[str, str], cwd: str, on_start: Callable[[int], None] | None = None,
              heal_bytecode: bool = True, no_unix_sockets: bool = False) -> tuple[dict[str, Any] | None, str]:
    """Run a Python probe like a compiler: in a session of its own that dies with hermetic, even with kill -9
    (procs.run_limited; ``on_start`` as there). Its result is the JSON after RESULT_MARK; stdout and stderr
    arrive merged. Returns (result, or None when it failed; its other output). A probe that failed on a
    damaged bytecode cache runs once more after the cache is cleared (``heal_bytecode``)."""
    found: list[str] = []   # the result line whole (the tail keeps lines cut short)

    def result_line(line: str) -> None:
        if line.startswith(RESULT_MARK):
            found[:] = [line]
    rc, tail = run_limited(argv, cwd=cwd, env=env, limits=Limits(), on_line=result_line, on_start=on_start,
                           no_unix_sockets=no_unix_sockets)
    text = "\n".join(line for line in tail if not line.startswith(RESULT_MARK))
    if rc != 0 or not found:
        prefix = damaged_bytecode(text, env) if heal_bytecode else None
        if prefix is not None:
            clear_bytecode(prefix)
            return run_probe(argv, env=env, cwd=cwd, on_start=on_start, heal_bytecode=False,
                             no_unix_sockets=no_unix_sockets)
        return None, text
    result: dict[str, Any] = json.loads(found[-1][len(RESULT_MARK):])
    return result, text


class BackgroundProbe:
    """``run_probe`` in a thread of its own, for an answer wanted later (``join``) or never (``cancel``).
    ``cancel`` stops the probe at any moment: one whose process has not started yet is killed the moment it
    starts, so nobody waits for an answer no one wants (an ``import torch`` takes seconds)."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str, name: str,
                 heal_bytecode: bool = True, no_unix_sockets: bool = False) -> None:
        self.argv, self.env, self.cwd, self.name = argv, env, cwd, name
        self.heal_bytecode, self.no_unix_sockets = heal_bytecode, no_unix_sockets
        self.seconds: float | None = None   # how long the probe took, once it ended
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._cancelled = False
        self._result: tuple[dict[str, Any] | None, str] = (None, "")
        self._error: BaseException | None = None

    def start(self) -> None:
        def probe() -> None:
            began = time.monotonic()
            try:
                if not self._cancelled:
                    self._result = run_probe(self.argv, env=self.env, cwd=self.cwd, on_start=self._started,
                                             heal_bytecode=self.heal_bytecode,
                                             no_unix_sockets=self.no_unix_sockets)
            except BaseException as e:  # raised where the answer is asked for
                self._error = e
            self.seconds = round(time.monotonic() - began, 4)
        self._thread = threading.Thread(target=probe, name=self.name, daemon=True)
        self._thread.start()

    def _started(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            if self._cancelled:
                kill_session(pid)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until the probe has ended."""
        if self._thread is not None:
            self._thread.join()

    def join(self, timeout: float | None = None) -> tuple[dict[str, Any] | None, str]:
        """The probe's (result, other output), waiting for it (past ``timeout`` seconds: stopped, and
        ``TimedOut`` raised); what it raised is raised here."""
        if self._thread is not None and timeout is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.cancel()
                raise TimedOut(self.argv, timeout, [])
        self.wait()
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        """Stop the probe now, wherever it is, and wait for its thread (which then ends at once)."""
        with self._lock:
            self._cancelled = True
            if self._pid is not None:
                kill_session(self._pid)
        self.wait()
