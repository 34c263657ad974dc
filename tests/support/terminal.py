"""A process's stderr on a real pseudo-terminal, and the screen a person would be left looking at.

``PtyReader`` opens a pty of a given size (the slave end is what a child or a Reporter writes to) and
collects everything written to it on a thread. ``screen`` replays those bytes the way a terminal does for
what rich's live display sends (text, CR, LF, cursor up/down/column, erase in line; colours and cursor
visibility ignored), so a test reads the final screen rather than the stream of redraws.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import termios
import threading
import time

CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]")


class PtyReader:
    def __init__(self, columns: int = 160, rows: int = 50) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer closed the slave
                return
            if not data:
                return
            self.chunks.append(data)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float, count: int = 1) -> list[str]:
        """Wait until ``pattern`` (a regex) has matched ``count`` distinct strings in what was written."""
        deadline = time.monotonic() + timeout
        while True:
            found = list(dict.fromkeys(m.group(0) for m in re.finditer(pattern, self.text)))
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def finish(self, timeout: float = 10) -> str:
        """Close our end of the slave and collect the rest; the screen as text."""
        os.close(self.slave)
        self.thread.join(timeout)
        os.close(self.master)
        return self.text


def screen(text: str) -> list[str]:
    """The lines a terminal shows after ``text`` (trailing blanks stripped, trailing empty lines dropped)."""
    lines: list[list[str]] = [[]]
    row = col = 0

    def put(ch: str) -> None:
        nonlocal col
        line = lines[row]
        line.extend(" " * (col - len(line) + 1))
        line[col] = ch
        col += 1

    pos = 0
    while pos < len(text):
        m = CSI.match(text, pos)
        if m:
            pos = m.end()
            args, op = m.group(1) or "", m.group(2) or ""
            n = int(args) if args.isdigit() else None
            if op == "A":
                row = max(row - (n or 1), 0)
            elif op == "B":
                row += n or 1
            elif op == "C":
                col += n or 1
            elif op == "D":
                col = max(col - (n or 1), 0)
            elif op == "G":
                col = (n or 1) - 1
            elif op == "K":
                line = lines[row]
                if n in (None, 0):
                    del line[col:]
                elif n == 1:
                    line[:col] = [" "] * min(col, len(line))
                else:
                    line.clear()
            while row >= len(lines):
                lines.append([])
            continue
        ch = text[pos]
        pos += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            while row >= len(lines):
                lines.append([])
        elif ch == "\b":
            col = max(col - 1, 0)
        elif ch >= " ":
            put(ch)
    out = ["".join(line).rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out
