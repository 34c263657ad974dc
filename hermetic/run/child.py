"""The measuring process of `hermetic run`: runs inside the realized environment, under the run's limits.

``python -m hermetic.run.child PLAN.json`` imports torch, the realized modules and the worker, then
1. checks exactness (switch graph vs original on every state, depth and batch; greedy rows of mixed masks;
   zero q payloads) and computes the batch-1 digests;
2. measures: warm-ups, then cells interleaved over the repetitions with the order reversed every repetition,
   the first call of each block discarded; CUDA events bracket each whole call on a GPU (a monotonic clock on
   a CPU); NVML clock and clock-event-reason snapshots around every call, counters around every block;
3. writes every raw sample and the checks to the results file named in the plan.
Compiled kernel sets (torch.compile) and the kernel caches are ``compiling``'s (a sibling that imports nothing
from hermetic either): every compile is counted per phase, and one inside the timed calls is reported.
Progress goes to stdout as JSON lines; the parent (hermetic.run.pipeline) relays them and does the statistics.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import time
from typing import Any

from hermetic.run.compiling import CompiledSet, CompileEvents, package_version, use_kernel_caches

# The clock-event reasons that make a sample invalid (a thermal or hardware slowdown, a power brake, a board or
# reliability limit) and the one that only flags it (the software power cap), by nvidia-ml-py's names: it names
# BoardLimit and Reliability only as nvmlClocksThrottleReason*. NVML's bit stands in where the bindings lack a name.
INVALIDATING_REASONS = {"nvmlClocksEventReasonHwSlowdown": 0x8, "nvmlClocksEventReasonSwThermalSlowdown": 0x20,
                        "nvmlClocksEventReasonHwThermalSlowdown": 0x40,
                        "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x80,
                        "nvmlClocksThrottleReasonBoardLimit": 0x200, "nvmlClocksThrottleReasonReliability": 0x400}
POWER_CAP_REASONS = {"nvmlClocksEventReasonSwPowerCap": 0x4}


# set in every measuring process's environment (hermetic.run.pipeline.child_env) and recorded from it: no NVLink
# SHARP / multicast objects, which the lent pairs of GPUs cannot create
NO_MULTICAST = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def reason_mask(nv: Any, reasons: dict[str, int]) -> int:
    """The bits of ``reasons`` from the bindings' constants (``nv``: pynvml, or None where NVML is absent)."""
    mask = 0
    for name, bit in reasons.items():
        mask |= int(getattr(nv, name, bit))
    return mask


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Nvml:
    """Read-only NVML snapshots of the run's GPUs, rank 0's card first (None-safe where NVML is absent). A pair
    reads both cards: a call's clock is rank 0's card's, its clock-event reasons those of either card, the
    processes those on either; a block's counters are rank 0's card's with the peer's under ``peer``."""

    def __init__(self, uuids: list[str] | str | None) -> None:
        self.nv: Any = None
        self.h: Any = None
        self.handles: list[Any] = []
        self.invalidating = self.power_cap = 0  # no NVML, no reasons: every sample stands
        wanted = [u for u in ([uuids] if isinstance(uuids, str) else (uuids or [])) if u]
        if not wanted:
            return
        try:
            import pynvml as nv
            nv.nvmlInit()
            self.handles = [nv.nvmlDeviceGetHandleByUUID(u) for u in wanted]
            self.h = self.handles[0]
            self.nv = nv
        except Exception as e:  # the run still measures; the results say NVML was missing
            say("warning", message=f"NVML unavailable in the measuring process: {e}")
            self.handles = []
            return
        self.invalidating = reason_mask(nv, INVALIDATING_REASONS)
        self.power_cap = reason_mask(nv, POWER_CAP_REASONS)

    def call_snapshot(self) -> tuple[int | None, int | None]:
        if self.nv is None:
            return None, None
        reasons = 0
        for h in self.handles:
            reasons |= self.nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        return self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM), reasons

    def pids(self) -> set[int]:
        if self.nv is None:
            return set()
        return {int(p.pid) for h in self.handles for p in self.nv.nvmlDeviceGetComputeRunningProcesses(h)}

    def block_counters(self) -> dict[str, Any]:
        if self.nv is None:
            return {}
        out = self._counters(self.handles[0])
        if len(self.handles) > 1:
            out["peer"] = self._counters(self.handles[1])
            out["processes"] = sorted(set(out["processes"]) | set(out["peer"]["processes"]))
            out["power_w"] = max(out["power_w"], out["peer"]["power_w"])  # the settle pause follows the hotter card
        return out

    def _counters(self, h: Any) -> dict[str, Any]:
        nv = self.nv
        out: dict[str, Any] = {"power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000,
                               "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)}
        for name, policy in (("power", nv.NVML_PERF_POLICY_POWER), ("thermal", nv.NVML_PERF_POLICY_THERMAL)):
            try:
                out[f"violation_{name}_ns"] = nv.nvmlDeviceGetViolationStatus(h, policy).violationTime
            except nv.NVMLError:
                out[f"violation_{name}_ns"] = None
        try:
            out["energy_mj"] = nv.nvmlDeviceGetTotalEnergyConsumption(h)
        except nv.NVMLError:
            out["energy_mj"] = None
        out["processes"] = sorted(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
        return out


def load_worker(plan: dict[str, Any]) -> tuple[Any, Any]:
    """The worker's module; its folder goes last on the import path (realized modules stay first)."""
    folder = os.path.dirname(os.path.abspath(plan["worker"]))
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location("hermetic_run_worker", plan["worker"])
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the worker from {plan['worker']}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module, getattr(module, plan["factory"])


def outputs_bits(out: dict[str, Any]) -> dict[str, Any]:
    """Outputs as exact bit patterns (float32 viewed as int32), on the CPU."""
    import torch
    bits = {}
    for k, t in out.items():
        c = t.detach().cpu().contiguous()
        bits[k] = c.view(torch.int32) if c.dtype == torch.float32 else c.clone()
    return bits


def tensor_bytes(t: Any) -> bytes:
    """The raw bytes of a contiguous CPU tensor (no numpy needed)."""
    import ctypes
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def check_exactness(plan: dict[str, Any], worker: Any, states: list[Any], calls: dict[tuple, Any],
                    phase: str = "checks", suffix: str = ""
                    ) -> tuple[list[dict[str, Any]], dict[str, str], int]:
    """(mismatches, batch-1 digests, comparisons made); a pair's keys end in ``suffix`` (``@pair``) and its
    mismatches name the ranks."""
    import torch
    mismatches: list[dict[str, Any]] = []
    digests: dict[str, str] = {}
    made = 0
    n = len(states)
    depths, batches, kernels = plan["check_depths"], plan["check_batches"], plan["kernels"]
    total = len(kernels) * len(depths) * len(batches) * n
    done = 0
    say("progress", phase=phase, done=0, total=total)

    def get(graph: str, depth: int, batch: int, k: str) -> Any:
        key = (graph, depth, batch, k)
        if key not in calls:
            calls[key] = worker.prepare(graph=graph, depth=depth, batch=batch, kernels=k)
        return calls[key]

    def differ(kind: str, a: torch.Tensor, b: torch.Tensor, where: dict[str, Any], rows: list[int]) -> None:
        for r in rows:
            if not torch.equal(a[r], b[r]):
                mismatches.append({**where, "check": kind, "row": r,
                                   "positions": int((a[r] != b[r]).sum().item())})

    backend = plan.get("compile", {})
    for k in kernels:
        for depth in depths:
            for batch in batches:
                orig, sw = get("original", depth, batch, k), get("switch", depth, batch, k)
                if k in backend:  # the first calls of a shape compile it: tens of seconds with nothing else to say
                    say("progress", phase=phase, done=done, total=total,
                        doing=f"compiling kernel set {k} (torch.compile, {backend[k].capitalize()}) for depth "
                              f"{depth}, batch {batch}")
                for s in range(n):
                    rows = [states[(s + j) % n] for j in range(batch)]
                    where = {"kernels": k + suffix, "depth": depth, "batch": batch, "state": s}
                    orig.load(rows, [0] * batch)
                    orig()
                    ref = outputs_bits(orig.outputs())
                    if batch == 1:
                        h = hashlib.sha256()
                        for name in ("proposals", "confidence"):
                            h.update(name.encode() + tensor_bytes(ref[name]))
                        digests[f"s{s:02d}/d{depth}/{k}{suffix}"] = h.hexdigest()
                    sw.load(rows, [0] * batch)
                    sw()
                    got = outputs_bits(sw.outputs())
                    all_rows = list(range(batch))
                    for name in ("proposals", "confidence"):
                        differ(f"all-greedy {name}", ref[name], got[name], {**where, "mask": "greedy"}, all_rows)
                    made += 1
                    if batch >= 2:
                        for first in (0, 1):
                            bits = [(j + first) % 2 for j in range(batch)]
                            sw.load(rows, bits)
                            sw()
                            got = outputs_bits(sw.outputs())
                            greedy_rows = [j for j in range(batch) if not bits[j]]
                            w = {**where, "mask": "alternate-odd" if first else "alternate"}
                            for name in ("proposals", "confidence"):
                                differ(f"greedy-row {name}", ref[name], got[name], w, greedy_rows)
                            q = got["q"]
                            for j in greedy_rows:
                                nz = int((q[j] != 0).sum().item())
                                if nz:
                                    mismatches.append({**w, "check": "greedy-row q payload not zero", "row": j,
                                                       "positions": nz})
                            made += 1
                    done += 1
                    say("progress", phase=phase, done=done, total=total)
    return mismatches, digests, made


def measure(plan: dict[str, Any], workers: dict[str, Any], states: list[Any], nvml: Nvml, events: CompileEvents
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(raw samples, per-block records, run flags); ``events`` closes the warm-up and the timed phase.
    ``workers``: label suffix -> worker ("" the solo one; "@pair" the pair's, whose cells are measured beside
    the solo ones, interleaved in the same blocks' order, so the pair-vs-solo ratios are paired)."""
    import torch
    cuda = plan["device"] == "cuda"
    labels: list[tuple[str, Any]] = []
    streams: dict[str, list[Any]] = {}  # label -> the stream of each card its call runs on (CUDA events on each)
    for cell in plan["cells"]:
        rows = [states[j % len(states)] for j in range(cell["batch"])]
        for suffix, worker in workers.items():
            for k in plan["kernels"]:
                c = worker.prepare(graph=cell["graph"], depth=cell["depth"], batch=cell["batch"], kernels=k)
                c.load(rows, cell["mask_bits"])
                label = f"{cell['name']}/{k}{suffix}"
                labels.append((label, c))
                streams[label] = getattr(worker, "timing_streams", lambda: [])() if cuda else []
                if cell["name"] == plan["aa_cell"] and k == plan["kernels"][0]:
                    labels.append((label + "#aa", c))  # the same call, measured under a second label
                    streams[label + "#aa"] = streams[label]
    proto = plan["protocol"]
    flushes: list[Any] = []
    if cuda and plan.get("l2_flush"):
        for d in range(torch.cuda.device_count()):  # each card of the run (one, or a pair's two)
            l2 = torch.cuda.get_device_properties(d).L2_cache_size
            flushes.append(torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=f"cuda:{d}"))
    card_events: dict[int, tuple[Any, Any]] = {}  # a start and an end event per stream, reused call after call

    def events_on(stream: Any) -> tuple[Any, Any]:
        key = int(stream.cuda_stream)
        if key not in card_events:
            with torch.cuda.device(stream.device):
                card_events[key] = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        return card_events[key]

    def one(label: str, call: Any) -> tuple[float, float, int | None, int | None, int | None, int | None,
                                             list[float] | None]:
        for f in flushes:
            f.zero_()
            torch.cuda.synchronize(f.device)
        clk0, rsn0 = nvml.call_snapshot()
        t0 = time.perf_counter_ns()
        cards = None
        if cuda:
            # CUDA events on each card the call runs on: rank 0's card's pair brackets the whole call (its end
            # is recorded after rank 0's stream joined rank 1's, host gaps included); the peer's, rank 1's part
            on = streams.get(label) or [torch.cuda.current_stream()]
            evs = [events_on(st) for st in on]
            for st, (a, _) in zip(on, evs, strict=True):
                a.record(st)
            call()
            for st, (_, b) in zip(on, evs, strict=True):
                b.record(st)
            for _, b in evs:
                b.synchronize()
            t1 = time.perf_counter_ns()
            times = [a.elapsed_time(b) * 1000.0 for a, b in evs]
            dev_us = times[0]
            cards = times if len(times) > 1 else None
        else:
            call()
            t1 = time.perf_counter_ns()
            dev_us = (t1 - t0) / 1000.0
        clk1, rsn1 = nvml.call_snapshot()
        return dev_us, (t1 - t0) / 1000.0, clk0, clk1, rsn0, rsn1, cards

    # warm-up: every label, at least warmup_calls each and warmup_seconds in all
    say("progress", phase="warm-up", done=0, total=None)
    t_warm = time.monotonic()
    t_end = t_warm + proto["warmup_seconds"]
    rounds = 0
    while rounds < proto["warmup_calls"] or time.monotonic() < t_end:
        for label, c in labels:
            one(label, c)
        rounds += 1
        say("progress", phase="warm-up", done=rounds, total=None)
        if rounds > 10_000:
            break
    events.end_phase("warm-up")  # every compile belongs here or before: the timed phase must add none

    samples: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    flags: dict[str, Any] = {"other_process_seen": [], "settles": 0, "warmup_s": round(time.monotonic() - t_warm, 3)}
    mine = set(plan.get("own_gpu_pids", [])) | {os.getpid()}
    reps = proto["repetitions"]
    total_blocks = reps * len(labels)
    say("progress", phase="measure", done=0, total=total_blocks)
    for rep in range(reps):
        order = labels if rep % 2 == 0 else labels[::-1]
        for pos, (label, call) in enumerate(order):
            before = nvml.block_counters()
            gc.collect()
            gc.disable()
            try:
                for i in range(proto["calls"] + 1):
                    dev_us, host_us, clk0, clk1, rsn0, rsn1, cards = one(label, call)
                    reasons = (rsn0 or 0) | (rsn1 or 0)
                    sample = {"label": label, "rep": rep, "pos": pos, "call": i, "discarded": i == 0,
                              "time_us": dev_us, "host_us": host_us,
                              "sm_clock_mhz": [clk0, clk1], "reasons": reasons,
                              "valid": not reasons & nvml.invalidating,
                              "power_capped": bool(reasons & nvml.power_cap)}
                    if cards is not None:
                        sample["card_us"] = cards  # each card's events: rank 0's (the whole call), rank 1's
                    samples.append(sample)
            finally:
                gc.enable()
            after = nvml.block_counters()
            block = {"label": label, "rep": rep, "pos": pos, "before": before, "after": after}
            others = sorted(set(after.get("processes", [])) - mine) if after else []
            if others:
                flags["other_process_seen"].append({"rep": rep, "label": label, "pids": others})
            heavy = bool(after) and (after["power_w"] >= plan["heavy_power_w"]
                                     or any(s["power_capped"] for s in samples[-proto["calls"]:]))
            if heavy and plan["settle_seconds"] > 0:
                time.sleep(plan["settle_seconds"])
                flags["settles"] += 1
            block["settled"] = heavy
            blocks.append(block)
            say("progress", phase="measure", done=len(blocks), total=total_blocks)
    events.end_phase("timed")
    return samples, blocks, flags


def measure_p2p(p2p: Any, size: int, reps: int) -> dict[str, Any]:
    """Peer-copy bandwidth through the P2P extension against the copy engine (torch's cross-device copy_)."""
    import torch
    if torch.cuda.device_count() < 2:
        return {"skipped": "one GPU visible"}
    access = bool(p2p.can_access_peer(0, 1)) and bool(p2p.can_access_peer(1, 0))
    enabled = access and bool(p2p.enable_peer_access(0, 1)) and bool(p2p.enable_peer_access(1, 0))
    src = torch.arange(size // 4, dtype=torch.int32, device="cuda:0").view(torch.uint8)
    dst = torch.empty(size, dtype=torch.uint8, device="cuda:1")
    local = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    stream = torch.cuda.current_stream(0)

    def timed(fn: Any) -> dict[str, Any]:
        fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(0):
                a.record(stream)
                fn()
                b.record(stream)
            b.synchronize()
            torch.cuda.synchronize(1)
            times.append(a.elapsed_time(b) / 1000)
        times.sort()
        med = times[len(times) // 2]
        return {"median_s": med, "gb_per_s": size / med / 1e9, "min_s": times[0], "max_s": times[-1]}

    out: dict[str, Any] = {"bytes": size, "repetitions": reps, "peer_access": access, "peer_enabled": enabled}
    with torch.cuda.device(0):
        out["extension_peer_copy"] = timed(lambda: p2p.peer_copy(dst, src, stream.cuda_stream))
        dst.zero_()
        p2p.peer_copy(dst, src, stream.cuda_stream)
        torch.cuda.synchronize(0)
        out["peer_copy_exact"] = bool(torch.equal(dst.to("cuda:0"), src))
        out["copy_engine"] = timed(lambda: dst.copy_(src, non_blocking=True))
        out["extension_local_copy"] = timed(lambda: p2p.local_copy(local, src, stream.cuda_stream))
        out["copy_engine_local"] = timed(lambda: local.copy_(src, non_blocking=True))
    out["peer_vs_copy_engine"] = out["extension_peer_copy"]["gb_per_s"] / out["copy_engine"]["gb_per_s"]
    out["note"] = ("peer access enabled: direct NVLink/PCIe peer copies" if enabled else
                   "peer access not available: cudaMemcpyPeerAsync stages the copy through the host")
    return out


def measure_cpu_pair_copy(p2p: Any, size: int, reps: int) -> dict[str, Any]:
    """A pair on the CPU: the P2P extension's CPU path (``cpu_copy``, what carries the ranks' exchange there)
    checked bit for bit on a pattern of odd length and timed against torch's ``copy_``."""
    import torch
    n = size // 4 + 3  # not a multiple of any vector width: the tail is copied too
    src = torch.arange(n, dtype=torch.int32).mul_(-1640531535)  # every byte differs from its neighbours
    dst = torch.zeros_like(src)

    def timed(fn: Any) -> dict[str, Any]:
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        times.sort()
        med = times[len(times) // 2]
        return {"median_s": med, "gb_per_s": src.nbytes / med / 1e9, "min_s": times[0], "max_s": times[-1]}

    p2p.cpu_copy(dst, src)
    exact = bool(torch.equal(dst, src))
    out: dict[str, Any] = {"bytes": src.nbytes, "repetitions": reps, "transport": "cpu", "peer_access": None,
                           "peer_enabled": None, "peer_copy_exact": exact,
                           "extension_peer_copy": timed(lambda: p2p.cpu_copy(dst, src)),
                           "copy_engine": timed(lambda: dst.copy_(src))}
    out["peer_vs_copy_engine"] = out["extension_peer_copy"]["gb_per_s"] / out["copy_engine"]["gb_per_s"]
    out["note"] = ("both ranks on the CPU: the exchange is the extension's cpu_copy (host memory), compared "
                   "with torch's copy_")
    return out


def pair_vs_solo(digests: dict[str, str]) -> dict[str, Any]:
    """The pair's batch-1 digests against the solo run's of the same state, depth and kernel set: both ranks on
    cards of one class compute the same operations on the same bits, and the exchange copies them exactly."""
    keys = sorted(k for k in digests if k.endswith("@pair"))
    differ = [k[:-len("@pair")] for k in keys if digests.get(k[:-len("@pair")]) != digests[k]]
    return {"compared": len(keys), "mismatches": differ}


def cpu_vendor() -> str:
    """The CPU's vendor (``vendor_id``: GenuineIntel, AuthenticAMD): torch's CPU kernels (MKL, oneDNN) take other
    code paths on another vendor's CPU of the same instruction set, so the same ISA gives other bits there."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    vendor = line.split(":", 1)[1].strip()
                    return {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(
                        vendor, "".join(c for c in vendor.lower() if c.isalnum()) or "unknown")
    except OSError:
        pass
    return "unknown"


def kernel_set_facts(kernels: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What each measured kernel set is: torch's ops, a module (and whether it holds Triton kernels: its own
    ``USES_TRITON``), or a compiled set and its backend (the digests' class follows it)."""
    out: dict[str, dict[str, Any]] = {}
    for k, mod in kernels.items():
        if isinstance(mod, CompiledSet):
            out[k] = {"compile": mod.backend}
        elif mod is None:
            out[k] = {"ops": "torch"}
        else:
            out[k] = {"module": mod.__name__, "triton": bool(getattr(mod, "USES_TRITON", False))}
    return out


def environment_facts(plan: dict[str, Any], modules: dict[str, Any], kernels: dict[str, Any]) -> dict[str, Any]:
    import platform

    import torch
    facts: dict[str, Any] = {
        "python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "triton": package_version("triton"), "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_vendor": cpu_vendor(),
        "affinity": sorted(os.sched_getaffinity(0)), "nice": os.nice(0),
        "modules": {name: getattr(m, "__file__", None) for name, m in modules.items()},
        "kernel_sets": kernel_set_facts(kernels),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING",
                                               *NO_MULTICAST,
                                               "ATEN_CPU_CAPABILITY", "CUDA_CACHE_PATH", "TRITON_CACHE_DIR",
                                               "TORCHINDUCTOR_CACHE_DIR", "HOME", "TMPDIR", "PYTHONPATH",
                                               "CUDA_HOME", "PATH")},
    }
    if plan["device"] == "cuda":
        p = torch.cuda.get_device_properties(0)
        facts.update(gpu_name=p.name, capability=f"{p.major}.{p.minor}", l2_bytes=p.L2_cache_size,
                     sm_count=p.multi_processor_count)
        if plan.get("pair") and torch.cuda.device_count() > 1:
            q = torch.cuda.get_device_properties(1)
            facts.update(peer_gpu_name=q.name, peer_capability=f"{q.major}.{q.minor}")
    return facts


def load_kernels(plan: dict[str, Any], modules: dict[str, Any]
                 ) -> tuple[dict[str, Any], list[CompiledSet], dict[str, str]]:
    """(kernel set -> module, None for torch's ops, or a CompiledSet; the compiled sets; skipped set -> why).
    A module that says it cannot run here (``unavailable(device)`` returns a reason: no GPU, no triton) is
    skipped with that reason; any other import failure is the run's."""
    kernels: dict[str, Any] = {}
    compiled: list[CompiledSet] = []
    skipped: dict[str, str] = {}
    for k in plan["kernels"]:
        mod = plan["modules"][k]
        if k in plan.get("compile", {}):
            kernels[k] = CompiledSet(k, plan["compile"][k])
            compiled.append(kernels[k])
            continue
        kernels[k] = importlib.import_module(mod) if mod else None
        why = getattr(kernels[k], "unavailable", lambda device: None)(plan["device"])
        if why:
            skipped[k] = why
            del kernels[k]
            say("warning", message=f"kernel set {k} ({mod}) skipped: {why}")
            continue
        if mod:
            modules[mod] = kernels[k]
    return kernels, compiled, skipped


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        plan = json.load(f)
    say("progress", phase="load", done=0, total=1)  # importing torch and the modules takes seconds
    t_start = time.monotonic()
    import torch
    caches = use_kernel_caches(plan["kernel_cache"]) if plan.get("kernel_cache") else None
    torch.set_num_threads(plan["threads"])
    modules: dict[str, Any] = {}
    folder = os.path.dirname(os.path.abspath(plan["worker"]))  # kernel modules may sit beside the worker
    if folder not in sys.path:
        sys.path.append(folder)
    kernels, compiled, skipped = load_kernels(plan, modules)
    plan["kernels"] = [k for k in plan["kernels"] if k in kernels]
    events = CompileEvents(compiled, caches["folder"] if caches else None)
    p2p = importlib.import_module(plan["p2p"])
    modules[plan["p2p"]] = p2p
    wmod, factory = load_worker(plan)
    device = plan["device"]
    if device == "cuda":
        torch.cuda.set_device(0)
    nvml = Nvml(plan.get("gpu_uuids") or plan.get("gpu_uuid"))
    before = nvml.pids()
    worker = factory({"params": plan["params"], "device": device, "kernels": kernels, "p2p": p2p})
    workers = {"": worker}
    pair = plan.get("pair")
    if pair:  # rank 1 on its own card: a second worker, measured and checked beside the solo one
        pair = dict(pair)
        i0, i1 = (torch.device(d).index or 0 for d in pair["devices"])
        if device == "cuda" and i0 == i1:  # both ranks on one card (a smoke test of the code path): no link
            pair.update(peer_access=None, peer_enabled=None, transport="one card")
        elif device == "cuda":  # peer access where the link allows it, before any exchange; else host-staged
            access = bool(p2p.can_access_peer(i0, i1)) and bool(p2p.can_access_peer(i1, i0))
            enabled = access and bool(p2p.enable_peer_access(i0, i1)) and bool(p2p.enable_peer_access(i1, i0))
            pair.update(peer_access=access, peer_enabled=enabled,
                        transport="peer access (direct copies)" if enabled else "staged through the host")
        else:
            pair.update(peer_access=None, peer_enabled=None, transport="cpu")
        peer_device = pair["devices"][1]
        pair_worker = factory({"params": plan["params"], "device": pair["devices"][0], "kernels": kernels,
                               "p2p": p2p, "peer_device": peer_device})
        if getattr(pair_worker, "peer_device", None) != peer_device:
            raise SystemExit(f"the worker's factory {plan['factory']} ignored the pair's peer_device "
                             f"{peer_device!r}: pass ctx['peer_device'] on (runner/draft_worker.py's make_worker)")
        workers["@pair"] = pair_worker
    if device == "cuda":
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
    # NVML may report host pids inside a container: our own context is whatever appeared with it
    plan["own_gpu_pids"] = sorted(nvml.pids() - before)
    states = wmod.load_states(plan["states"])
    events.end_phase("load")
    say("progress", phase="load", done=1, total=1)
    calls: dict[tuple, Any] = {}
    t0 = time.monotonic()
    mismatches, digests, made = check_exactness(plan, worker, states, calls)
    pair_result: dict[str, Any] | None = None
    if pair:
        more, pair_digests, pair_made = check_exactness(plan, workers["@pair"], states, {}, "pair checks", "@pair")
        mismatches += [{**m, "ranks": "pair"} for m in more]
        digests.update(pair_digests)
        made += pair_made
        pair_result = {**pair, "equal_to_solo": pair_vs_solo(digests)}
    t_checks = time.monotonic() - t0
    events.end_phase("checks")  # the first calls of every shape: most compiling happens here
    samples, blocks, flags = measure(plan, workers, states, nvml, events)
    p2p_result = None
    if device == "cuda" and plan.get("peer"):
        say("progress", phase="p2p", done=0, total=1)
        p2p_result = measure_p2p(p2p, plan["peer_bytes"], 20)
    elif pair:
        say("progress", phase="p2p", done=0, total=1)
        p2p_result = measure_cpu_pair_copy(p2p, plan["peer_bytes"] >> 4, 20)
    if p2p_result is not None:
        say("progress", phase="p2p", done=1, total=1)
    results = {"format": 1, "environment": environment_facts(plan, modules, kernels), "p2p": p2p_result,
               "pair": pair_result,
               "exactness": {"comparisons": made, "mismatches": mismatches, "seconds": round(t_checks, 3)},
               "digests": digests, "samples": samples, "blocks": blocks,
               "flags": {**flags, "own_gpu_pids": plan["own_gpu_pids"], "gpu_pids_before": sorted(before)},
               "measure_seconds": round(time.monotonic() - t0 - t_checks, 3),
               "kernels": plan["kernels"], "kernels_skipped": skipped,
               "compile": {"sets": {c.name: c.record() for c in compiled}, **events.record(),
                           "caches": caches,
                           "warmup_seconds": round(t0 + t_checks - t_start + flags["warmup_s"], 3)}}
    # The one file this process writes, atomically by hand: it imports nothing from hermetic (it runs in the host
    # interpreter inside the realized environment, where hermetic.fs is not its library).
    tmp = plan["results"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f)
    os.replace(tmp, plan["results"])
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
