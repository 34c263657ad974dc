"""Launchers for one interpreter, written when a tree is laid out: the wheels' console and GUI scripts, and
``python``/``python3`` themselves.

An unpacked entry records its entry points only (``wheels.unpack``), so it serves every interpreter and an
export archive names none. The tree of an environment holds the launchers for its interpreter: their bytes
name it, so the tree's key includes it, and an environment realized for 3.13 runs 3.13 wherever its ``bin/``
is on PATH.
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
