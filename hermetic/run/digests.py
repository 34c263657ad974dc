"""Reference digests: the batch-1 outputs of every state and depth, hashed, per device class (what changes
arithmetic), compared with ``manifests/digests/<class>.txt`` and recorded there on request.

A reference file pins the run that recorded it: its receipt, copied beside the file (``receipts/``, so that it
ships with the repository) with its sha256, and the facts that decide the bits, one ``pin SECTION NAME VALUE``
line each: the module files' hashes; torch, its CUDA and the device class (the CPU's instruction set and vendor
or the GPU's architecture, the thread count); the instruction set torch's CPU kernels dispatch to; the worker,
states and runner files. Not the interpreter's path, nor how the instruction set was chosen
(``ATEN_CPU_CAPABILITY`` or the CPU itself): those change no bit, and a note about them would be a false alarm.
When digests drift, the drift report compares this run's facts with the pinned ones and says whether the
modules, the runtime or the inputs changed since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput

# the sections of the pin, and what a difference in each means for the reader
SECTIONS = {"module": "modules", "runtime": "runtime", "input": "inputs"}
RUNTIME_FACTS = ("device_class", "torch", "torch_cuda", "cpu_capability")  # what decides the bits
RECEIPTS = "receipts"  # beside the reference files: the receipts their pins name


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


PAIR = "@pair"  # the suffix of a pair's digest keys (``s00/d4/torch@pair``) in the measuring process's results


def pair_class(cls: str, link: str, peer_head: str | None = None) -> str:
    """A pair's class: both cards' classes and the link between them, ``sm90x2-nvlink-torch...`` (or
    ``sm90+sm80-pcie-...`` for two architectures), ``cpux2-cpu-avx512-...`` for both ranks on the CPU. Its
    digests are recorded and compared like a solo class's, in a file of their own."""
    head, _, tail = cls.partition("-")
    cards = f"{head}x2" if peer_head in (None, head) else f"{head}+{peer_head}"
    return f"{cards}-{link}-{tail}" if tail else f"{cards}-{link}"


def split_by_class(digests: dict[str, str], base: str, kind: str, env: dict[str, Any],
                   pair_link: str | None = None) -> dict[str, dict[str, str]]:
    """Digests (``state/depth/kernels`` keys) grouped by their kernel set's class, the base class first; a
    pair's (keys ending in ``@pair``) by their pair class, under the solo key (each class has its own file)."""
    groups: dict[str, dict[str, str]] = {base: {}}
    peer = env.get("peer_capability")
    peer_head = f"sm{str(peer).replace('.', '')}" if peer else None
    for key, value in digests.items():
        paired = key.endswith(PAIR)
        if paired:
            key = key[:-len(PAIR)]
        cls = kernel_class(base, kind, env, key.rsplit("/", 1)[-1])
        if paired:
            cls = pair_class(cls, pair_link or "cpu", peer_head)
        groups.setdefault(cls, {})[key] = value
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
    """The facts of a run receipt that decide the digests, as ``"SECTION NAME" -> value``."""
    facts: dict[str, str] = {}
    for name, m in sorted(receipt.get("modules", {}).items()):
        facts[f"module {name}"] = f"sha256:{m['sha256']}" if m.get("sha256") else "missing"
    env = {**receipt.get("environment", {}), "device_class": receipt.get("device_class")}
    if receipt.get("device") == "gpu":
        env.pop("cpu_capability", None)  # the worker's arithmetic runs on the GPU: the host's CPU decides no bit
    for key in RUNTIME_FACTS:
        if env.get(key) is not None:
            facts[f"runtime {key}"] = str(env[key])
    for key in ("worker", "states", "runner"):
        if key in receipt:
            facts[f"input {key}"] = f"sha256:{receipt[key]['sha256']}"
    return facts


def _pinned(key: str) -> bool:
    """Whether a pin line is one this version compares (an older file's pins of the interpreter's path or of
    ATEN_CPU_CAPABILITY decide no bit: they are read and left out)."""
    section, _, name = key.partition(" ")
    return section != "runtime" or name in RUNTIME_FACTS


def drift_report(pin: dict[str, Any] | None, now: dict[str, str], folder: Path | None = None) -> dict[str, Any]:
    """What differs between the pinned reference run and this one, and a sentence saying it; the receipt is
    named where it lies (``folder``: the reference files' folder, whose ``receipts/`` ships them)."""
    if not pin:
        return {"pinned": False, "differences": [],
                "message": "the reference pins no receipt (recorded before references did): re-record it with "
                           "--record-digests to learn, next time, whether modules or runtime changed"}
    then = {k: v for k, v in pin["facts"].items() if _pinned(k)}
    diffs = [{"what": key, "reference": then.get(key, "(absent)"), "now": now.get(key, "(absent)")}
             for key in sorted(set(then) | set(now)) if then.get(key) != now.get(key)]
    parts = []
    for section, noun in SECTIONS.items():
        changed = [d["what"].split(" ", 1)[1] for d in diffs if d["what"].split(" ", 1)[0] == section]
        parts.append(f"{noun} changed ({', '.join(changed)})" if changed else f"{noun} unchanged")
    path = receipt_path(folder, pin["receipt"]) if folder is not None else None
    shipped = path is not None and path.is_file()
    named = str(path) if shipped else f"{pin['receipt']}, not in this repository"
    return {"pinned": True, "receipt": str(path) if shipped else pin["receipt"], "receipt_shipped": shipped,
            "receipt_sha256": pin["receipt_sha256"], "differences": diffs,
            "message": f"since the reference run (receipt {named}; sha256 {pin['receipt_sha256'][:16]}): "
                       + "; ".join(parts)}


def receipt_path(folder: Path | None, pinned: str) -> Path:
    """Where the receipt a pin names lies: ``receipts/NAME`` beside the reference files (an older pin named the
    file alone)."""
    rel = pinned if "/" in pinned else f"{RECEIPTS}/{pinned}"
    return (folder or Path(".")) / rel


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
           "drift": drift_report(pin, now, folder)}
    if recording:
        out["previous"] = status  # whether the reference it replaces agreed
    return out


def record_reference(digests: dict[str, str], folder: Path, cls: str, *, runner_name: str, receipt: Path,
                     receipt_body: dict[str, Any]) -> Path:
    """Write ``folder/<class>.txt``: the digests and the pin of the run (its receipt, already written, copied to
    ``folder/receipts/`` so that it is committed with the file)."""
    path = folder / f"{cls}.txt"
    data = receipt.read_bytes()
    shipped = folder / RECEIPTS / receipt.name
    lines = [f"# hermetic run reference digests: runner {runner_name}, device class {cls}",
             "# sha256 of the batch-1 proposals and confidence per state/depth/kernels (hashes only)",
             "# pin: the run that recorded them (its receipt, in receipts/ beside this file, and its sha256) and",
             "# the facts that decide the bits; a drift report compares a later run's facts with these",
             f"pin receipt {RECEIPTS}/{receipt.name} sha256:{fs.sha256_bytes(data)}"]
    lines += [f"pin {key} {value}" for key, value in receipt_facts(receipt_body).items()]
    lines += [f"{k} {v}" for k, v in sorted(digests.items())]
    shipped.parent.mkdir(parents=True, exist_ok=True)
    fs.atomic_write(shipped, data)
    fs.atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path
