"""What the user sees: listings and other data on stdout, human progress and logs on stderr; with ``--json``
every record (events and the result) is a JSON line on stdout.

``-q`` (``quiet``) keeps only warnings, errors and data; ``-v`` (``verbose``) adds ``detail`` records (one line
per object of a build, where each wheel came from). ``data`` is what a command was asked to print (``show``'s
listing, ``gc``'s entries, ``--explain``, a dry run's plan): on stdout whatever the level.

Every long step reports through a ``Reporter``; nothing else in the package prints. On a terminal the
progress is one live display per command (one rich ``Progress``, whatever number of bars it shows at once):
a bar per running task, lines printed above it; a task that closes is finished, stopped and taken off the
display, leaving one line that says what it did, so each phase is seen once. Waiting (for a lock) is a row
of its own that says what it waits for, how long it has waited and how long it may still, and moves. With
``--json`` or without a terminal it is plain records, one per event.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import IO, Any, Protocol

RESULT_VERSION = 1
PLAIN_EVERY = 2.0   # seconds between plain progress records of one task
WAIT_EVERY = 10.0   # and between plain "still waiting" lines


class ProgressTask(Protocol):
    def advance(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class WaitTask(Protocol):
    def update(self, waited: float, detail: str = "") -> None: ...

    def close(self, message: str = "") -> None: ...


class Reporter:
    """Collects events; renders them for a person (stderr) or a program (stdout JSON Lines)."""

    def __init__(self, *, json_mode: bool = False, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None, quiet: bool = False, verbose: bool = False) -> None:
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.quiet = quiet
        self.verbose = verbose and not quiet
        self.interactive = (not json_mode) and self.stderr.isatty()
        self._display: _Display | None = None

    # events -----------------------------------------------------------------
    def event(self, kind: str, message: str = "", /, **fields: Any) -> None:
        """One step of progress: a line on stderr for people, a record on stdout with --json."""
        if self.json_mode:
            self._emit({**fields, "event": kind, **({"message": message} if message else {})})
        elif message and not self.quiet:
            self._say(message)

    def detail(self, kind: str, message: str = "", /, **fields: Any) -> None:
        """More than progress, for ``-v`` only (a line per object, where a wheel came from): an event then."""
        if self.verbose:
            self.event(kind, message, **fields)

    def data(self, kind: str, text: str = "", /, **fields: Any) -> None:
        """What the command was asked to print: a record with --json (an event, as any other), else the text on
        stdout, quiet or not (``hermetic show | cat`` prints the listing)."""
        if self.json_mode:
            self._emit({**fields, "event": kind, **({"message": text} if text else {})})
        elif text:
            print(text, file=self.stdout, flush=True)

    def warn(self, message: str, /, **fields: Any) -> None:
        if self.json_mode:
            self._emit({"event": "warning", "message": message, **fields})
        self._say(f"warning: {message}")

    def result(self, command: str, ok: bool, exit_code: int, **fields: Any) -> None:
        """The one closing record of a command (versioned)."""
        if self.json_mode:
            self._emit({"result": command, "version": RESULT_VERSION, "ok": ok,
                        "exit_code": exit_code, **fields})

    def _emit(self, record: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        self.stdout.flush()

    def _say(self, line: str) -> None:
        if self._display is not None and self._display.running:
            self._display.say(line)  # above the live display, which redraws below it
        else:
            print(line, file=self.stderr, flush=True)

    # progress ---------------------------------------------------------------
    def task(self, label: str, total: int | None, unit: str = "items", *, closing_line: bool = True
             ) -> ProgressTask:
        """A bar (or plain records) for one phase; ``closing_line``: say what it did when it closes (off
        where an event already says so, as a fetch's ``fetched ...``)."""
        if self.interactive and not self.quiet:
            return self._live().add(label, total, unit, closing_line)
        return _PlainTask(self, label, total, unit, closing_line)

    def wait(self, label: str, timeout: float | None, detail: str = "") -> WaitTask:
        """A wait of up to ``timeout`` seconds (None: no limit), updated by its owner as it goes."""
        if self.interactive and not self.quiet:
            return self._live().add_wait(label, timeout, detail)
        return _PlainWait(self, label, timeout)

    def close(self) -> None:
        """The end of the command: the live display stops (whatever is still on it stays as it was drawn)."""
        if self._display is not None:
            self._display.stop()

    def _live(self) -> _Display:
        if self._display is None:
            self._display = _Display(self.stderr)
        return self._display


# without a terminal ----------------------------------------------------------------------------------------
class _PlainTask:
    """Progress without a terminal: a start record, a record at most every 2 s, and an end record."""

    def __init__(self, reporter: Reporter, label: str, total: int | None, unit: str, closing_line: bool) -> None:
        self.reporter, self.label, self.total, self.unit = reporter, label, total, unit
        self.closing_line = closing_line
        self.done = 0
        self.started = self.last = time.monotonic()
        reporter.event("progress", "", label=label, done=0, total=total, unit=unit)

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PLAIN_EVERY:
            self.last = now
            self.reporter.event("progress", f"{self.label}: {_amount(self.done, self.total, self.unit)}",
                                label=self.label, done=self.done, total=self.total, unit=self.unit)

    def close(self) -> None:
        seconds = time.monotonic() - self.started
        self.reporter.event("progress", _closing(self.label, self.done, self.total, self.unit, seconds)
                            if self.closing_line else "", label=self.label, done=self.done, total=self.total,
                            unit=self.unit, seconds=round(seconds, 3))


class _PlainWait:
    """A wait without a terminal: a line (and record) every 10 s, with the time waited and left."""

    def __init__(self, reporter: Reporter, label: str, timeout: float | None) -> None:
        self.reporter, self.label, self.timeout = reporter, label, timeout
        self.last = time.monotonic()

    def update(self, waited: float, detail: str = "") -> None:
        now = time.monotonic()
        if now - self.last < WAIT_EVERY:
            return
        self.last = now
        self.reporter.event("waiting", f"still {self.label}{f' ({detail})' if detail else ''}: "
                                       f"{_waited(waited, self.timeout)}", label=self.label, detail=detail,
                            waited_s=round(waited, 1), left_s=_left(waited, self.timeout))

    def close(self, message: str = "") -> None:
        if message:
            self.reporter.event("waited", message, label=self.label)


# on a terminal: one rich Progress for the whole command -----------------------------------------------------
class _Display:
    """The command's one live display. It runs while it shows a row and stops when the last one closes (so
    nothing is redrawn while hermetic does not report), and starts again for the next."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column
        try:  # the terminal we draw on, not whichever of stdin and stdout happens to be one
            width: int | None = os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            width = None
        self.console = Console(file=stream, width=width)
        one_line = Column(no_wrap=True, overflow="ellipsis")  # a row is one line: a long label is cut, not wrapped
        # no redirection: stdout carries data (`hermetic env`), it must never be routed into the display
        self.progress = Progress(TextColumn("{task.description}", table_column=one_line), BarColumn(),
                                 _amount_column(), TimeElapsedColumn(), console=self.console, transient=True,
                                 redirect_stdout=False, redirect_stderr=False, refresh_per_second=4)
        self.lock = threading.Lock()
        self.rows = 0
        self.running = False

    def add(self, label: str, total: int | None, unit: str, closing_line: bool) -> _RichTask:
        return _RichTask(self, self._add_row(label, total=total, unit=unit), label, total, unit, closing_line)

    def add_wait(self, label: str, timeout: float | None, detail: str) -> _RichWait:
        row = self._add_row(_wait_label(label, detail), total=timeout, unit="seconds")
        return _RichWait(self, row, label)

    def _add_row(self, description: str, **fields: Any) -> Any:
        with self.lock:
            if not self.running:
                self.progress.start()
                self.running = True
            self.rows += 1
            return self.progress.add_task(description, total=fields.pop("total"), **fields)

    def remove(self, row: Any, line: str) -> None:
        with self.lock:
            self.progress.stop_task(row)
            self.progress.remove_task(row)
            if line:
                self.say(line)
            self.rows -= 1
            if self.rows == 0:
                self.stop()

    def say(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        if self.running:
            self.progress.stop()
            self.running = False


class _RichTask:
    def __init__(self, display: _Display, row: Any, label: str, total: int | None, unit: str,
                 closing_line: bool) -> None:
        self.display, self.row, self.label, self.total, self.unit = display, row, label, total, unit
        self.closing_line = closing_line
        self.done = 0
        self.started = time.monotonic()
        self.closed = False

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.display.progress.advance(self.row, n)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.total is None:  # finished: a bar without a total ends full
            self.display.progress.update(self.row, total=self.done, completed=self.done)
        self.display.remove(self.row, _closing(self.label, self.done, self.total, self.unit,
                                               time.monotonic() - self.started) if self.closing_line else "")


class _RichWait:
    def __init__(self, display: _Display, row: Any, label: str) -> None:
        self.display, self.row, self.label = display, row, label
        self.closed = False

    def update(self, waited: float, detail: str = "") -> None:
        self.display.progress.update(self.row, completed=waited, description=_wait_label(self.label, detail))

    def close(self, message: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.display.remove(self.row, message)


def _amount_column() -> Any:
    """How far a row is, in its own unit: bytes and speed, items done of total, or seconds waited and left
    (a rich column, made on first use: a command that shows no progress never imports rich)."""
    from rich.progress import ProgressColumn
    from rich.table import Column
    from rich.text import Text

    class AmountColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            unit = task.fields.get("unit", "items")
            if unit == "seconds":
                return Text(_waited(task.completed, task.total))
            amount = _amount(int(task.completed), int(task.total) if task.total is not None else None, unit)
            if unit == "bytes" and task.speed:
                amount += f" {_fmt(int(task.speed), 'bytes')}/s"
            return Text(amount)

    return AmountColumn(table_column=Column(no_wrap=True))


# words ------------------------------------------------------------------------------------------------------
def _wait_label(label: str, detail: str) -> str:
    return f"{label} ({detail})" if detail else label


def _left(waited: float, timeout: float | None) -> float | None:
    return None if timeout is None else round(max(timeout - waited, 0.0), 1)


def _waited(waited: float, timeout: float | None) -> str:
    # whole seconds, waited rounded down and left up: the two always add up to the limit
    left = None if timeout is None else math.ceil(max(timeout - waited, 0.0))
    return f"{math.floor(waited)} s waited" + (f", {left} s left" if left is not None else ", no limit")


def _amount(done: int, total: int | None, unit: str) -> str:
    return _fmt(done, unit) + (f" of {_fmt(total, unit)}" if total else "")


def _closing(label: str, done: int, total: int | None, unit: str, seconds: float) -> str:
    state = "done" if total is None or done >= total else "stopped"
    return f"{label}: {state}, {_amount(done, total, unit)} in {seconds:.1f} s"


def _fmt(n: int | None, unit: str) -> str:
    if n is None:
        return "?"
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or suffix == "GiB":
                return f"{n:.0f} {suffix}" if suffix == "B" else f"{n:.1f} {suffix}"
            n /= 1024  # type: ignore[assignment]
    return f"{n} {unit}"
