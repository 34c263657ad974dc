"""Build real wheels for tests: a zip with METADATA, WHEEL and a RECORD of sha256 hashes and sizes."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    name: str
    version: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return self.path.name


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(out_dir: Path, name: str, version: str, files: dict[str, bytes | str],
                *, tag: str = "py3-none-any", executables: frozenset[str] = frozenset(),
                entry_points: str | None = None, record_override: dict[str, str] | None = None,
                extra_members: dict[str, bytes] | None = None, requires: Sequence[str] = ()) -> BuiltWheel:
    """Write ``{name}-{version}-{tag}.whl`` holding ``files`` (paths relative to the wheel root).

    ``record_override`` replaces RECORD hash fields (to make a RECORD that lies); ``extra_members`` are
    written to the zip but not to RECORD (to make hostile wheels); ``requires`` become ``Requires-Dist``
    lines of METADATA (PEP 508 strings), so resolvers see a dependency.
    """
    dist = name.replace("-", "_")
    dist_info = f"{dist}-{version}.dist-info"
    members: dict[str, bytes] = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
    members[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    members[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: hermetic-tests\nRoot-Is-Purelib: "
        f"{'true' if tag.endswith('none-any') else 'false'}\nTag: {tag}\n").encode()
    if entry_points is not None:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    record_lines = []
    for path, data in members.items():
        h = (record_override or {}).get(path, _record_hash(data))
        record_lines.append(f"{path},{h},{len(data)}")
    record_lines.append(f"{dist_info}/RECORD,,")
    members[f"{dist_info}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for member, data in {**members, **(extra_members or {})}.items():
            info = zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if member in executables else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    data = path.read_bytes()
    return BuiltWheel(path, name, version, hashlib.sha256(data).hexdigest(), len(data))
