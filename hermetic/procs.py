"""Child processes under limits, in their own process group, that never outlive hermetic.

Limits (CPU affinity, nice, an address-space limit) are applied by a tiny exec shim, so every compiler the
build starts inherits them and hermetic itself stays unlimited; no preexec_fn runs in a threaded parent.
The build dies with hermetic however hermetic ends: a reaper process in its own session waits on a pipe
from hermetic and kills the build's whole session when the pipe closes without the word "done" (kill -9
included).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
            if int(fields[3]) == sid:
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


def run_limited(argv: Sequence[str], *, cwd: str, env: dict[str, str], limits: Limits,
                on_line: Callable[[str], None],
                on_start: Callable[[int], None] | None = None,
                timeout: float | None = None) -> tuple[int, list[str]]:
    """Run ``argv`` in a new process group under ``limits``; stream its output lines; return (rc, tail).

    ``on_start`` gets the pid of the group's leader (the limited child) once it runs, e.g. for a memory guard.
    Past ``timeout`` seconds the whole session is stopped and ``TimedOut`` raised.
    """
    # The child waits at a gate (a pipe) until its reaper runs: a kill -9 between the two starts (no signal
    # mask stops SIGKILL) closes the gate's write end, and the child exits without running anything.
    gate_r, gate_w = os.pipe()
    shim = [sys.executable, "-S", "-c", _SHIM,
            json.dumps({"cpus": list(limits.cpus or ()), "nice": limits.nice,
                        "address_space": limits.address_space, "gate": gate_r}), *argv]
    # no signal may land between starting the build and starting its reaper
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        try:
            proc = subprocess.Popen(shim, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(gate_r,))
        finally:
            os.close(gate_r)
        try:
            reaper = subprocess.Popen([sys.executable, "-S", "-c", _REAPER, str(proc.pid)], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      env={"PATH": "/usr/bin:/bin"})
            os.write(gate_w, b"1")
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
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        if on_start is not None:
            on_start(proc.pid)
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            del tail[:-400]
            on_line(line)
        rc = proc.wait()
        finished = True
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        if not finished:  # interrupted: stop the whole group now, not when the reaper notices
            _kill_group(proc.pid)
            proc.wait()
        assert reaper.stdin is not None
        try:
            reaper.stdin.write(b"done" if finished else b"")
            reaper.stdin.close()
        except BrokenPipeError:
            pass
        reaper.wait()
    if expired.is_set():
        raise TimedOut(argv, timeout or 0, tail)
    return rc, tail


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


def run_probe(argv: list[str], *, env: dict[str, str], cwd: str) -> tuple[dict[str, Any] | None, str]:
    """Run a Python probe like a compiler: in a session of its own that dies with hermetic, even with kill -9
    (procs.run_limited). Its result is the JSON after RESULT_MARK; stdout and stderr arrive merged.
    Returns (result, or None when it failed; its other output)."""
    from hermetic.procs import Limits, run_limited
    rc, tail = run_limited(argv, cwd=cwd, env=env, limits=Limits(), on_line=lambda _line: None)
    found = [line for line in tail if line.startswith(RESULT_MARK)]
    text = "\n".join(line for line in tail if not line.startswith(RESULT_MARK))
    if rc != 0 or not found:
        return None, text
    result: dict[str, Any] = json.loads(found[-1][len(RESULT_MARK):])
    return result, text
