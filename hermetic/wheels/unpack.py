"""Unpack a wheel into the store's blobs through the installer library.

installer supplies the scheme mapping, the entry points and its path-traversal guard; the destination
below writes each file's bytes as a blob instead of a file, and records (path, blob, executable bit). What
would name an interpreter is recorded, not written, so an unpacked entry is for any interpreter: the entry
points (``wheels.scripts`` writes their launchers when a tree is laid out for one), and which files of the
scheme's ``scripts`` start with ``#!python`` (kept as the wheel has them; ``wheels.scripts`` writes the
interpreter's shebang over that line in the tree, as installer would have done with an interpreter).
Files of ``scripts`` are executable, as pip makes them.
"""

from __future__ import annotations

import base64
import os
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.records import Hash, RecordEntry
from installer.sources import WheelFile
from installer.utils import Scheme

from hermetic.errors import BadInput
from hermetic.store import STORE_FORMAT, Staging, blob_ref
from hermetic.store.records import EntryPoint, FileMap
from hermetic.store.trees import check_relpath
from hermetic.wheels.scripts import PYTHON_SHEBANG, check_script

if TYPE_CHECKING:
    from installer.scripts import ScriptSection

_VBASE = "/hermetic-target"
# A decompression bomb stops here, before a byte is inflated: the zip's declared sizes bound what zipfile
# will ever return. The largest real wheels (torch with CUDA) unpack to a few GiB.
MAX_WHEEL_BYTES = 16 << 30
MAX_WHEEL_FILES = 500_000


def unpack_wheel(staging: Staging, wheel_path: Path, wheel_sha256: str, *, where: str) -> None:
    """Validate a wheel's RECORD, then unpack it into blobs through installer, recording them in ``staging``."""
    dest = _BlobDestination(staging)
    try:
        _check_members(wheel_path, where)
        with WheelFile.open(wheel_path) as source:
            source.validate_record(validate_contents=True)
            install(source, dest, {"INSTALLER": b"hermetic\n"})
    except (InstallerError, ValueError, zipfile.BadZipFile, KeyError, zlib.error, EOFError) as e:
        raise BadInput(f"wheel {wheel_path.name} is invalid: {_installer_message(e)}", where=where,
                       hint="the wheel is damaged or hostile; check the lock's hash and the index") from None
    staging.commit_blobs()  # only a wheel unpacked whole puts anything in the store
    staging.record = {"format": STORE_FORMAT, "name": staging.name, "kind": "unpacked", "wheel": wheel_sha256,
                      "filename": wheel_path.name, "files": dict(sorted(dest.files.items())),
                      "scripts": sorted(dest.scripts), "shebangs": sorted(dest.shebangs),
                      "refs": [blob_ref(wheel_sha256)]}


def _check_members(wheel_path: Path, where: str) -> None:
    """Refuse what installer would not notice: a bomb (declared sizes), symlink members (a wheel holds
    regular files; installer would write the link's target as a file's content)."""
    with zipfile.ZipFile(wheel_path) as zf:
        infos = zf.infolist()
    total = sum(i.file_size for i in infos)
    if total > MAX_WHEEL_BYTES or len(infos) > MAX_WHEEL_FILES:
        raise BadInput(f"wheel {wheel_path.name} unpacks to {total / (1 << 30):.1f} GiB in {len(infos)} files, "
                       f"more than {MAX_WHEEL_BYTES >> 30} GiB or {MAX_WHEEL_FILES} files", where=where,
                       hint="a decompression bomb? check the lock's hash and where the wheel comes from")
    links = [i.filename for i in infos if (i.external_attr >> 16) & 0o170000 == 0o120000]
    if links:
        raise BadInput(f"wheel {wheel_path.name} holds a symlink member: {links[0]!r}", where=where,
                       hint="a wheel holds regular files only; the wheel is damaged or hostile")


def _installer_message(e: Exception) -> str:
    issues = getattr(e, "issues", None)
    if issues:
        shown = "; ".join(str(i) for i in list(issues)[:3])
        return f"RECORD does not match the wheel's contents ({shown})"
    return str(e) or type(e).__name__


def _record_hash(digest: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()


class _BlobDestination(SchemeDictionaryDestination):
    """installer's own scheme mapping and path-traversal guard, with blobs for bytes."""

    def __init__(self, staging: Staging) -> None:
        super().__init__(
            scheme_dict={"purelib": _VBASE, "platlib": _VBASE, "headers": f"{_VBASE}/include",
                         "scripts": f"{_VBASE}/bin", "data": _VBASE},
            interpreter="", script_kind="posix")
        self.staging = staging  # the files' bytes wait in the entry's staging folder until the wheel is whole
        self.files: FileMap = {}
        self.scripts: list[EntryPoint] = []
        self.shebangs: list[str] = []   # files of ``scripts`` whose first line is ``#!python...``

    def write_file(self, scheme: Scheme, path: str | os.PathLike[str], stream: BinaryIO,
                   is_executable: bool) -> RecordEntry:
        """installer's, but a script's ``#!python`` line is kept (installer would write ``#!`` and the
        interpreter, which an unpacked entry does not have) and noted; scripts are executable."""
        if scheme != "scripts":
            return self.write_to_fs(scheme, os.fspath(path), stream, is_executable)
        stream.seek(0)
        python = stream.read(len(PYTHON_SHEBANG)) == PYTHON_SHEBANG  # installer's own test (fix_shebang)
        stream.seek(0)
        record = self.write_to_fs(scheme, os.fspath(path), stream, True)
        if python:
            self.shebangs.append(self._rel(scheme, os.fspath(path)))
        return record

    def _rel(self, scheme: Scheme, path: str) -> str:
        return self._path_with_destdir(scheme, path).relative_to(_VBASE).as_posix()

    def write_to_fs(self, scheme: Scheme, path: str, stream: BinaryIO, is_executable: bool) -> RecordEntry:
        rel = self._rel(scheme, path)  # raises ValueError outside the target
        check_relpath(rel)
        if rel in self.files:
            raise ValueError(f"the wheel writes {rel} twice")
        digest, size = self.staging.stage_blob(stream, is_executable)
        self.files[rel] = (digest, is_executable)
        return RecordEntry(path, Hash("sha256", _record_hash(digest)), size)

    def write_script(self, name: str, module: str, attr: str, section: ScriptSection) -> RecordEntry:
        check_script(name, module, attr, section)
        rel = f"bin/{name}"
        if rel in self.files or any(s[0] == name for s in self.scripts):
            raise ValueError(f"the wheel writes {rel} twice")
        self.scripts.append((name, module, attr, section))
        return RecordEntry(name, None, None)  # written for an interpreter when a tree is laid out
