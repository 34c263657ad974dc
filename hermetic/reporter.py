"""What the user sees: human progress on stderr, JSON Lines on stdout with ``--json``.

Every long step reports through a ``Reporter``; nothing else in the package prints. On a terminal the
progress is a rich bar; with ``--json`` or without a terminal it is plain records, one per event.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any, Protocol

RESULT_VERSION = 1


class ProgressTask(Protocol):
    def advance(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class Reporter:
    """Collects events; renders them for a person (stderr) or a program (stdout JSON Lines)."""

    def __init__(self, *, json_mode: bool = False, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None, quiet: bool = False) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.quiet = quiet
        self.interactive = (not json_mode) and self.stderr.isatty()

    # events -----------------------------------------------------------------
    def event(self, kind: str, message: str = "", /, **fields: Any) -> None:
        """One step of progress: a line on stderr for people, a record on stdout with --json."""
        if self.json_mode:
            self._emit({**fields, "event": kind, **({"message": message} if message else {})})
        elif message and not self.quiet:
            print(message, file=self.stderr, flush=True)

    def warn(self, message: str, /, **fields: Any) -> None:
        if self.json_mode:
            self._emit({"event": "warning", "message": message, **fields})
        print(f"warning: {message}", file=self.stderr, flush=True)

    def result(self, command: str, ok: bool, exit_code: int, **fields: Any) -> None:
        """The one closing record of a command (versioned)."""
        if self.json_mode:
            self._emit({"result": command, "version": RESULT_VERSION, "ok": ok,
                        "exit_code": exit_code, **fields})

    def _emit(self, record: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        self.stdout.flush()

    # progress ---------------------------------------------------------------
    def task(self, label: str, total: int | None, unit: str = "items") -> ProgressTask:
        if self.interactive and not self.quiet:
            return _RichTask(label, total, unit, self.stderr)
        return _PlainTask(self, label, total, unit)


class _PlainTask:
    """Progress without a terminal: a start record, a record at most every 2 s, and an end record."""

    def __init__(self, reporter: Reporter, label: str, total: int | None, unit: str) -> None:
        self.reporter, self.label, self.total, self.unit = reporter, label, total, unit
        self.done = 0
        self.started = self.last = time.monotonic()
        reporter.event("progress", "", label=label, done=0, total=total, unit=unit)

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= 2.0:
            self.last = now
            self.reporter.event("progress", f"{self.label}: {_fmt(self.done, self.unit)}"
                                + (f" of {_fmt(self.total, self.unit)}" if self.total else ""),
                                label=self.label, done=self.done, total=self.total, unit=self.unit)

    def close(self) -> None:
        self.reporter.event("progress", "", label=self.label, done=self.done, total=self.total,
                            unit=self.unit, seconds=round(time.monotonic() - self.started, 3))


class _RichTask:
    def __init__(self, label: str, total: int | None, unit: str, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )
        columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
        columns += ([DownloadColumn(), TransferSpeedColumn()] if unit == "bytes"
                    else [MofNCompleteColumn()])
        columns.append(TimeElapsedColumn())
        self.progress = Progress(*columns, console=Console(file=stream), transient=True)
        self.progress.start()
        self.task_id = self.progress.add_task(label, total=total)

    def advance(self, n: int = 1) -> None:
        self.progress.advance(self.task_id, n)

    def close(self) -> None:
        self.progress.stop()


def _fmt(n: int | None, unit: str) -> str:
    if n is None:
        return "?"
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or suffix == "GiB":
                return f"{n:.0f} {suffix}" if suffix == "B" else f"{n:.1f} {suffix}"
            n /= 1024  # type: ignore[assignment]
    return f"{n} {unit}"
