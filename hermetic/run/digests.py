"""Reference digests: the batch-1 outputs of every state and depth, hashed, per device class (what changes
arithmetic), compared with ``manifests/digests/<class>.txt`` and recorded there on request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput


# digests ---------------------------------------------------------------------------------------------------
def device_class(kind: str, env: dict[str, Any]) -> str:
    """What changes arithmetic: the GPU architecture, or the CPU's instruction set and vendor (MKL and oneDNN
    dispatch by both: one AVX-512 class gave other bits on AMD than on Intel); torch; the thread count."""
    torch_v = str(env["torch"]).replace("+", "_")
    if kind == "gpu":
        return f"sm{env['capability'].replace('.', '')}-torch{torch_v}"
    return (f"cpu-{str(env['cpu_capability']).lower()}-{env.get('cpu_vendor', 'unknown')}-torch{torch_v}"
            f"-t{env['threads']}")


def check_digests(digests: dict[str, str], folder: Path, cls: str, *, record: bool, runner_name: str
                  ) -> dict[str, Any]:
    path = folder / f"{cls}.txt"
    if record:
        lines = [f"# hermetic run reference digests: runner {runner_name}, device class {cls}",
                 "# sha256 of the batch-1 proposals and confidence per state/depth/kernels (hashes only)"]
        lines += [f"{k} {v}" for k, v in sorted(digests.items())]
        folder.mkdir(parents=True, exist_ok=True)
        fs.atomic_write(path, ("\n".join(lines) + "\n").encode())
    if not path.exists():
        return {"class": cls, "file": str(path), "status": "unknown-class", "mismatches": [],
                "message": f"no reference digests for device class {cls}: record them with --record-digests"}
    ref: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[1]) != 64:
            raise BadInput(f"line {n} is not 'KEY SHA256'", where=f"{path}:{n}",
                           hint="a digests file holds one 'state/depth/kernels sha256' per line")
        ref[parts[0]] = parts[1]
    mism = [{"key": k, "expected": ref[k], "found": v} for k, v in sorted(digests.items()) if k in ref and ref[k] != v]
    missing = sorted(k for k in digests if k not in ref)
    status = "mismatch" if mism else ("incomplete" if missing else "match")
    return {"class": cls, "file": str(path), "status": status, "mismatches": mism, "missing": missing,
            "compared": len(digests) - len(missing), "recorded": record}
