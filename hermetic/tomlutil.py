"""Strict TOML reading: tomllib's data plus the line of every key, so errors can point at the file and line.

tomllib returns plain dicts and forgets positions. ``TomlDoc.where`` recovers them with a small scanner over
the text that was already parsed successfully, so the scanner may assume valid TOML and only has to follow
its structure (headers, arrays of tables, dotted keys, inline tables and arrays, strings).
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hermetic import fs
from hermetic.errors import BadInput, path_error

KeyPath = tuple[str | int, ...]
T = TypeVar("T")

_TYPE_NAMES: dict[type, str] = {
    str: "a string", int: "an integer", float: "a float", bool: "a boolean", list: "an array",
    dict: "a table", dt.datetime: "a date-time", dt.date: "a date", dt.time: "a time",
}


def key_text(key_path: Iterable[str | int]) -> str:
    """``packages[2].wheels[0].url``: the spelling users see in messages."""
    out = ""
    for k in key_path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


@dataclass
class TomlDoc:
    path: Path
    text: str
    data: dict[str, Any]
    _lines: dict[KeyPath, int] | None = field(default=None, repr=False)

    def line_of(self, *key_path: str | int) -> int | None:
        """The line of the deepest key along ``key_path`` the scanner found (None: not even the first)."""
        if self._lines is None:
            self._lines = _scan_lines(self.text)
        for end in range(len(key_path), 0, -1):
            line = self._lines.get(tuple(key_path[:end]))
            if line is not None:
                return line
        return None

    def where(self, *key_path: str | int) -> str:
        """``path:LINE: key a.b.c`` for messages; ``path: key a.b.c`` when no line is known."""
        line = self.line_of(*key_path)
        loc = f"{self.path}:{line}" if line is not None else str(self.path)
        return f"{loc}: key {key_text(key_path)}" if key_path else loc


INPUT_LIMIT = 64 << 20   # a recipe, lock, runner or hermetic.toml larger than this is no hand-written input


def read_input(path: Path, what: str = "file") -> bytes:
    """The bytes of an input file (a link to one is followed); a missing or unreadable one, a FIFO, a device or
    a folder (never opened for reading: a FIFO would block) or one past ``INPUT_LIMIT`` is bad input, not a crash
    or a hang."""
    try:
        return fs.read_regular(path, INPUT_LIMIT, follow=True)
    except ValueError:
        raise BadInput(f"{what} {path} holds more than {INPUT_LIMIT >> 20} MiB: not a file hermetic reads",
                       where=str(path), hint="name the file itself") from None
    except fs.NotRegularFile as e:
        raise BadInput(f"{what} {path} is {e.strerror}", where=str(path),
                       hint="name a regular file") from None
    except FileNotFoundError:
        raise BadInput(f"{what} not found: {path}", where=str(path),
                       hint="check the path (relative paths are taken from the referring file's folder "
                            "or the current directory)") from None
    except OSError as e:
        raise path_error(e, doing=f"cannot read the {what}") or BadInput(
            f"cannot read {what} {path}: {e.strerror or e}", where=str(path),
            hint="check that it is a readable file") from None


def load_toml(path: Path) -> TomlDoc:
    return parse_toml(path, read_input(path))


def decode_utf8(path: Path, raw: bytes, what: str, *, bom: bool = False) -> str:
    """The text of an input file; invalid UTF-8 is bad input at the line where it occurs."""
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise BadInput(f"{what} is not valid UTF-8 (byte {e.start})", where=f"{path}:{line}",
                       hint="re-save the file as UTF-8") from None


def parse_toml(path: Path, raw: bytes) -> TomlDoc:
    """Parse bytes already read (callers that hash the file parse exactly the bytes they hashed)."""
    text = decode_utf8(path, raw, "TOML file")
    try:
        data = tomllib.loads(text)
    except RecursionError:   # tomllib recurses per nesting level: thousands of [[[ ... ]]] exhaust the stack
        raise BadInput("invalid TOML: arrays or tables nested too deeply", where=str(path),
                       hint="no recipe or setting nests more than a few levels") from None
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
        if m:
            where, what = f"{path}:{m.group(1)}", msg[: m.start()]
            hint = f"fix the TOML syntax at line {m.group(1)}, column {m.group(2)}"
        else:
            line = text.count("\n") + (0 if text.endswith("\n") else 1)
            where, what = f"{path}:{max(line, 1)}", re.sub(r"\s*\(at end of document\)$", "", msg)
            hint = "the file ends in the middle of a value: close the open string, array or table"
        raise BadInput(f"invalid TOML: {what}", where=where, hint=hint) from None
    return TomlDoc(path, text, data)


def type_name(value: object) -> str:
    for typ in (bool, dt.datetime, dt.date, dt.time, str, int, float, list, dict):
        if isinstance(value, typ):
            return _TYPE_NAMES[typ]
    return type(value).__name__


def expect_type(doc: TomlDoc, value: object, typ: type[T], key_path: KeyPath) -> T:
    """``value`` if it is a ``typ`` (a bool is not an integer, a date-time is not a date), else BadInput.

    TOML has no null, so ``None`` (from ``table.get(key)``) means the key is missing.
    """
    if value is None:
        place = f"[{key_text(key_path[:-1])}]" if len(key_path) > 1 else "the top level"
        raise BadInput(f"missing required key {key_text(key_path[-1:])!r} in {place}",
                       where=doc.where(*key_path), hint=f"add {key_text(key_path[-1:])} = ... to {place}")
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)) \
            and not (typ is dt.date and isinstance(value, dt.datetime)):
        return value
    expected = _TYPE_NAMES.get(typ, typ.__name__)
    raise BadInput(f"{key_text(key_path)} must be {expected}, found {type_name(value)} {value!r:.60}",
                   where=doc.where(*key_path), hint=f"write {key_text(key_path)} as {expected}")


def check_keys(doc: TomlDoc, table: dict[str, Any], allowed: set[str], key_path: KeyPath) -> None:
    """Unknown keys are errors: a typo must not silently change what gets installed."""
    for key in table:
        if key not in allowed:
            place = f"in [{key_text(key_path)}]" if key_path else "at the top level"
            raise BadInput(f"unknown key {key!r} {place}", where=doc.where(*key_path, key),
                           hint=f"allowed keys here: {', '.join(sorted(allowed))}")


def get_key(doc: TomlDoc, table: dict[str, Any], key: str, typ: type[T], key_path: KeyPath,
            *, required: bool = False) -> T | None:
    """``table[key]`` checked against ``typ``; a missing required key is an error naming the table."""
    if key not in table and not required:
        return None
    return expect_type(doc, table.get(key), typ, (*key_path, key))


# --- the line scanner ------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_STRING = re.compile(r'"""(?:[^\\]|\\.)*?"""(?!")|\'\'\'.*?\'\'\'(?!\')|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'',
                     re.DOTALL)
_SCALAR = re.compile(r"[^,\]}#\n]+")  # numbers, booleans, dates: only their extent matters


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line = text, 0, 1
        self.lines: dict[KeyPath, int] = {}
        self.aot: dict[KeyPath, int] = {}  # array-of-tables path -> index of its latest element

    def peek(self) -> str:
        return self.text[self.pos: self.pos + 1]

    def skip(self, newlines: bool) -> None:
        """Skip blanks and comments (and newlines when inside an array, where they are insignificant)."""
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif c == "\n" and newlines:
                self.line += 1
                self.pos += 1
            elif c in " \t\r":
                self.pos += 1
            else:
                return

    def string(self) -> str:
        m = _STRING.match(self.text, self.pos)
        if m is None:
            raise ValueError("unterminated string")
        self.pos = m.end()
        self.line += m.group().count("\n")
        body = m.group()
        quote = 3 if body[:3] in ('"""', "'''") else 1
        inner = body[quote:-quote]
        # A quoted key only matters for matching key names, and escapes in key names are rare enough that
        # the raw text is a good-enough name for a best-effort line lookup.
        return inner

    def key(self) -> list[str]:
        parts = []
        while True:
            self.skip(newlines=False)
            if self.peek() in ('"', "'"):
                parts.append(self.string())
            else:
                m = _BARE_KEY.match(self.text, self.pos)
                if m is None:
                    raise ValueError("expected a key")
                parts.append(m.group())
                self.pos = m.end()
            self.skip(newlines=False)
            if self.peek() != ".":
                return parts
            self.pos += 1

    def resolve(self, parts: list[str]) -> KeyPath:
        """Map a header's dotted name to concrete indexes: ``packages.wheels`` -> ``packages[3].wheels``."""
        path: KeyPath = ()
        for p in parts:
            path = (*path, p)
            if path in self.aot:
                path = (*path, self.aot[path])
        return path

    def value(self, path: KeyPath) -> None:
        self.skip(newlines=False)
        c = self.peek()
        if c == "[":
            self.pos += 1
            index = 0
            while True:
                self.skip(newlines=True)
                if self.peek() == "]":
                    self.pos += 1
                    return
                self.lines.setdefault((*path, index), self.line)
                self.value((*path, index))
                self.skip(newlines=True)
                if self.peek() == ",":
                    self.pos += 1
                    index += 1
        elif c == "{":
            self.pos += 1
            while True:
                self.skip(newlines=False)
                if self.peek() == "}":
                    self.pos += 1
                    return
                self.assignment(path)
                self.skip(newlines=False)
                if self.peek() == ",":
                    self.pos += 1
        elif c in ('"', "'"):
            self.string()
        else:
            m = _SCALAR.match(self.text, self.pos)
            if m is None or m.end() == self.pos:
                raise ValueError("expected a value")
            self.pos = m.end()

    def assignment(self, table: KeyPath) -> None:
        line = self.line
        path = (*table, *self.key())
        self.skip(newlines=False)
        if self.peek() != "=":
            raise ValueError("expected '='")
        self.pos += 1
        for end in range(len(table) + 1, len(path) + 1):
            self.lines.setdefault(path[:end], line)
        self.value(path)

    def run(self) -> dict[KeyPath, int]:
        table: KeyPath = ()
        while True:
            self.skip(newlines=True)
            if self.pos >= len(self.text):
                return self.lines
            if self.text.startswith("[[", self.pos):
                self.pos += 2
                parts = self.key()
                prefix = self.resolve(parts[:-1])
                aot_path = (*prefix, parts[-1])
                self.aot[aot_path] = self.aot.get(aot_path, -1) + 1
                table = (*aot_path, self.aot[aot_path])
                self.lines.setdefault(aot_path, self.line)
                self.pos = self.text.index("]]", self.pos) + 2
            elif self.peek() == "[":
                self.pos += 1
                table = self.resolve(self.key())
                self.pos = self.text.index("]", self.pos) + 1
            else:
                self.assignment(table)
                continue
            self.lines.setdefault(table, self.line)


def _scan_lines(text: str) -> dict[KeyPath, int]:
    scanner = _Scanner(text)
    try:
        return scanner.run()
    except (ValueError, IndexError):
        # Line numbers are a courtesy: keep what was found rather than lose the real error being reported.
        return scanner.lines


_CPU_ITEM = re.compile(r"\s*([0-9]+)(?:\s*-\s*([0-9]+))?\s*")
MAX_CPUS = 4096


def cpu_list(doc: TomlDoc, text: str, kp: KeyPath) -> tuple[int, ...]:
    """A ``cpus`` list, as Linux writes a cpuset (docs/recipes.md): items ``N`` or ``N-M`` (M not below N), comma
    separated, none empty; at most 4096 CPUs. Anything else is exit 2 naming the item."""
    hint = 'CPU numbers and ranges N-M, comma separated: for example cpus = "0-7" or "0,2,4"'
    cpus: set[int] = set()
    for item in text.split(","):
        m = _CPU_ITEM.fullmatch(item)
        if m is None:
            raise BadInput(f"cpus {text!r}: {item.strip()!r} is not a CPU number or a range N-M", where=doc.where(*kp),
                           hint=hint)
        first = int(m.group(1))
        last = first if m.group(2) is None else int(m.group(2))
        if last < first:
            raise BadInput(f"cpus {text!r}: the range {first}-{last} runs backwards", where=doc.where(*kp),
                           hint=f"write it {last}-{first}")
        if last - first >= MAX_CPUS:  # checked before the range is built: "0-99999999999" is no CPU list
            raise BadInput(f"cpus {text!r} names more than {MAX_CPUS} CPUs", where=doc.where(*kp), hint='cpus = "0-7"')
        cpus.update(range(first, last + 1))
        if len(cpus) > MAX_CPUS:
            raise BadInput(f"cpus {text!r} names more than {MAX_CPUS} CPUs", where=doc.where(*kp), hint='cpus = "0-7"')
    return tuple(sorted(cpus))


def size_bytes(doc: TomlDoc, text: str, kp: KeyPath) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise BadInput(f"{text!r} is not a size", where=doc.where(*kp), hint='for example "16G" or "512M"')
    value = float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())
    if value < 64 << 20:
        raise BadInput(f"{text!r} is below 64 MiB: no compiler runs in that", where=doc.where(*kp),
                       hint="give compilers at least a few GiB")
    if value > 1 << 50:
        raise BadInput(f"{text!r} is above 1 PiB: no machine has that to limit", where=doc.where(*kp),
                       hint='for example "64G"; leave the key out for no limit')
    return int(value)


SANDBOX_MODES = ("auto", "required", "off")  # hermetic.sandbox: where bubblewrap works, must, or never


def sandbox_mode(doc: TomlDoc, table: dict[str, Any], kp: KeyPath) -> str | None:
    """``sandbox = "auto" | "required" | "off"`` (a recipe's [limits], a runner's [cpu] and [gpu]), or None."""
    value = get_key(doc, table, "sandbox", str, kp)
    if value is not None and value not in SANDBOX_MODES:
        raise BadInput(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, found {value!r}",
                       where=doc.where(*kp, "sandbox"),
                       hint='auto: the sandbox where bubblewrap works; required: exit 3 where it does not; off: never')
    return value


def strings(doc: TomlDoc, table: dict[str, Any], key: str, kp: KeyPath) -> list[str]:
    values = expect_type(doc, table.get(key, []), list, (*kp, key))
    return [expect_type(doc, v, str, (*kp, key, i)) for i, v in enumerate(values)]


def inside_repo(doc: TomlDoc, folder: Path, text: str, kp: KeyPath) -> Path:
    """A path relative to the recipe, which must stay inside the recipe's repository."""
    try:
        p = fs.resolve(folder / text)
    except OSError as e:
        raise path_error(e, doing=doc.where(*kp)) or e from None
    top = repo_top(folder)
    if not p.is_relative_to(top):
        raise BadInput(f"{text} leaves the repository ({top})", where=doc.where(*kp),
                       hint="keep recipe inputs inside the repository the recipe lives in")
    return p


def repo_top(folder: Path) -> Path:
    here = folder.resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return here.parent


def repo_file(doc: TomlDoc, folder: Path, value: object, key: KeyPath) -> Path:
    text = expect_type(doc, value, str, key)
    p = inside_repo(doc, folder, text, key)
    if not p.is_file():
        raise BadInput(f"file {text} does not exist (looked at {p})", where=doc.where(*key),
                       hint="paths are relative to the recipe's folder")
    return p
