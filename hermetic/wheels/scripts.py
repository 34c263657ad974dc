"""Launchers for one interpreter, written when a tree is laid out: the wheels' console and GUI scripts,
their ``#!python`` scripts, and ``python``/``python3`` themselves.

An unpacked entry records its entry points and which of its scripts start with ``#!python`` (``wheels.unpack``),
so it serves every interpreter and an export archive names none. The tree of an environment holds the
launchers for its interpreter: their bytes name it, so the tree's key includes it, and an environment realized
for 3.13 runs 3.13 wherever its ``bin/`` is on PATH.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from installer.scripts import Script

from hermetic.errors import BadInput
from hermetic.store import Store
from hermetic.store.records import EntryPoint, FileMap

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
PYTHON_NAMES = ("python", "python3")
PYTHON_SHEBANG = b"#!python"   # a wheel's script for "the interpreter that installs it" (installer, pip)


def check_script(name: str, module: str, attr: str, section: str) -> None:
    """An entry point a launcher can be written for (a record may come from an imported archive)."""
    if not _NAME.fullmatch(name) or not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(attr) \
            or section not in ("console", "gui"):
        raise ValueError(f"bad entry point {name} = {module}:{attr} ({section})")


def launchers(store: Store, entry_points: Iterable[tuple[str, EntryPoint]], executable: str) -> FileMap:
    """``bin/`` launchers running ``executable``, as blobs: ``python``, ``python3`` and each entry point
    (labelled by the entry that declares it, for the message when two declare one name)."""
    files: FileMap = {}
    owner: dict[str, str] = {}
    wrapper = f"#!/bin/sh\nexec {shlex.quote(executable)} \"$@\"\n".encode()
    for name in PYTHON_NAMES:
        files[f"bin/{name}"] = (store.put_blob_bytes(wrapper, executable=True), True)
        owner[name] = "the environment's interpreter"
    for label, (name, module, attr, section) in entry_points:
        try:
            check_script(name, module, attr, section)
        except ValueError as e:
            raise BadInput(f"{label}: {e}", where=label, hint="run `hermetic verify --repair`") from None
        if name in owner:
            raise BadInput(f"{label} and {owner[name]} both provide bin/{name}",
                           hint="remove one of them from the lock")
        _, data = Script(name, module, attr, section).generate(executable, "posix")  # type: ignore[arg-type]
        files[f"bin/{name}"] = (store.put_blob_bytes(data, executable=True), True)
        owner[name] = label
    return files


def shebang(executable: str) -> bytes:
    """The first line(s) of a Python script run by ``executable``: installer's (distlib's) rule, a plain
    ``#!`` line when the kernel takes it (no space, at most 127 bytes), else through /bin/sh."""
    raw = executable.encode()
    if b" " not in raw and len(raw) + 3 <= 127:
        return b"#!" + raw + b"\n"
    return b"#!/bin/sh\n'''exec' " + shlex.quote(executable).encode() + b' "$0" "$@"\n' + b"' '''\n"


def with_shebangs(store: Store, label: str, files: FileMap, shebangs: Iterable[str], executable: str) -> FileMap:
    """``files`` of one unpacked entry with each ``#!python`` script's first line written for ``executable``,
    the rest of the file unchanged: what installer writes when it is given the interpreter."""
    out = dict(files)
    for rel in shebangs:
        spec = files.get(rel)
        try:
            data = store.blob_path(*spec).read_bytes() if spec is not None and rel.startswith("bin/") else b""
        except OSError:
            data = b""
        if not data.startswith(PYTHON_SHEBANG):
            raise BadInput(f"{label}: {rel} is not one of its #!python scripts", where=label,
                           hint="run `hermetic verify --repair`")
        rest = data.split(b"\n", 1)[1] if b"\n" in data else b""
        out[rel] = (store.put_blob_bytes(shebang(executable) + rest, executable=True), True)
    return out
