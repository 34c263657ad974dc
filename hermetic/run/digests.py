"""Reference digests: the batch-1 outputs of every state and depth, hashed, per device class (what changes
arithmetic), compared with ``manifests/digests/<class>.txt`` and recorded there on request.

A reference file pins the run that recorded it: the sha256 of that run's receipt and the facts the receipt
names that can change the bits (the module files' hashes, the interpreter and torch, the worker, states and
runner files), one ``pin SECTION NAME VALUE`` line each. When digests drift, the drift report compares this
run's facts with the pinned ones and says whether the modules, the runtime or the inputs changed since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput

# the sections of the pin, and what a difference in each means for the reader
SECTIONS = {"module": "modules", "runtime": "runtime", "input": "inputs"}
RUNTIME_FACTS = ("python", "executable", "torch", "torch_cuda", "threads", "cpu_capability", "cpu_vendor",
                 "gpu_name", "capability")
RUNTIME_ENV = ("ATEN_CPU_CAPABILITY",)  # what the measuring process was told about dispatch


# the device class ------------------------------------------------------------------------------------------
def device_class(kind: str, env: dict[str, Any]) -> str:
    """What changes arithmetic: the GPU architecture, or the CPU's instruction set and vendor (MKL and oneDNN
    dispatch by both: one AVX-512 class gave other bits on AMD than on Intel); torch; the thread count.

    The instruction set is the one torch's CPU kernels really dispatch to (``get_cpu_capability``), which
    ``ATEN_CPU_CAPABILITY`` lowers: ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 machine measures, and is
    checked as, the AVX2 class."""
    torch_v = str(env["torch"]).replace("+", "_")
    if kind == "gpu":
        return f"sm{env['capability'].replace('.', '')}-torch{torch_v}"
    return (f"cpu-{str(env['cpu_capability']).lower()}-{env.get('cpu_vendor', 'unknown')}-torch{torch_v}"
            f"-t{env['threads']}")


def kernel_class(base: str, kind: str, env: dict[str, Any], kernels: str) -> str:
    """The device class of one kernel set's digests. A compiled set's own class names its backend, what that
    emits (C++ on a CPU, Triton on a GPU) and triton's version, and so does a Triton kernel set's: a new
    compiler can change the bits while torch and the device stay the same. (On a CPU, Inductor emits no Triton;
    naming triton's version there anyway only costs a re-record when it changes, never a wrong pass.)"""
    info = (env.get("kernel_sets") or {}).get(kernels) or {}
    triton = f"triton{env.get('triton') or 'none'}"
    if info.get("compile"):
        return f"{base}-{info['compile']}-{'triton' if kind == 'gpu' else 'cpp'}-{triton}"
    if info.get("triton"):
        return f"{base}-{triton}"
    return base


def split_by_class(digests: dict[str, str], base: str, kind: str, env: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Digests (``state/depth/kernels`` keys) grouped by their kernel set's class, the base class first."""
    groups: dict[str, dict[str, str]] = {base: {}}
    for key, value in digests.items():
        groups.setdefault(kernel_class(base, kind, env, key.rsplit("/", 1)[-1]), {})[key] = value
    return {cls: g for cls, g in groups.items() if g or cls == base}


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One digest check of several classes: the worst status leads (mismatch, unknown class, incomplete);
    the first class's fields stay where a one-class run had them, every class's under ``classes``."""
    order = ("mismatch", "unknown-class", "incomplete", "recorded", "match")
    worst = min(results, key=lambda r: order.index(r["status"]))
    out = {**results[0], "status": worst["status"], "mismatches": [m for r in results for m in r["mismatches"]],
           "missing": [k for r in results for k in r["missing"]], "compared": sum(r["compared"] for r in results),
           "classes": {r["class"]: {k: r.get(k) for k in ("file", "status", "compared", "previous")}
                       | {"mismatches": len(r["mismatches"])} for r in results}}
    for key in ("message", "drift"):
        if key in worst:
            out[key] = worst[key]
    return out


def unknown_class_message(cls: str, path: Path) -> str:
    return (f"no reference digests for device class {cls} ({path} does not exist): this run's outputs were "
            f"compared with nothing, which is not a pass. Record them on a machine of this class with "
            f"`hermetic run RUNNER --record-digests` and commit {path.name}; on an AVX-512 CPU, "
            f"ATEN_CPU_CAPABILITY=avx2 measures (and records) the AVX2 class")


# what a receipt pins ---------------------------------------------------------------------------------------
def receipt_facts(receipt: dict[str, Any]) -> dict[str, str]:
    """The facts of a run receipt that can change the digests, as ``"SECTION NAME" -> value``."""
    facts: dict[str, str] = {}
    for name, m in sorted(receipt.get("modules", {}).items()):
        facts[f"module {name}"] = f"sha256:{m['sha256']}" if m.get("sha256") else "missing"
    env = receipt.get("environment", {})
    for key in RUNTIME_FACTS:
        if env.get(key) is not None:
            facts[f"runtime {key}"] = str(env[key])
    for key in RUNTIME_ENV:
        value = (env.get("env") or {}).get(key)
        facts[f"runtime {key}"] = value if value else "(unset)"
    for key in ("worker", "states", "runner"):
        if key in receipt:
            facts[f"input {key}"] = f"sha256:{receipt[key]['sha256']}"
    return facts


def drift_report(pin: dict[str, Any] | None, now: dict[str, str]) -> dict[str, Any]:
    """What differs between the pinned reference run and this one, and a sentence saying it."""
    if not pin:
        return {"pinned": False, "differences": [],
                "message": "the reference pins no receipt (recorded before references did): re-record it with "
                           "--record-digests to learn, next time, whether modules or runtime changed"}
    then = pin["facts"]
    diffs = [{"what": key, "reference": then.get(key, "(absent)"), "now": now.get(key, "(absent)")}
             for key in sorted(set(then) | set(now)) if then.get(key) != now.get(key)]
    parts = []
    for section, noun in SECTIONS.items():
        changed = [d["what"].split(" ", 1)[1] for d in diffs if d["what"].split(" ", 1)[0] == section]
        parts.append(f"{noun} changed ({', '.join(changed)})" if changed else f"{noun} unchanged")
    return {"pinned": True, "receipt": pin["receipt"], "receipt_sha256": pin["receipt_sha256"],
            "differences": diffs,
            "message": f"since the reference run (receipt {pin['receipt']}, sha256 {pin['receipt_sha256'][:16]}): "
                       + "; ".join(parts)}


# the reference file ----------------------------------------------------------------------------------------
def read_reference(path: Path) -> tuple[dict[str, str], dict[str, Any] | None]:
    """(digests by key, the pin or None)."""
    ref: dict[str, str] = {}
    facts: dict[str, str] = {}
    receipt: tuple[str, str] | None = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if parts[0] == "pin":
            if len(parts) < 4 or (parts[1] != "receipt" and parts[1] not in SECTIONS):
                raise BadInput(f"line {n} is not 'pin SECTION NAME VALUE'", where=f"{path}:{n}",
                               hint=f"SECTION is receipt or one of {', '.join(SECTIONS)}")
            if parts[1] == "receipt":
                receipt = (parts[2], parts[3].removeprefix("sha256:"))
            else:
                facts[f"{parts[1]} {parts[2]}"] = " ".join(parts[3:])
            continue
        if len(parts) != 2 or len(parts[1]) != 64:
            raise BadInput(f"line {n} is not 'KEY SHA256'", where=f"{path}:{n}",
                           hint="a digests file holds one 'state/depth/kernels sha256' per line")
        ref[parts[0]] = parts[1]
    pin = {"receipt": receipt[0], "receipt_sha256": receipt[1], "facts": facts} if receipt else None
    return ref, pin


def check_digests(digests: dict[str, str], folder: Path, cls: str, *, now: dict[str, str],
                  recording: bool = False) -> dict[str, Any]:
    """This run's digests against the reference of its class; with ``recording``, against the reference about
    to be replaced (status ``recorded``: ``record_reference`` writes the new one once the receipt exists)."""
    path = folder / f"{cls}.txt"
    if not path.exists():
        return {"class": cls, "file": str(path), "status": "recorded" if recording else "unknown-class",
                "mismatches": [], "missing": [], "compared": 0, "recorded": recording,
                "message": unknown_class_message(cls, path)}
    ref, pin = read_reference(path)
    mism = [{"key": k, "expected": ref[k], "found": v} for k, v in sorted(digests.items()) if k in ref and ref[k] != v]
    missing = sorted(k for k in digests if k not in ref)
    status = "mismatch" if mism else ("incomplete" if missing else "match")
    out = {"class": cls, "file": str(path), "status": "recorded" if recording else status, "mismatches": mism,
           "missing": missing, "compared": len(digests) - len(missing), "recorded": recording,
           "drift": drift_report(pin, now)}
    if recording:
        out["previous"] = status  # whether the reference it replaces agreed
    return out


def record_reference(digests: dict[str, str], folder: Path, cls: str, *, runner_name: str, receipt: Path,
                     receipt_body: dict[str, Any]) -> Path:
    """Write ``folder/<class>.txt``: the digests and the pin of the run (its receipt, already written)."""
    path = folder / f"{cls}.txt"
    lines = [f"# hermetic run reference digests: runner {runner_name}, device class {cls}",
             "# sha256 of the batch-1 proposals and confidence per state/depth/kernels (hashes only)",
             "# pin: the run that recorded them (its receipt's sha256) and the facts of that receipt that can",
             "# change the bits; a drift report compares a later run's facts with these",
             f"pin receipt {receipt.name} sha256:{fs.sha256_file(receipt)[0]}"]
    lines += [f"pin {key} {value}" for key, value in receipt_facts(receipt_body).items()]
    lines += [f"{k} {v}" for k, v in sorted(digests.items())]
    folder.mkdir(parents=True, exist_ok=True)
    fs.atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path
