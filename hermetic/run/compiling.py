"""Compiled kernel sets in the measuring process: their caches, their compiles, and whether they ran compiled.

Like ``child`` (which imports it), this module imports nothing from hermetic: it runs in the host interpreter
inside the realized environment.

* **Caches.** Inductor's, Triton's, CUDA's JIT cache and torch's extensions folder live in the root, one folder
  per torch, CUDA, triton and Python version and CPU capability (``cache_key``): a changed torch or triton
  starts an empty folder instead of reusing an entry it did not write. ``use_kernel_caches`` points the four
  variables there before anything compiles or initialises CUDA.
* **Compiles.** A compiled set (``CompiledSet``) is torch.compile with a counting backend around the real one:
  each backend call is one graph compiled (or loaded from Inductor's cache), each run of a graph is counted,
  and so is each call of the compiled function. ``verdict`` reads these: one graph run per call is compiled;
  more is a graph break; fewer is a (silent) fallback to eager, e.g. dynamo disabled or an error suppressed.
* **Compile events** (``CompileEvents``): backend calls, dynamo frames, Inductor cache misses and hits, and
  files written into the caches, snapshotted between phases, so a compile inside the timed calls is seen.
"""

from __future__ import annotations

import os
import re
import sys
import time
from importlib import metadata
from typing import Any

CACHE_VARIABLES = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR", "nv": "CUDA_CACHE_PATH",
                   "torch_extensions": "TORCH_EXTENSIONS_DIR"}


# caches ----------------------------------------------------------------------------------------------------
def package_version(name: str) -> str | None:
    """An installed distribution's version, without importing it (importing triton costs seconds)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cache_key(torch_version: str, torch_cuda: str | None, triton_version: str | None, python: str,
              cpu_capability: str) -> str:
    """The folder name of one runtime's kernel caches: everything that makes a cached kernel stale. The CPU
    capability torch dispatches to is Inductor's target too (it follows ATEN_CPU_CAPABILITY), and Inductor's
    own graph cache does not tell them apart: an AVX-512 graph was a cache hit under ATEN_CPU_CAPABILITY=avx2."""
    raw = (f"torch{torch_version}-cuda{torch_cuda or 'none'}-triton{triton_version or 'none'}-py{python}"
           f"-{cpu_capability.lower()}")
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)


def use_kernel_caches(base: str) -> dict[str, Any]:
    """Point the kernel caches at ``base/<cache_key>/``: call after ``import torch`` (which reads none of them)
    and before anything compiles or CUDA initialises (its driver reads CUDA_CACHE_PATH once, at cuInit)."""
    import torch
    key = cache_key(torch.__version__, torch.version.cuda, package_version("triton"),
                    f"{sys.version_info[0]}.{sys.version_info[1]}", torch.backends.cpu.get_cpu_capability())
    folders = {}
    real = os.path.join(os.path.realpath(base), key)
    for name, var in CACHE_VARIABLES.items():
        path = os.path.join(base, key, name)
        for place in (os.path.join(base, key), path):   # a link this runner's own earlier process planted (at a
            if os.path.islink(place):                   # key not yet used) would lead to another runner's kernels
                os.unlink(place)
        os.makedirs(path, exist_ok=True)
        if os.path.realpath(path) != os.path.join(real, name):
            raise RuntimeError(f"the kernel cache folder {path} is not a folder of {base}")
        os.environ[var] = path
        folders[var] = path
    return {"key": key, "folder": os.path.join(base, key), "variables": folders}


def cache_files(folder: str | None) -> int:
    """How many files the caches hold (a compile writes some; a run that compiled nothing adds none)."""
    n = 0
    if folder:
        for _, _, files in os.walk(folder):
            n += len(files)
    return n


# compiled sets ---------------------------------------------------------------------------------------------
class CompiledSet:
    """A kernel set whose functions go through torch.compile (the worker calls ``compile(fn)``)."""

    def __init__(self, name: str, backend: str) -> None:
        self.name, self.backend = name, backend
        self.calls = 0            # calls of the compiled functions
        self.graph_runs = 0       # runs of a graph the backend compiled
        self.graphs = 0           # backend calls: graphs compiled or loaded from the cache
        self.compile_s = 0.0
        self.functions = 0

    def _backend(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.backends.registry import lookup_backend
        t = time.monotonic()
        compiled = lookup_backend(self.backend)(gm, example_inputs)
        self.compile_s += time.monotonic() - t
        self.graphs += 1

        def run(*args: Any) -> Any:
            self.graph_runs += 1
            return compiled(*args)
        return run

    def compile(self, fn: Any) -> Any:
        """``fn`` through torch.compile (static shapes: each batch size is its own graph, compiled in the
        checks and warm-up, never in the timed calls), counted."""
        import torch
        compiled = torch.compile(fn, backend=self._backend, dynamic=False)
        self.functions += 1

        def call(*args: Any) -> Any:
            self.calls += 1
            return compiled(*args)
        return call

    def record(self) -> dict[str, Any]:
        return {"backend": self.backend, "functions": self.functions, "calls": self.calls,
                "graph_runs": self.graph_runs, "graphs": self.graphs, "compile_s": round(self.compile_s, 3),
                **verdict(self.calls, self.graph_runs, graph_breaks())}


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph-break reasons so far (empty where dynamo was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return dict(utils.counters["graph_break"]) if utils is not None else {}


def verdict(calls: int, graph_runs: int, breaks: dict[str, int]) -> dict[str, Any]:
    """Whether a compiled set ran as what it claims: exactly one compiled graph per call of its functions.
    A graph break splits a call into more graphs (eager code between them); a fallback to eager runs fewer."""
    if calls == 0:
        return {"status": "not-called", "compiled": False, "reason": "its compiled functions were never called"}
    if graph_runs == calls:
        return {"status": "compiled", "compiled": True, "reason": "every call ran one compiled graph"}
    if graph_runs > calls:  # dynamo's break reasons are the process's, not this set's: they only explain
        why = "; ".join(f"{k} (x{v})" for k, v in sorted(breaks.items())) or "no reason recorded"
        return {"status": "graph-break", "compiled": False,
                "reason": f"graph breaks: {graph_runs} graph runs for {calls} calls ({why}); part of each call "
                          "ran eagerly between graphs"}
    return {"status": "eager-fallback", "compiled": False,
            "reason": f"fallback to eager: {calls - graph_runs} of {calls} calls ran no compiled graph (dynamo "
                      "disabled, or a compile error suppressed)"}


# compile events --------------------------------------------------------------------------------------------
class CompileEvents:
    """Snapshots of everything that counts a compile, taken between phases (never inside a timed block)."""

    def __init__(self, sets: list[CompiledSet], cache_folder: str | None) -> None:
        self.sets, self.cache_folder = sets, cache_folder
        self.last = self.snapshot()
        self.phases: dict[str, dict[str, int]] = {}

    def snapshot(self) -> dict[str, int]:
        snap = {"graphs": sum(s.graphs for s in self.sets), "cache_files": cache_files(self.cache_folder)}
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is not None:
            c = utils.counters
            snap.update(dynamo_frames=int(c["frames"]["total"]),
                        inductor_cache_misses=int(c["inductor"]["fxgraph_cache_miss"]),
                        inductor_cache_hits=int(c["inductor"]["fxgraph_cache_hit"]))
        return snap

    def end_phase(self, phase: str) -> dict[str, int]:
        now = self.snapshot()
        delta = {k: v - self.last.get(k, 0) for k, v in now.items()}
        self.phases[phase] = delta
        self.last = now
        return delta

    def record(self) -> dict[str, Any]:
        timed = self.phases.get("timed", {})
        seen = {k: v for k, v in timed.items() if v}
        total: dict[str, int] = {}
        for d in self.phases.values():
            for k, v in d.items():
                total[k] = total.get(k, 0) + v
        return {"phases": self.phases, "total": total, "timed_clean": not seen,
                "timed_events": seen, "compiled_nothing": not total.get("inductor_cache_misses")
                and not total.get("cache_files")}
