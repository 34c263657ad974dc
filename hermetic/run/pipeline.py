"""`hermetic run RUNNER.toml`: the whole-worker measurement, inside the realized store.

    run = runner (validate) -> realize each recipe the device needs -> device lock (flock, waits)
          -> preconditions (NVML, read-only) -> measuring process (cleared environment, affinity, nice,
          threads, address space on a CPU, resident-memory guard) -> exactness and digests -> statistics
          -> results, report, plot, receipt (a gc root)

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
from typing import Any

from hermetic import __version__, fs
from hermetic.errors import BadInput
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.run.analysis import analyze
from hermetic.run.devices import cpu_facts, gpu_preconditions, lock_dir, pick_device, take_lock
from hermetic.run.digests import check_digests, device_class
from hermetic.run.spec import Runner, load_runner


@dataclass
class RunOutcome:
    name: str
    exit_code: int
    run_dir: Path
    receipt: Path
    summary: dict[str, Any] = field(default_factory=dict)


# realize ---------------------------------------------------------------------------------------------------
def realize_all(root: Root, runner: Runner, kind: str, reporter: Reporter, remote: Any = None
                ) -> list[dict[str, Any]]:
    from hermetic.realize.noop import noop_check
    from hermetic.realize.pipeline import realize
    from hermetic.recipe import load_recipe
    out = []
    for path in runner.device(kind).realize:
        outcome = noop_check(root, path, None) or realize(root, path, reporter, remote=remote)
        recipe = load_recipe(path)
        # the tree itself, not the profile link: `gc --drop-root` may remove the link while the run holds the tree
        out.append({"recipe": str(path), "name": outcome.name, "profile": str(Path(outcome.profile).resolve()),
                    "tree": outcome.tree, "entries": outcome.entries, "changed": outcome.changed,
                    "receipt": str(outcome.receipt) if outcome.receipt else None,
                    "python": recipe.python or sys.executable,
                    "archs": list(recipe.toolchain.archs) if recipe.toolchain else [],
                    "cuda": recipe.toolchain.cuda if recipe.toolchain else None})
        reporter.event("run-realize", f"{'realized' if outcome.changed else 'up to date:'} {outcome.name}")
    return out


# the measuring process -------------------------------------------------------------------------------------
def child_env(root: Root, runner: Runner, kind: str, realized: list[dict[str, Any]], gpu_uuids: list[str]
              ) -> dict[str, str]:
    """A cleared environment: only what the run sets, caches inside the root, realized modules first."""
    spec = runner.device(kind)
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    env = root.child_env(base)
    threads = str(spec.threads)
    paths = [r["profile"] for r in realized] + [str(Path(__file__).resolve().parents[2])]
    env.update({
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "PYTHONNOUSERSITE": "1", "PYTHONHASHSEED": "0",
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads, "NUMEXPR_NUM_THREADS": threads,
        "CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HERMETIC_ROOT": str(root.path),
    })
    if os.environ.get("CUDA_MODULE_LOADING"):  # recorded, not changed
        env["CUDA_MODULE_LOADING"] = os.environ["CUDA_MODULE_LOADING"]
    # the driver's libraries (libcuda, libnvidia-ml) may live on the host's library path; a system CUDA
    # toolkit's folders never pass
    kept = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
            if d and "/cuda" not in d.lower()]
    if kept:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(kept)
    return env


def make_plan(runner: Runner, kind: str, run_dir: Path, gpu: Any, peer: Any = None) -> dict[str, Any]:
    spec = runner.device(kind)
    p = runner.protocol
    return {
        "worker": str(runner.worker), "factory": runner.factory, "params": runner.params,
        "states": str(runner.states), "device": "cuda" if kind == "gpu" else "cpu",
        "gpu_uuid": gpu.uuid if gpu else None, "kernels": list(spec.kernels), "modules": runner.modules,
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
        "peer": peer is not None, "peer_bytes": 256 << 20,
        "results": str(run_dir / "raw.json"),
    }


def measure_in_child(root: Root, runner: Runner, kind: str, realized: list[dict[str, Any]], gpu: Any, peer: Any,
            run_dir: Path, reporter: Reporter) -> tuple[dict[str, Any] | None, dict[str, Any], int, list[str]]:
    """Run the measuring process; (raw results or None, guard record, exit status, log tail)."""
    from hermetic.procs import Limits, run_limited
    from hermetic.run.guard import MemoryGuard
    spec = runner.device(kind)
    plan = make_plan(runner, kind, run_dir, gpu, peer)
    plan_path = run_dir / "plan.json"
    fs.atomic_write_json(plan_path, plan, pretty=True)
    env = child_env(root, runner, kind, realized, [g.uuid for g in (gpu, peer) if g is not None])
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
            if phase not in tasks:
                tasks[phase] = [reporter.task(f"run {phase}", rec.get("total"), "steps"), 0]
            t = tasks[phase]
            t[0].advance(rec["done"] - t[1])
            t[1] = rec["done"]
        elif rec.get("event") == "warning":
            reporter.warn(rec.get("message", ""))

    python = realized[0]["python"] if realized else sys.executable
    try:
        rc, tail = run_limited([python, "-m", "hermetic.run.child", str(plan_path)], cwd=str(run_dir), env=env,
                               limits=limits, on_line=on_line, on_start=guard.watch)
    finally:
        guard.stop()
        log.close()
        for t, _ in tasks.values():
            t.close()
    raw_path = Path(plan["results"])
    raw = json.loads(raw_path.read_text()) if rc == 0 and raw_path.exists() else None
    return raw, guard.record(), rc, tail


# the command -----------------------------------------------------------------------------------------------
def run(root: Root, runner_path: Path, reporter: Reporter, *, device: str = "auto", gpu_index: int = 0,
        peer_index: int | None = None, repetitions: int | None = None, power_cap: float | None = None,
        lock_timeout: float | None = None, states: Path | None = None, record_digests: bool = False,
        remote: Any = None) -> RunOutcome:
    started = time.monotonic()
    timings: dict[str, float] = {}
    runner = load_runner(runner_path).with_overrides(repetitions=repetitions, power_cap_w=power_cap,
                                                     lock_timeout=lock_timeout, states=states)
    kind = pick_device(device)
    spec = runner.device(kind)
    root.ensure()
    audit = _audit(root)
    realized = realize_all(root, runner, kind, reporter, remote)
    timings["realize"] = round(time.monotonic() - started, 3)
    from hermetic.store import Store
    store = Store(root.store).open()
    for r in realized:  # a running `hermetic run` holds what it measures alive
        for e in r["entries"]:
            store.temproots.add(f"entry:{e}")

    gpu = peer = None
    if peer_index is not None and (kind != "gpu" or peer_index == gpu_index):
        raise BadInput("--peer needs a GPU run and a second GPU", where="--peer",
                       hint="for example --gpu 0 --peer 1 on a machine with two GPUs")
    wanted: list[tuple[str, str]] = []   # (lock file, what) in a fixed order: no two runs deadlock
    if kind == "gpu":
        from hermetic.run.gpu import nvml_facts
        gpu = nvml_facts(gpu_index)
        peer = nvml_facts(peer_index) if peer_index is not None else None
        wanted = sorted((f"gpu-{g.uuid}.lock", f"GPU {g.index} ({g.uuid})") for g in (gpu, peer) if g is not None)
        timeout = spec.lock_timeout
    else:
        wanted = [(f"cpu-{socket.gethostname()}.lock", "this machine's CPU measurements")]
        timeout = runner.protocol.cpu_lock_timeout
    ldir = lock_dir(spec.lock_dir if kind == "gpu" else None)
    locks: list[fs.FileLock] = []
    waited = 0.0
    try:
        for lock_name, what in wanted:
            lk, w = take_lock(ldir, lock_name, timeout, reporter, what)
            locks.append(lk)
            waited += w
        timings["lock_wait"] = round(waited, 3)
        if gpu is not None:
            gpu = gpu_preconditions(runner, realized, gpu_index, spec)
            if peer_index is not None:
                peer = gpu_preconditions(runner, realized, peer_index, spec, peer=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        run_dir = root.path / "runs" / f"{runner.name}-{stamp}-{os.getpid()}"
        run_dir.mkdir(parents=True)
        reporter.event("run-start", f"measuring {runner.name} on the {kind} ({len(runner.cells)} cells x "
                                    f"{len(spec.kernels)} kernel sets, {runner.protocol.repetitions} repetitions)")
        t = time.monotonic()
        raw, guard, rc, tail = measure_in_child(root, runner, kind, realized, gpu, peer, run_dir, reporter)
        timings["measure"] = round(time.monotonic() - t, 3)
    finally:
        for lk in reversed(locks):
            lk.release()

    body: dict[str, Any] = {
        "format": 1, "kind": "run", "hermetic": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runner": {"name": runner.name, "path": str(runner.path), "sha256": fs.sha256_file(runner.path)[0]},
        "worker": {"path": str(runner.worker), "sha256": fs.sha256_file(runner.worker)[0]},
        "states": {"path": str(runner.states), "sha256": fs.sha256_file(runner.states)[0]},
        "device": kind, "realized": [{k: r[k] for k in ("name", "recipe", "tree", "receipt")} for r in realized],
        "refs": sorted({f"entry:{e}" for r in realized for e in r["entries"]}),
        "cpu": cpu_facts(spec), "gpu": gpu.to_json() if gpu else None, "peer_gpu": peer.to_json() if peer else None,
        "locks": {"paths": [str(ldir / n) for n, _ in wanted], "waited_s": round(waited, 3)},
        "limits": {"threads": spec.threads, "cpus": list(spec.cpus) if spec.cpus else None, "nice": spec.nice,
                   "memory_guard": spec.memory, "address_space": spec.address_space if kind == "cpu" else None},
        "memory_guard": guard, "run_dir": str(run_dir),
    }
    code = 0
    if raw is None:
        if guard["tripped"]:
            reason = (f"the memory guard stopped the run: resident memory {guard['stopped']['rss'] / 2**20:.0f} MiB "
                      f"over the limit of {guard['limit'] / 2**20:.0f} MiB")
        else:
            reason = f"the measuring process failed (exit {rc}): " + " | ".join(tail[-5:])
        body.update(status="failed", reason=reason)
        code = 1
    else:
        t = time.monotonic()
        analysis = analyze(raw, runner, kind)
        cls = device_class(kind, raw["environment"])
        dig = check_digests(raw["digests"], runner.digests, cls, record=record_digests, runner_name=runner.name)
        exact = raw["exactness"]
        checks = {"exactness": {"comparisons": exact["comparisons"], "mismatches": len(exact["mismatches"]),
                                "passed": not exact["mismatches"]},
                  "digests": {**{k: v for k, v in dig.items() if k != "mismatches"},
                              "mismatches": len(dig["mismatches"])}}
        failed = bool(exact["mismatches"]) or dig["status"] == "mismatch"
        code = 1 if failed else 0
        results = {"format": 1, "runner": runner.name, "device": kind, "device_class": cls,
                   "environment": raw["environment"], "checks": checks,
                   "exactness_mismatches": exact["mismatches"], "digest_mismatches": dig["mismatches"],
                   "analysis": analysis, "p2p": raw.get("p2p"), "flags": {**analysis["flags"], **raw["flags"],
                                                   "unknown_digest_class": dig["status"] == "unknown-class"},
                   "blocks": raw["blocks"], "samples": raw["samples"]}
        fs.atomic_write_json(run_dir / "results.json", results, pretty=True)
        from hermetic.run.report import write_plot, write_report
        plot = write_plot(run_dir / "plot.png", results, root)
        report_md = write_report(run_dir / "report.md", results, runner, plot)
        timings["analysis"] = round(time.monotonic() - t, 3)
        body.update(status="failed" if failed else "ok", device_class=cls, checks=checks,
                    environment=raw["environment"],
                    summary={"cells": {k: {"median_us": v.get("median"), "rel_iqr": v.get("rel_iqr"), "n": v["n"]}
                                       for k, v in analysis["cells"].items()},
                             "comparisons": [{k: c.get(k) for k in ("name", "a", "b", "ratio", "sign_ci",
                                                                    "sign_confidence", "bootstrap_ci", "decision",
                                                                    "skipped")} for c in analysis["comparisons"]],
                             "repetitions": analysis["repetitions"],
                             "repetitions_recommended": analysis["repetitions_recommended"]},
                    flags=results["flags"], p2p=raw.get("p2p"),
                    results={"path": str(run_dir / "results.json"),
                             "sha256": fs.sha256_file(run_dir / "results.json")[0]},
                    report=str(report_md), plot=str(plot) if plot else None)
        _say_results(reporter, results, dig)
    timings["total"] = round(time.monotonic() - started, 3)
    body["timings"] = timings
    body["outside_root_audit"] = _audit_finish(audit, ldir)
    digest = fs.sha256_bytes(fs.canonical_json(body))[:12]
    receipt = root.receipts / f"run-{runner.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{digest}.json"
    fs.atomic_write_json(receipt, body, pretty=True)
    fs.atomic_write_json(run_dir / "receipt.json", body, pretty=True)
    return RunOutcome(runner.name, code, run_dir, receipt, body)


def _audit(root: Root) -> Any:
    try:
        from hermetic.audit import OutsideRootAudit
    except ImportError:
        return None
    a = OutsideRootAudit(root.path)
    a.start()
    return a


def _audit_finish(audit: Any, ldir: Path) -> dict[str, Any]:
    if audit is None:
        return {"available": False}
    rec: dict[str, Any] = audit.finish()
    lock_prefix = str(ldir) + os.sep
    rec["created"] = [p for p in rec.get("created", []) if not str(p).startswith(lock_prefix)]
    rec["clean"] = not rec["created"]
    rec["excluded"] = [str(ldir) + " (the machine-wide lock folder)"]
    return rec


def _say_results(reporter: Reporter, results: dict[str, Any], dig: dict[str, Any]) -> None:
    a = results["analysis"]
    for label, c in a["cells"].items():
        if c["n"]:
            reporter.event("run-cell", f"  {label:32s} median {c['median']:10.1f} us  IQR {100 * c['rel_iqr']:5.2f} %"
                                       f"  n={c['n']}", label=label)
    for c in a["comparisons"]:
        if "skipped" in c:
            reporter.event("run-compare", f"  {c['name']}: skipped ({c['skipped']})")
            continue
        lo, hi = c["sign_ci"]
        reporter.event("run-compare", f"  {c['name']}: ratio {c['ratio']:.4f} [{lo:.4f}, {hi:.4f}] "
                                      f"({100 * c['sign_confidence']:.1f} %) -> {c['decision']}")
    chk = results["checks"]
    reporter.event("run-checks", f"exactness: {chk['exactness']['comparisons']} comparisons, "
                                 f"{chk['exactness']['mismatches']} mismatches; digests ({dig['class']}): "
                                 f"{dig['status']}")
    if dig["status"] == "unknown-class":
        reporter.warn(dig["message"])
    for m in results["exactness_mismatches"][:20]:
        reporter.event("run-drift", f"  drifted: {m['check']} kernels={m['kernels']} depth={m['depth']} "
                                    f"batch={m['batch']} state={m['state']} mask={m['mask']} row={m['row']} "
                                    f"({m['positions']} positions)")
    for m in dig["mismatches"][:20]:
        reporter.event("run-drift", f"  digest drifted: {m['key']} expected {m['expected'][:16]} "
                                    f"found {m['found'][:16]}")
    f = results["flags"]
    if f.get("aa_noisy"):
        reporter.warn("the A/A control's interval excludes 1: this run is noisy")
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
    reporter.event("run-reps", f"repetitions: {a['repetitions']} run, {a['repetitions_recommended']} recommended "
                               f"for +-{100 * a['target_halfwidth']:.2f} % at the target confidence")
