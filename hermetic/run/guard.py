"""The resident-memory guard: the summed RSS of a process tree, watched; over the limit, the tree dies.

An address-space limit rejects CUDA's large virtual mappings, so GPU runs are guarded by what they really
hold: every ``interval`` seconds the resident set of the child and all its descendants is summed (psutil);
past ``limit`` the child's whole session is killed and the guard records what it saw.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil

from hermetic.procs import kill_session


class MemoryGuard:
    def __init__(self, limit: int, *, interval: float = 0.05) -> None:
        self.limit, self.interval = limit, interval
        self.peak = 0
        self.tripped: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int) -> None:
        """Start watching the session led by ``pid`` (called once the child runs)."""
        self._thread = threading.Thread(target=self._loop, args=(pid,), name="memory-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _tree_rss(self, proc: psutil.Process) -> tuple[int, int]:
        total, count = 0, 0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
                count += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total, count

    def _loop(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            try:
                rss, count = self._tree_rss(proc)
            except psutil.NoSuchProcess:
                return
            self.peak = max(self.peak, rss)
            if rss > self.limit:
                self.tripped = {"rss": rss, "limit": self.limit, "processes": count,
                                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                kill_session(pid)
                return
            self._stop.wait(self.interval)

    def record(self) -> dict[str, Any]:
        return {"limit": self.limit, "peak_rss": self.peak, "interval_s": self.interval,
                "tripped": self.tripped is not None, **({"stopped": self.tripped} if self.tripped else {})}
