"""The whole-transfer deadline of one transfer from its request to its last byte, enforced from outside the reads.

While a ``Watchdog``'s block runs, every connection its thread sends a request on is watched (``fetch.watched``'s
connections report themselves, ``current_watchdog``), and once the transfer falls below its floor (fewer than
``floor`` bytes a second on average after ``grace`` seconds, the limits of ``fetch.session.TransferLimits``) a
monitor thread shuts the connection down. So a server that sends its response headers a byte at a time, which
no per-read timeout and no check between body pieces can stop, holds nothing past the deadline either; what the
transfer then raises is turned into TooSlow by ``fetch.session.stopped``. Standard library only: the session's
module imports this one at its top.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Protocol

TICK_S = 0.2     # how often the monitor looks: the deadline holds to about this


class Limits(Protocol):
    @property
    def floor(self) -> int: ...

    @property
    def grace(self) -> float: ...


class Watchdog:
    """One transfer's deadline (``with Watchdog(limits, what) as w:`` around its request and its body)."""

    def __init__(self, limits: Limits, what: str) -> None:
        self.limits, self.what = limits, what
        self.started = time.monotonic()
        self.done = 0                  # bytes moved so far (body received, or body sent)
        self.answered = False          # the response's headers arrived
        self.fired = False
        self._connections: list[Any] = []
        self._lock = threading.Lock()
        self._open = False
        self._outer: Watchdog | None = None

    def __enter__(self) -> Watchdog:
        self._outer = getattr(_CURRENT, "watchdog", None)
        _CURRENT.watchdog = self
        with self._lock:
            self._open = True
        _monitor(self, add=True)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._open = False
            self._connections.clear()
        _monitor(self, add=False)
        _CURRENT.watchdog = self._outer

    def overdue(self, now: float) -> bool:
        late = now - self.started - self.limits.grace
        return late > 0 and self.done < self.limits.floor * late

    def watch(self, connection: Any) -> None:
        """A connection this transfer's request goes out on (called by the connection itself)."""
        with self._lock:
            if self._open:
                self._connections.append(connection)

    def fire(self) -> None:
        """Past the deadline: shut the transfer's connections down, so that the read waiting on them ends now."""
        with self._lock:
            if not self._open or self.fired:
                return
            self.fired = True
            connections = list(self._connections)
        for c in connections:
            sock = getattr(c, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


_CURRENT = threading.local()     # the watchdog of the transfer this thread runs, if any
_ACTIVE: set[Watchdog] = set()
_ACTIVE_LOCK = threading.Lock()
_MONITOR: list[threading.Thread] = []


def current_watchdog() -> Watchdog | None:
    """The watchdog of the transfer this thread is in."""
    found: Watchdog | None = getattr(_CURRENT, "watchdog", None)
    return found


def _monitor(w: Watchdog, *, add: bool) -> None:
    """Add or remove a watchdog; one daemon thread looks at every open one while any is open."""
    with _ACTIVE_LOCK:
        if not add:
            _ACTIVE.discard(w)
            return
        _ACTIVE.add(w)
        if not _MONITOR:
            t = threading.Thread(target=_watch_all, name="transfer-watchdog", daemon=True)
            _MONITOR.append(t)
            t.start()


def _watch_all() -> None:
    while True:
        time.sleep(TICK_S)
        with _ACTIVE_LOCK:
            if not _ACTIVE:
                _MONITOR.clear()
                return
            watched = list(_ACTIVE)
        now = time.monotonic()
        for w in watched:
            if w.overdue(now):
                w.fire()
