"""`hermetic run RUNNER.toml`: the whole-worker measurement, inside the realized store, as the steps of
docs/run.md:

    1. validate       the runner file
    2. realize        each recipe the device needs (the no-op check once each)
    3. lock           the device (a machine-wide flock, waiting up to the runner's limit)
    4. preconditions  of the GPU, read through NVML, never changed
    5-7. measure      in the measuring process (cleared environment, affinity, nice, threads, address space
                      on a CPU, the resident-memory guard, the sandbox where only the root and the lock
                      folder are writable): exactness, digests, the interleaved protocol
    8. analyse        statistics, the A/A control, drift, the digests against the reference
    9. outputs        results, report, plot, receipt (a gc root)

The measuring process is ``hermetic.run.child`` in the host interpreter with the realized modules first on
its import path; everything here around it imports no torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hermetic import __version__, fs
from hermetic.errors import BadInput, SandboxRefused
from hermetic.reporter import Reporter, plural
from hermetic.root import Root
from hermetic.run.analysis import analyze
from hermetic.run.devices import cpu_facts, gpu_preconditions, lock_dir, pick_device, take_lock
from hermetic.run.digests import (
    RECEIPTS,
    check_digests,
    combine,
    device_class,
    receipt_facts,
    record_reference,
    split_by_class,
)
from hermetic.run.spec import DeviceSpec, Runner, load_runner
from hermetic.store import entry_ref

if TYPE_CHECKING:
    from hermetic.remote.settings import RemoteOptions
    from hermetic.sandbox import Sandbox


@dataclass
class RunOutcome:
    name: str
    exit_code: int
    run_dir: Path
    receipt: Path
    summary: dict[str, Any] = field(default_factory=dict)


class RunOptions(NamedTuple):
    """What the command line asks of a run beyond the runner file."""
    device: str = "auto"
    gpu_index: int = 0
    peer_index: int | None = None
    repetitions: int | None = None
    power_cap: float | None = None
    lock_timeout: float | None = None
    states: Path | None = None
    record_digests: bool = False
    remote: RemoteOptions | None = None
    offline: bool = False               # the realizes of step 2 fetch nothing
    sandbox: str | None = None          # over HERMETIC_SANDBOX and the runner's (the realizes take it too)
    jobs: int | None = None             # -j: the realizes' compilers at once


# the values the steps hand on -------------------------------------------------------------------------------
def run_domain(runner: str) -> str:
    """The trust domain of a runner's measuring process: its home and its kernel cache (sandbox.py)."""
    return f"run-{runner}"


class RunSetup(NamedTuple):
    """Step 1: the runner, the device it measures and where its locks lie."""
    runner: Runner
    kind: str                           # "gpu" or "cpu"
    spec: DeviceSpec
    lock_dir: Path
    sandbox: Sandbox
    audit: Any                          # the outside-root audit (None where it cannot run)


class Realized(NamedTuple):
    """Step 2: one recipe the device needs, realized (and its entries pinned for the run)."""
    recipe: Path
    name: str
    profile: str                        # the tree's folder (the profile's link resolved)
    tree: str
    entries: list[str]
    changed: bool
    receipt: str | None
    python: str
    archs: list[str]
    cuda: str | None
    cuda_home: str | None


class Locked(NamedTuple):
    """Steps 3-4: the device's machine-wide locks taken, and its GPUs' facts (read again once they are)."""
    gpu: Any
    peer: Any
    wanted: list[tuple[str, str]]       # (lock file, what) in a fixed order: no two runs deadlock
    waited: float
    pair: dict[str, Any] | None = None  # a pair run: its cards (rank 0's first) and the link between them


class Measured(NamedTuple):
    """Steps 5-7: what the measuring process left."""
    run_dir: Path
    raw: dict[str, Any] | None          # its results (None: it failed)
    guard: dict[str, Any]
    rc: int
    tail: list[str]
    refused: SandboxRefused | None      # the sandbox's refusal that failed it: raised once the receipt is written
    seconds: float


class Analysed(NamedTuple):
    """Step 8: the receipt's body, the results and the digests' verdict."""
    body: dict[str, Any]
    results: dict[str, Any] | None
    digests: dict[str, Any] | None
    digest_groups: dict[str, Any]
    code: int
    recording: bool                     # --record-digests: the reference is recorded from this run


class Held:
    """The device locks a run holds, released whatever happens (the one mutable value of ``run``)."""
    __slots__ = ("locks",)

    def __init__(self) -> None:
        self.locks: list[fs.FileLock] = []

    def release(self) -> None:
        for lk in reversed(self.locks):
            lk.release()
        self.locks.clear()


# the command -----------------------------------------------------------------------------------------------
def run(root: Root, runner_path: Path, reporter: Reporter, options: RunOptions) -> RunOutcome:
    """The steps of docs/run.md."""
    started, timings = time.monotonic(), {}
    setup = validate(root, runner_path, reporter, options)                         # 1
    realized = realize_all(root, setup, reporter, options)                         # 2
    timings["realize"] = round(time.monotonic() - started, 3)
    held = Held()
    try:
        locked = lock(setup, options, reporter, held)                              # 3
        timings["lock_wait"] = round(locked.waited, 3)
        locked = preconditions(setup, realized, locked, options)                   # 4
        measured = measure(root, setup, realized, locked, reporter)                # 5-7
        timings["measure"] = measured.seconds
    finally:
        held.release()
    t = time.monotonic()
    analysed = analyse(setup, realized, locked, measured, options.record_digests)  # 8 (and step 6's digests)
    if analysed.results is not None:
        timings["analysis"] = round(time.monotonic() - t, 3)
    out = outputs(root, setup, measured, analysed, reporter, timings, started)     # 9
    if measured.refused is not None:   # the receipt says so too; the error names the path
        measured.refused.hint = f"{measured.refused.hint}; the run's receipt: {out.receipt}"
        raise measured.refused
    return out


# the steps -------------------------------------------------------------------------------------------------
def validate(root: Root, runner_path: Path, reporter: Reporter, options: RunOptions) -> RunSetup:
    runner = load_runner(runner_path).with_overrides(repetitions=options.repetitions, power_cap_w=options.power_cap,
                                                     lock_timeout=options.lock_timeout, states=options.states)
    kind = pick_device(options.device)
    spec = runner.device(kind)
    if options.peer_index is not None and (options.peer_index == options.gpu_index or options.peer_index < 0
                                           or options.gpu_index < 0):
        raise BadInput(f"--peer {options.peer_index} needs a second card, other than --gpu {options.gpu_index}",
                       where="--peer", hint="for example --gpu 0 --peer 1 (on the CPU, both ranks run on the CPU "
                                            "and the two cards are the lock discipline's only)")
    root.ensure()
    for warning in spec.warnings:   # CPUs of cpus this machine lacks
        reporter.warn(warning)
    from hermetic.config import load
    config = load(runner_path.parent)
    gpu_dir = spec.lock_dir if kind == "gpu" else None
    chosen = config.resolve("lock_dir", None, gpu_dir, runner.doc.where(kind, "lock_dir"))
    config.check_machines_lock_dir(chosen)
    ldir = lock_dir(chosen.value)
    audit = _audit(root, ldir)
    from hermetic.realize.pipeline import say_sandbox
    from hermetic.sandbox import choose
    mode = config.resolve("sandbox", options.sandbox, spec.sandbox,
                          runner.doc.where(kind, "sandbox") if spec.sandbox else "")
    sandbox = choose(root, mode.value, mode.origin, ldir, network="the measuring process keeps the machine's network",
                     domain=run_domain(runner.name), kernels=True)
    say_sandbox(reporter, sandbox, "the measuring process")
    return RunSetup(runner, kind, spec, ldir, sandbox, audit)


def realize_all(root: Root, setup: RunSetup, reporter: Reporter, options: RunOptions) -> list[Realized]:
    """Each recipe the device needs: the no-op check once each, then the rest only when something changed; every
    entry pinned while the run holds it (a running `hermetic run` holds what it measures alive)."""
    from hermetic.realize.env import toolchain_home
    from hermetic.realize.noop import noop_check
    from hermetic.recipe import load_recipe
    from hermetic.store import Store
    out = []
    for path in setup.runner.device(setup.kind).realize:
        outcome = noop_check(root, path, None)
        if outcome is None:
            from hermetic.realize.pipeline import RealizeOptions, realize
            outcome = realize(root, path, reporter, RealizeOptions(remote=options.remote, offline=options.offline,
                                                                   sandbox=options.sandbox, jobs=options.jobs))
        # the tree itself, not the profile link: `gc --drop-root` may remove the link while the run holds the tree
        cuda_home = toolchain_home(root, load_recipe(path))
        out.append(Realized(path, outcome.name, str(Path(outcome.profile).resolve()), outcome.tree, outcome.entries,
                            outcome.changed, str(outcome.receipt) if outcome.receipt else None,
                            outcome.python or sys.executable, outcome.archs, outcome.cuda,
                            str(cuda_home) if cuda_home else None))
        reporter.event("run-realize", f"{'realized' if outcome.changed else 'up to date:'} {outcome.name}")
    store = Store(root.store).open()
    for r in out:
        for e in r.entries:
            store.pin_entry(e)
    return out


def card_locks(kind: str, cards: dict[int, str]) -> list[tuple[str, str]]:
    """(lock file, what) of each card a run measures on, in one fixed order, the cards' index (NVML's on a
    GPU machine): two runs wanting cards in crossed orders (``--gpu 0 --peer 1`` and ``--gpu 1 --peer 0``), or a
    pair and a solo run sharing one card, never each hold one lock the other waits for. ``cards``: index ->
    UUID (a GPU) or "" (the CPU). On the CPU, card 0 is the machine's CPU lock (every solo CPU run takes it)
    and card N a lock of its own: a CPU pair (``--device cpu --peer N``) takes both, so its lock discipline
    runs wherever the tests do."""
    host = socket.gethostname()
    out = []
    for index in sorted(cards):
        if kind == "gpu":
            out.append((f"gpu-{cards[index]}.lock", f"GPU {index} ({cards[index]})"))
        elif index == 0:
            out.append((f"cpu-{host}.lock", "this machine's CPU measurements"))
        else:
            out.append((f"cpu-{host}-card{index}.lock", f"CPU card {index} (a pair's lock on this machine)"))
    return out


def lock(setup: RunSetup, options: RunOptions, reporter: Reporter, held: Held) -> Locked:
    """Step 3: the device's machine-wide locks, in a fixed order; ``held`` keeps each as it is taken."""
    gpu = peer = None
    peer_index = options.peer_index
    pairing = peer_index is not None
    if setup.kind == "gpu":
        from hermetic.run.gpu import nvml_facts
        gpu = nvml_facts(options.gpu_index)
        peer = nvml_facts(peer_index) if peer_index is not None else None
        wanted = card_locks("gpu", {g.index: g.uuid for g in (gpu, peer) if g is not None})
        timeout = setup.spec.lock_timeout
    else:
        cards = [options.gpu_index, options.peer_index] if pairing else [0]
        wanted = card_locks("cpu", {c: "" for c in cards if c is not None})
        timeout = setup.runner.protocol.cpu_lock_timeout
    waited = 0.0
    for lock_name, what in wanted:
        lk, w = take_lock(setup.lock_dir, lock_name, timeout, reporter, what)
        held.locks.append(lk)
        waited += w
    pair = None
    if pairing:
        pair = {"cards": [options.gpu_index, options.peer_index], "link": {"kind": "cpu"},
                "devices": ["cuda:0", "cuda:1"] if setup.kind == "gpu" else ["cpu", "cpu"],
                "lock_order": [n for n, _ in wanted]}
        if setup.kind == "gpu":
            from hermetic.run.gpu import nvml_link
            try:
                pair["link"] = nvml_link(options.gpu_index, peer_index)  # type: ignore[arg-type]
            except Exception as e:  # a fact NVML cannot give is said, never guessed, and never fails the run
                pair["link"] = {"kind": "unknown", "error": f"{type(e).__name__}: {e}"}
    return Locked(gpu, peer, wanted, waited, pair)


def preconditions(setup: RunSetup, realized: list[Realized], locked: Locked, options: RunOptions) -> Locked:
    """Step 4: the GPUs' facts read again now that the locks are ours, and checked (never changed)."""
    if locked.gpu is None:
        return locked
    archs = tuple(a for r in realized for a in r.archs)
    cuda = max((r.cuda for r in realized if r.cuda), default=None)
    gpu = gpu_preconditions(setup.runner, archs, cuda, options.gpu_index, setup.spec)
    peer = locked.peer
    if options.peer_index is not None:  # each card of a pair meets every precondition, the power cap included
        peer = gpu_preconditions(setup.runner, archs, cuda, options.peer_index, setup.spec)
    return locked._replace(gpu=gpu, peer=peer)


def measure(root: Root, setup: RunSetup, realized: list[Realized], locked: Locked, reporter: Reporter) -> Measured:
    """Steps 5-7: the measuring process checks exactness and runs the protocol, in the sandbox in effect."""
    runner = setup.runner
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    run_dir = root.path / "runs" / f"{runner.name}-{stamp}-{os.getpid()}"
    run_dir.mkdir(parents=True)
    setup.sandbox.let_write(run_dir)   # its own folder alone: runs/ is read-only to every child
    reporter.event("run-start", f"measuring {runner.name} on the {setup.kind} "
                                f"({plural(len(runner.cells), 'cells')} x "
                                f"{plural(len(setup.spec.kernels), 'kernel sets')}, "
                                f"{plural(runner.protocol.repetitions, 'repetitions')})")
    t = time.monotonic()
    with setup.sandbox.confined():
        raw, guard, rc, tail, refused = measure_in_child(root, setup, realized, locked, run_dir, reporter)
    seconds = round(time.monotonic() - t, 3)
    from hermetic.realize.pipeline import say_refused
    say_refused(reporter, setup.sandbox)
    return Measured(run_dir, raw, guard, rc, tail, refused, seconds)


def analyse(setup: RunSetup, realized: list[Realized], locked: Locked, measured: Measured,
            record_digests: bool) -> Analysed:
    """Step 8: the receipt's body; for a process that measured, its statistics, the A/A control, drift, and the
    digests against the reference."""
    runner, kind, spec, gpu, peer = setup.runner, setup.kind, setup.spec, locked.gpu, locked.peer
    body: dict[str, Any] = {
        "format": 1, "kind": "run", "hermetic": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runner": {"name": runner.name, "path": str(runner.path), "sha256": fs.sha256_file(runner.path)[0]},
        "worker": {"path": str(runner.worker), "sha256": fs.sha256_file(runner.worker)[0]},
        "states": {"path": str(runner.states), "sha256": fs.sha256_file(runner.states)[0]},
        "device": kind,
        "realized": [{"name": r.name, "recipe": str(r.recipe), "tree": r.tree, "receipt": r.receipt}
                     for r in realized],
        "refs": sorted({entry_ref(e) for r in realized for e in r.entries}),
        "cpu": cpu_facts(spec), "gpu": gpu.to_json() if gpu else None,
        "peer_gpu": peer.to_json() if peer else None, "pair": _pair_record(locked),
        "locks": {"paths": [str(setup.lock_dir / n) for n, _ in locked.wanted], "waited_s": round(locked.waited, 3)},
        "limits": {"threads": spec.threads, "cpus": list(spec.cpus) if spec.cpus else None, "nice": spec.nice,
                   "memory_guard": spec.memory, "address_space": spec.address_space if kind == "cpu" else None},
        "memory_guard": measured.guard, "run_dir": str(measured.run_dir), "sandbox": setup.sandbox.record(),
    }
    raw = measured.raw
    if raw is None:
        guard = measured.guard
        if guard["tripped"]:
            reason = (f"the memory guard stopped the run: resident memory {guard['stopped']['rss'] / 2**20:.0f} "
                      f"MiB over the limit of {guard['limit'] / 2**20:.0f} MiB")
        elif measured.refused is not None:
            reason = measured.refused.what
        else:
            reason = f"the measuring process failed (exit {measured.rc}): " + " | ".join(measured.tail[-5:])
        body.update(status="failed", reason=reason)
        return Analysed(body, None, None, {}, 1, record_digests)
    analysis = analyze(raw, runner, kind)
    cls = device_class(kind, raw["environment"])
    body.update(environment=raw["environment"], modules=_module_hashes(raw["environment"]), device_class=cls)
    from hermetic.run.gpu import link_word
    link = (locked.pair or {}).get("link")
    groups = split_by_class(raw["digests"], cls, kind, raw["environment"],
                            pair_link=link_word(link) if link else None)
    dig = combine([check_digests(group, runner.digests, c, now=receipt_facts(body), recording=record_digests)
                   for c, group in groups.items()])
    exact = raw["exactness"]
    compiled = compile_check(raw)
    checks = {"exactness": {"comparisons": exact["comparisons"], "mismatches": len(exact["mismatches"]),
                            "passed": not exact["mismatches"]},
              "digests": {**{k: v for k, v in dig.items() if k != "mismatches"},
                          "mismatches": len(dig["mismatches"])},
              "compile": compiled}
    pair_check = _pair_check(raw, cls, kind)
    if pair_check is not None:
        checks["pair"] = pair_check
    failed = (bool(exact["mismatches"]) or dig["status"] == "mismatch" or not compiled["passed"]
              or (pair_check is not None and not pair_check["passed"]))
    results = {"format": 1, "runner": runner.name, "device": kind, "device_class": cls,
               "environment": raw["environment"], "checks": checks,
               "exactness_mismatches": exact["mismatches"], "digest_mismatches": dig["mismatches"],
               "analysis": analysis, "p2p": raw.get("p2p"), "pair": raw.get("pair"), "compile": raw.get("compile"),
               "kernels": raw.get("kernels"), "kernels_skipped": raw.get("kernels_skipped", {}),
               "flags": {**analysis["flags"], **raw["flags"],
                         "unknown_digest_class": dig["status"] == "unknown-class",
                         "compiled_in_timed_phase": not compiled["timed_clean"],
                         "not_compiled": sorted(k for k, v in compiled["sets"].items() if not v["compiled"])},
               "blocks": raw["blocks"], "samples": raw["samples"]}
    body.update(status="failed" if failed else "ok", device_class=cls, checks=checks,
                summary={"cells": {k: {"median_us": v.get("median"), "rel_iqr": v.get("rel_iqr"), "n": v["n"]}
                                   for k, v in analysis["cells"].items()},
                         "comparisons": [{k: c.get(k) for k in ("name", "a", "b", "ratio", "sign_ci",
                                                                "sign_confidence", "bootstrap_ci", "decision",
                                                                "skipped")}
                                         for c in analysis["comparisons"]],
                         "noisy": analysis["noisy"],
                         "repetitions": analysis["repetitions"],
                         "repetitions_needed": analysis["repetitions_needed"],
                         "repetitions_recommended": analysis["repetitions_recommended"]},
                flags=results["flags"], p2p=raw.get("p2p"))
    return Analysed(body, results, dig, groups, 1 if failed else 0, record_digests)


def outputs(root: Root, setup: RunSetup, measured: Measured, analysed: Analysed, reporter: Reporter,
            timings: dict[str, float], started: float) -> RunOutcome:
    """Step 9: results, report and plot of a process that measured; the receipt (a gc root) in any case; the
    reference digests last, when asked to record them (they pin the receipt just written)."""
    body, results, run_dir, runner = analysed.body, analysed.results, measured.run_dir, setup.runner
    if results is not None:
        assert analysed.digests is not None
        t = time.monotonic()
        fs.atomic_write_json(run_dir / "results.json", results, pretty=True)
        from hermetic.run.report import write_plot, write_report
        plot = write_plot(run_dir / "plot.png", results, root)
        report_md = write_report(run_dir / "report.md", results, runner, plot)
        body.update(results={"path": str(run_dir / "results.json"),
                             "sha256": fs.sha256_file(run_dir / "results.json")[0]},
                    report=str(report_md), plot=str(plot) if plot else None)
        timings["analysis"] = round(timings["analysis"] + time.monotonic() - t, 3)
        _say_results(reporter, results, analysed.digests)
    timings["total"] = round(time.monotonic() - started, 3)
    body["timings"] = timings
    body["outside_root_audit"] = _audit_finish(setup.audit, setup.lock_dir)
    digest = fs.sha256_bytes(fs.canonical_json(body))[:12]
    name = runner.name
    receipt = root.receipts / f"run-{name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{digest}.json"
    fs.atomic_write_json(receipt, body, pretty=True)
    fs.atomic_write_json(run_dir / "receipt.json", body, pretty=True)
    if results is not None and analysed.recording:
        for cls, group in analysed.digest_groups.items():
            path = record_reference(group, runner.digests, cls, runner_name=name, receipt=receipt, receipt_body=body)
            reporter.event("run-record", f"recorded {len(group)} reference digests in {path}, "
                                         f"pinned to receipt {receipt.name} (copied to "
                                         f"{path.parent / RECEIPTS}: commit both)", path=str(path))
    return RunOutcome(name, analysed.code, run_dir, receipt, body)


# the measuring process -------------------------------------------------------------------------------------
# in every measuring process's environment, solo or pair: no NVLink SHARP / multicast objects (NCCL's NVLS,
# torch's symmetric memory, NVSHMEM), which the lent GPU pairs cannot create (their fabric's multicast is off)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def child_env(root: Root, setup: RunSetup, realized: list[Realized], gpu_uuids: list[str]) -> dict[str, str]:
    """A cleared environment: only what the run sets, caches inside the root, realized modules first, and the
    first realized toolchain as CUDA_HOME and on PATH (none without one: never a system CUDA)."""
    toolchain = next((r.cuda_home for r in realized if r.cuda_home), None)
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    env = root.child_env(base)
    if toolchain:
        env["CUDA_HOME"] = env["CUDA_PATH"] = toolchain
        env["PATH"] = f"{toolchain}/bin:{env['PATH']}"
    threads = str(setup.spec.threads)
    paths = [r.profile for r in realized] + [str(Path(__file__).resolve().parents[2])]
    env.update({
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "PYTHONNOUSERSITE": "1", "PYTHONHASHSEED": "0",
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads, "NUMEXPR_NUM_THREADS": threads,
        "CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HERMETIC_ROOT": str(root.path),
        **NO_MULTICAST,
    })
    for key in ("CUDA_MODULE_LOADING", "ATEN_CPU_CAPABILITY"):  # passed on and recorded, never set by us
        if os.environ.get(key):  # ATEN_CPU_CAPABILITY=avx2 lowers torch's CPU dispatch, and with it the class
            env[key] = os.environ[key]
    # the driver's libraries (libcuda, libnvidia-ml) may live on the host's library path; a system CUDA
    # toolkit's folders never pass
    kept = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
            if d and "/cuda" not in d.lower()]
    if kept:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(kept)
    return env


def make_plan(setup: RunSetup, locked: Locked, run_dir: Path) -> dict[str, Any]:
    runner, kind, spec, gpu = setup.runner, setup.kind, setup.spec, locked.gpu
    p = runner.protocol
    return {
        "worker": str(runner.worker), "factory": runner.factory, "params": runner.params,
        "states": str(runner.states), "device": "cuda" if kind == "gpu" else "cpu",
        "gpu_uuid": gpu.uuid if gpu else None, "kernels": list(spec.kernels), "modules": runner.modules,
        "gpu_uuids": [g.uuid for g in (gpu, locked.peer) if g is not None],
        "pair": ({"devices": locked.pair["devices"], "cards": locked.pair["cards"], "link": locked.pair["link"]}
                 if locked.pair else None),
        "compile": {k: b for k, b in runner.compiled.items() if k in spec.kernels},
        "p2p": runner.p2p_module, "threads": spec.threads,
        "check_depths": list(runner.check_depths), "check_batches": list(runner.check_batches),
        "cells": [{"name": c.name, "graph": c.graph, "depth": c.depth, "batch": c.batch, "mask": c.mask,
                   "mask_bits": c.mask_bits()} for c in runner.cells],
        "aa_cell": p.aa_cell,
        "protocol": {"repetitions": p.repetitions, "calls": p.calls, "warmup_calls": p.warmup_calls,
                     "warmup_seconds": p.warmup_seconds},
        "l2_flush": spec.l2_flush if kind == "gpu" else False,
        "settle_seconds": spec.settle_seconds if kind == "gpu" else 0.0,
        "heavy_power_w": (gpu.power_limit_w * spec.heavy_power_fraction) if gpu else 0.0,
        "peer": locked.peer is not None, "peer_bytes": 256 << 20,
        "results": str(run_dir / "raw.json"),
    }


def measure_in_child(root: Root, setup: RunSetup, realized: list[Realized], locked: Locked, run_dir: Path,
                     reporter: Reporter
                     ) -> tuple[dict[str, Any] | None, dict[str, Any], int, list[str], SandboxRefused | None]:
    """Run the measuring process (in the sandbox in effect, if any); (raw results or None, guard record, exit
    status, log tail, the sandbox's refusal when the process failed after one: a failed run, whose receipt is
    written before the error is said)."""
    from hermetic.procs import Limits, run_limited
    from hermetic.run.guard import MemoryGuard
    from hermetic.sandbox import kernel_cache
    spec, kind = setup.spec, setup.kind
    plan = make_plan(setup, locked, run_dir)
    # the runner's own (sandbox.kernel_cache): the child keys a folder in it by torch and triton
    plan["kernel_cache"] = str(kernel_cache(root, run_domain(setup.runner.name)))
    plan_path = run_dir / "plan.json"
    fs.atomic_write_json(plan_path, plan, pretty=True)
    env = child_env(root, setup, realized, [g.uuid for g in (locked.gpu, locked.peer) if g is not None])
    limits = Limits(cpus=spec.cpus, nice=spec.nice, address_space=spec.address_space if kind == "cpu" else None)
    guard = MemoryGuard(spec.memory)
    tasks: dict[str, Any] = {}
    log = (run_dir / "worker.log").open("w")

    def on_line(line: str) -> None:
        log.write(line + "\n")
        try:
            rec = json.loads(line) if line.startswith("{") else None
        except ValueError:
            rec = None
        if not rec:
            return
        if rec.get("event") == "progress":
            phase = rec["phase"]
            if phase not in tasks:  # a phase begins: the one before it has ended, its bar finished and stopped
                for t, *_ in tasks.values():
                    t.close()
                tasks.clear()
                tasks[phase] = [reporter.task(f"run {phase}", rec.get("total"), "steps"), 0, "", 0.0]
            t = tasks[phase]
            t[0].advance(rec["done"] - t[1])
            t[1] = rec["done"]
            doing = rec.get("doing", "")
            if doing != t[2]:  # what the process does now (compiling a kernel set), said with its seconds
                t[2], t[3] = doing, time.monotonic()
                t[0].doing(doing, since=t[3])
        elif rec.get("event") == "warning":
            reporter.warn(rec.get("message", ""))

    python = realized[0].python if realized else sys.executable
    refused = None
    try:
        rc, tail = run_limited([python, "-m", "hermetic.run.child", str(plan_path)], cwd=str(run_dir), env=env,
                               limits=limits, on_line=on_line, on_start=guard.watch)
    except SandboxRefused as e:
        refused, rc, tail = e, 1, [e.what]
    finally:
        guard.stop()
        log.close()
        for t, *_ in tasks.values():
            t.close()
    raw_path = Path(plan["results"])
    raw = json.loads(raw_path.read_text()) if rc == 0 and raw_path.exists() else None
    return raw, guard.record(), rc, tail, refused


def _pair_record(locked: Locked) -> dict[str, Any] | None:
    """The receipt's pair: the cards (rank 0's first) with each one's facts and preconditions (those of a GPU,
    checked like a solo run's; "cpu" on the CPU), the link between them (NVML's, or "cpu") and the lock order."""
    pair = locked.pair
    if pair is None:
        return None
    cards = [g.to_json() if g is not None else "cpu" for g in (locked.gpu, locked.peer)]
    return {"cards": [{"index": i, "facts": c} for i, c in zip(pair["cards"], cards, strict=True)],
            "link": pair["link"], "devices": pair["devices"], "lock_order": pair["lock_order"],
            "preconditions": "checked on each card" if locked.gpu is not None else "cpu (none to check)"}


def _pair_check(raw: dict[str, Any], cls: str, kind: str) -> dict[str, Any] | None:
    """A pair run's own checks: the exchange's copy bit-exact, and (both cards of one class) every batch-1
    output of the pair equal to the solo run's. Exactness across both ranks is the exactness check's."""
    pair = raw.get("pair")
    if not pair:
        return None
    p2p = raw.get("p2p") or {}
    exact = p2p.get("peer_copy_exact")
    env = raw["environment"]
    same_class = kind == "cpu" or env.get("peer_capability") in (None, env.get("capability"))
    eq = pair.get("equal_to_solo") or {"compared": 0, "mismatches": []}
    passed = exact is not False and (not same_class or not eq["mismatches"]) and eq["compared"] > 0
    return {"passed": passed, "peer_copy_exact": exact, "transport": pair.get("transport") or p2p.get("transport"),
            "link": pair.get("link"), "equal_to_solo": {"compared": eq["compared"],
                                                        "mismatches": eq["mismatches"][:20],
                                                        "required": same_class}}


def compile_check(raw: dict[str, Any]) -> dict[str, Any]:
    """Passed when every compiled set ran compiled (no graph break, no fallback to eager) and the timed phase
    compiled nothing and wrote nothing into the kernel caches; with the counts a second run is judged by."""
    rec = raw.get("compile") or {}
    sets = rec.get("sets", {})
    total = rec.get("total", {})
    timed_clean = rec.get("timed_clean", True)
    return {"passed": timed_clean and all(v["compiled"] for v in sets.values()),
            "sets": {k: {f: v[f] for f in ("status", "compiled", "reason", "graphs", "calls", "graph_runs",
                                           "compile_s")} for k, v in sets.items()},
            "timed_clean": timed_clean, "timed_events": rec.get("timed_events", {}),
            "graphs_traced": total.get("graphs", 0), "inductor_cache_misses": total.get("inductor_cache_misses", 0),
            "inductor_cache_hits": total.get("inductor_cache_hits", 0),
            "cache_files_written": total.get("cache_files", 0), "compiled_nothing": rec.get("compiled_nothing"),
            "warmup_seconds": rec.get("warmup_seconds"),
            "cache": (rec.get("caches") or {}).get("folder"), "skipped": raw.get("kernels_skipped", {})}


def _module_hashes(env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The file and sha256 of every module the measuring process imported (a reference digest pins them)."""
    out: dict[str, dict[str, Any]] = {}
    for name, file in sorted(env.get("modules", {}).items()):
        p = Path(file) if file else None
        out[name] = {"file": file, "sha256": fs.sha256_file(p)[0] if p and p.is_file() else None}
    return out


def _audit(root: Root, ldir: Path) -> Any:
    try:
        from hermetic.audit import OutsideRootAudit
    except ImportError:
        return None
    a = OutsideRootAudit(root.path, lock_folders=[ldir])  # watched: only lock files may appear there
    a.start()
    return a


def _audit_finish(audit: Any, ldir: Path) -> dict[str, Any]:
    if audit is None:
        return {"available": False}
    from hermetic.realize.pipeline import children_since
    rec: dict[str, Any] = audit.finish(children=children_since(audit.started), exclude=[ldir])
    return rec


def _say_results(reporter: Reporter, results: dict[str, Any], dig: dict[str, Any]) -> None:
    a = results["analysis"]
    if a.get("noisy"):  # first: it changes how everything after it reads
        reporter.warn(f"noisy run, no comparison decided: {a['noisy']}")
    for label, c in a["cells"].items():
        if c["n"]:
            reporter.event("run-cell", f"  {label:32s} median {c['median']:10.1f} us  IQR {100 * c['rel_iqr']:5.2f} %"
                                       f"  n={c['n']}", label=label)
    for c in a["comparisons"]:
        if "not_measured" in c:  # said once, below
            continue
        if "skipped" in c:
            reporter.event("run-compare", f"  {c['name']}: skipped ({c['skipped']})")
            continue
        lo, hi = c["sign_ci"]
        reporter.event("run-compare", f"  {c['name']}: ratio {c['ratio']:.4f} [{lo:.4f}, {hi:.4f}] "
                                      f"({100 * c['sign_confidence']:.1f} %) -> {c['decision']}")
    from hermetic.run.report import not_measured_line
    if unmeasured := not_measured_line(results):
        reporter.event("run-compare", f"  {unmeasured}")
    chk = results["checks"]
    reporter.event("run-checks", f"exactness: {plural(chk['exactness']['comparisons'], 'comparisons')}, "
                                 f"{plural(chk['exactness']['mismatches'], 'mismatches')}; digests: "
                                 + ", ".join(f"{c} {v['status']}" for c, v in (dig.get("classes") or
                                                                                {dig["class"]: dig}).items()))
    pair = chk.get("pair")
    if pair:
        eq = pair["equal_to_solo"]
        reporter.event("run-pair", f"pair: the exchange {pair['transport']} (link {pair['link'].get('kind')}), "
                                   f"its copy {'bit-exact' if pair['peer_copy_exact'] else 'NOT exact'}; "
                                   f"{plural(eq['compared'], 'outputs')} against the solo run's, "
                                   f"{len(eq['mismatches'])} differ")
        if not pair["passed"]:
            reporter.warn(f"the pair's checks failed: {', '.join(eq['mismatches'][:5]) or 'the copy is not exact'}"
                          + (" differ from the solo outputs" if eq["mismatches"] else ""))
    comp = chk["compile"]
    for k, v in comp["sets"].items():
        reporter.event("run-compile", f"compiled set {k}: {v['status']} ({v['reason']}; "
                                      f"{plural(v['graphs'], 'graphs')}, {v['compile_s']:.1f} s in the backend)")
        if not v["compiled"]:
            reporter.warn(f"kernel set {k} is not what it claims to be: {v['reason']}")
    if comp["sets"]:
        reporter.event("run-compile", f"compiles: {plural(comp['inductor_cache_misses'], 'graphs')} compiled, "
                                      f"{comp['inductor_cache_hits']} loaded from the cache "
                                      f"({comp['cache']}); {comp['warmup_seconds']:.1f} s before the first timed "
                                      f"call")
    if not comp["timed_clean"]:
        reporter.warn(f"compiling inside the timed calls: {comp['timed_events']}; the timings are not of compiled "
                      f"kernels alone")
    for k, why in comp["skipped"].items():
        reporter.event("run-compile", f"kernel set {k} skipped: {why}")
    if dig["status"] == "unknown-class":
        reporter.warn(dig["message"])
    if dig.get("previous") == "mismatch":
        reporter.warn(f"the reference digests replaced did not match this run ({len(dig['mismatches'])} drifted)")
    if dig.get("drift") and dig["status"] != "recorded" and (dig["status"] == "mismatch"
                                                             or dig["drift"]["differences"]):
        reporter.event("run-drift", f"  {dig['drift']['message']}")
    for m in results["exactness_mismatches"][:20]:
        reporter.event("run-drift", f"  drifted: {m['check']} kernels={m['kernels']} depth={m['depth']} "
                                    f"batch={m['batch']} state={m['state']} mask={m['mask']} row={m['row']} "
                                    f"({m['positions']} positions)")
    for m in dig["mismatches"][:20]:
        reporter.event("run-drift", f"  digest drifted: {m['key']} expected {m['expected'][:16]} "
                                    f"found {m['found'][:16]}")
    f = results["flags"]
    if f.get("drift"):
        reporter.warn(f"drift across repetitions in: {', '.join(f['drift'])}")
    if f.get("other_process_seen"):
        reporter.warn("another compute process appeared on the GPU: the run is invalid")
    p2p = results.get("p2p")
    if p2p and "skipped" not in p2p:
        reporter.event("run-p2p", f"P2P ({p2p['note']}): extension peer copy "
                                  f"{p2p['extension_peer_copy']['gb_per_s']:.1f} GB/s vs copy engine "
                                  f"{p2p['copy_engine']['gb_per_s']:.1f} GB/s "
                                  f"(ratio {p2p['peer_vs_copy_engine']:.3f}); exact: {p2p['peer_copy_exact']}")
    reporter.event("run-reps", f"repetitions: {a['repetitions_advice']['message']}")
