"""What the user sees: listings and other data on stdout, human progress and logs on stderr; with ``--json``
every record (events and the result) is a JSON line on stdout.

``-q`` (``quiet``) keeps only warnings, errors and data, ``-qq`` errors and data only; ``-v`` (``verbose``) adds
``detail`` records (one line per object of a build, where each wheel came from), ``-vv`` ``debug`` records too
(each child's command line and time, each step's time). Colour (``--color``, ``NO_COLOR``, ``FORCE_COLOR``) and
bars (``--no-progress``) follow uv's rules (``use_color``): colour only on a terminal unless forced, bars only on
a terminal and never with ``--no-progress``, where progress is plain lines as without a terminal. ``data`` is
what a command was asked to print (``show``'s listing, ``gc``'s entries, ``--explain``, a dry run's plan): on
stdout whatever the level.

Every long step reports through a ``Reporter``; nothing else in the package prints. On a terminal the
progress is one live display per command (one rich ``Progress``, whatever number of bars it shows at once):
a bar per running task, lines printed above it; a task that closes is finished, stopped and taken off the
display, leaving one line that says what it did, so each phase is seen once. A task may say what it is doing
now (``doing``: the unit that compiles, "compiling the compiled kernel set (Inductor)") and since when: the
row shows it with the seconds counting, so a long step is never silent. Waiting (for a lock) is a row of its
own that says what it waits for, how long it has waited and how long it may still, and moves. With ``--json``
or without a terminal it is plain records, one per event. Counts read as English: "1 object", "1 of 2
objects" (``plural``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from typing import IO, Any, Protocol

RESULT_VERSION = 1
ERROR, WARNING = "1;31", "1;33"   # SGR: bold red, bold yellow (uv's)
PLAIN_EVERY = 2.0   # seconds between plain progress records of one task
WAIT_EVERY = 10.0   # and between plain "still waiting" lines
DOING_EVERY = 30.0  # and between plain lines saying the same thing is still being done


class ProgressTask(Protocol):
    def advance(self, n: int = 1) -> None: ...

    def doing(self, what: str, since: float | None = None) -> None:
        """What the task is doing now (``""``: nothing in particular), and since when (``time.monotonic()``)."""

    def close(self) -> None: ...


class WaitTask(Protocol):
    def update(self, waited: float, detail: str = "") -> None: ...

    def close(self, message: str = "") -> None: ...


class Reporter:
    """Collects events; renders them for a person (stderr) or a program (stdout JSON Lines)."""

    def __init__(self, *, json_mode: bool = False, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None, quiet: int = 0, verbose: int = 0, color: bool = False,
                 progress: bool = True) -> None:
        """``quiet``, ``verbose``: how many times -q and -v were given (a bool counts once)."""
        self.json_mode = json_mode
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.quiet = quiet >= 1
        self.silent = quiet >= 2            # -qq: errors only (and data, which is what was asked for)
        self.verbose = verbose >= 1 and not quiet
        self.debugging = verbose >= 2 and not quiet
        self.color = color
        self.interactive = progress and (not json_mode) and self.stderr.isatty()
        self._display: _Display | None = None
        self._lock = threading.Lock()  # a task may report from a thread of its own (extensions/graph.py's)

    # events -----------------------------------------------------------------
    def event(self, kind: str, message: str = "", /, **fields: Any) -> None:
        """One step of progress: a line on stderr for people, a record on stdout with --json."""
        if self.json_mode:
            self._emit({**fields, "event": kind, **({"message": message} if message else {})})
        elif message and not self.quiet:
            self._say(printable(message))

    def detail(self, kind: str, message: str = "", /, **fields: Any) -> None:
        """More than progress, for ``-v`` only (a line per object, where a wheel came from): an event then."""
        if self.verbose:
            self.event(kind, message, **fields)

    def debug(self, kind: str, message: str = "", /, **fields: Any) -> None:
        """The debug level, ``-vv`` only: each child's command line and time, each step's time."""
        if self.debugging:
            self.event(kind, f"debug: {message}" if message else "", **fields)

    def data(self, kind: str, text: str = "", /, **fields: Any) -> None:
        """What the command was asked to print: a record with --json (an event, as any other), else the text on
        stdout, quiet or not (``hermetic show | cat`` prints the listing)."""
        if self.json_mode:
            self._emit({**fields, "event": kind, **({"message": text} if text else {})})
        elif text:
            print(printable(text), file=self.stdout, flush=True)

    def warn(self, message: str, /, **fields: Any) -> None:
        if self.json_mode:
            self._emit({"event": "warning", "message": message, **fields})
        if not self.silent:
            self._say(self.paint("warning:", WARNING) + f" {printable(message)}")

    def error_text(self, rendered: str) -> str:
        """An error as ``HermeticError.render`` wrote it, its ``error:`` in colour where colour is on."""
        head, sep, rest = printable(rendered).partition(":")
        return self.paint(head + sep, ERROR) + rest if sep else rendered

    def paint(self, text: str, style: str) -> str:
        return f"\x1b[{style}m{text}\x1b[0m" if self.color else text

    def result(self, command: str, ok: bool, exit_code: int, **fields: Any) -> None:
        """The one closing record of a command (versioned)."""
        if self.json_mode:
            self._emit({"result": command, "version": RESULT_VERSION, "ok": ok,
                        "exit_code": exit_code, **fields})

    def _emit(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.stdout.write(json.dumps(record, sort_keys=True, default=str) + "\n")
            self.stdout.flush()

    def _say(self, line: str) -> None:
        if self._display is not None and self._display.running:
            self._display.say(line)  # above the live display, which redraws below it
        else:
            with self._lock:
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
            self._display = _Display(self.stderr, self.color)
        return self._display


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` for a terminal: every control character but newline and tab written as ``\\xNN``, so a value
    from a file (a repository's hermetic.toml, a recipe, a server's answer) cannot move the cursor, erase a line
    or recolour what hermetic says (JSON records carry the value as it is, escaped by JSON)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def use_color(choice: str, stream: IO[str], environ: Any = None) -> bool:
    """Whether to colour ``stream``, as uv decides: ``--color always``/``never`` win; under ``auto``, a
    non-empty ``NO_COLOR`` turns colour off, ``FORCE_COLOR`` or ``CLICOLOR_FORCE`` (not ``0``) on, else colour
    where the stream is a terminal that is not ``TERM=dumb``."""
    env = os.environ if environ is None else environ
    if choice in ("always", "never"):
        return choice == "always"
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR") or env.get("CLICOLOR_FORCE", "0") not in ("", "0"):
        return True
    try:
        return stream.isatty() and env.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


# without a terminal ----------------------------------------------------------------------------------------
class _PlainTask:
    """Progress without a terminal: a start record, a record at most every 2 s, and an end record."""

    def __init__(self, reporter: Reporter, label: str, total: int | None, unit: str, closing_line: bool) -> None:
        self.reporter, self.label, self.total, self.unit = reporter, label, total, unit
        self.closing_line = closing_line
        self.done = 0
        self.started = self.last = time.monotonic()
        self.what, self.said = "", 0.0
        reporter.event("progress", "", label=label, done=0, total=total, unit=unit)

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PLAIN_EVERY:
            self.last = now
            self.reporter.event("progress", f"{self.label}: {_amount(self.done, self.total, self.unit)}",
                                label=self.label, done=self.done, total=self.total, unit=self.unit)

    def doing(self, what: str, since: float | None = None) -> None:
        """A line when what is done changes, and every 30 s (at the next call) while it goes on."""
        now = time.monotonic()
        if not what or (what == self.what and now - self.said < DOING_EVERY):
            self.what = what
            return
        self.what, self.said = what, now
        seconds = None if since is None else now - since
        self.reporter.event("progress", f"{self.label}: {_doing(what, seconds)}", label=self.label, doing=what,
                            doing_s=None if seconds is None else round(seconds, 1), done=self.done,
                            total=self.total, unit=self.unit)

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

    def __init__(self, stream: IO[str], color: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TimeElapsedColumn
        try:  # the terminal we draw on, not whichever of stdin and stdout happens to be one
            width: int | None = os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            width = None
        self.console = Console(file=stream, width=width, no_color=not color, color_system="auto" if color else None)
        # no redirection: stdout carries data (`hermetic env`), it must never be routed into the display
        self.progress = Progress(_label_column(), BarColumn(), _amount_column(), TimeElapsedColumn(),
                                 console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False,
                                 refresh_per_second=4)
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

    def doing(self, what: str, since: float | None = None) -> None:
        self.display.progress.update(self.row, doing=what, doing_since=since)  # the row counts the seconds

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


def _label_column() -> Any:
    """The row's label, and what it is doing now with the seconds since it began (one line: a long row is cut,
    not wrapped)."""
    from rich.progress import ProgressColumn
    from rich.table import Column
    from rich.text import Text

    class LabelColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            what, since = task.fields.get("doing"), task.fields.get("doing_since")
            if not what:
                return Text(task.description)
            return Text(f"{task.description}: "
                        f"{_doing(what, None if since is None else time.monotonic() - since)}")

    return LabelColumn(table_column=Column(no_wrap=True, overflow="ellipsis"))


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
    if unit == "bytes":
        return _fmt(done, unit) + (f" of {_fmt(total, unit)}" if total else "")
    return f"{done} of {plural(total, unit)}" if total else plural(done, unit)


def _closing(label: str, done: int, total: int | None, unit: str, seconds: float) -> str:
    state = "done" if total is None or done >= total else "stopped"
    return f"{label}: {state}, {_amount(done, total, unit)} in {seconds:.1f} s"


def _doing(what: str, seconds: float | None) -> str:
    return what if seconds is None or seconds < 1 else f"{what}, {_duration(seconds)}"


def _duration(seconds: float) -> str:
    """``7 s``, ``2 min 05 s``: whole seconds, as a person reads a running clock."""
    s = max(int(seconds), 0)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def process_seconds() -> float | None:
    """How long this process has run, interpreter start-up included (its start time per /proc): what a
    command that returns at once took, as ``time`` would say."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def plural(n: int, noun: str) -> str:
    """``1 object``, ``2 objects``, ``0 objects``, ``1 kernel set``, ``1 mismatch``: ``noun`` named in its
    plural, as units are."""
    if n != 1:
        return f"{n} {noun}"
    head, _, word = noun.rpartition(" ")
    if word.endswith("ies"):
        word = word[:-3] + "y"
    elif word.endswith(("ches", "shes", "sses", "xes")):
        word = word[:-2]
    elif word.endswith("s"):
        word = word[:-1]
    return f"{n} {head} {word}" if head else f"{n} {word}"


def _fmt(n: int | None, unit: str) -> str:
    if n is None:
        return "?"
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB"):
            if n < 1024 or suffix == "GiB":
                return f"{n:.0f} {suffix}" if suffix == "B" else f"{n:.1f} {suffix}"
            n /= 1024  # type: ignore[assignment]
    return plural(n, unit)
