"""After linking: import every module of the recipe together in one fresh interpreter, and prove that the
import created no CUDA context (torch's view, and NVML's list of compute processes where a GPU exists) and
mapped no library from a system CUDA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermetic.errors import WorkFailed
from hermetic.procs import run_probe
from hermetic.root import Root

_PROBE = r"""
import importlib, json, os, sys
import torch
mods = sys.argv[1:]
for m in mods:
    importlib.import_module(m)
res = {"modules": mods, "cuda_initialized": bool(torch.cuda.is_initialized())}
maps = open("/proc/self/maps").read().splitlines()
libs = sorted({l.split()[-1] for l in maps if l.split()[-1].startswith("/")})
res["cuda_libraries"] = [l for l in libs if "libcudart" in l or "libcuda.so" in l]
res["system_cuda"] = [l for l in libs if l.startswith(("/usr/local/cuda", "/usr/local/lib/cuda"))]
try:
    import pynvml
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    pids = [p.pid for i in range(n)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
    res["nvml"] = {"gpus": n, "our_process_listed": os.getpid() in pids}
except Exception as e:
    res["nvml"] = {"unavailable": type(e).__name__}
print("hermetic-probe-result: " + json.dumps(res))
"""


def import_check(root: Root, python: str, profile: Path, modules: list[str], tree: str,
                 env: dict[str, str]) -> dict[str, Any]:
    """Run once per tree (cached by its content-addressed name): a no-op realize imports nothing."""
    cache = root.cache("imports")
    cached = cache.get(tree)
    if isinstance(cached, dict):
        return cached
    run_env = {**env, "PYTHONPATH": str(profile)}
    run_env.pop("CUDA_VISIBLE_DEVICES", None)  # where a GPU exists, let the import see it: it must not use it
    found, output = run_probe([python, "-c", _PROBE, *modules], env=run_env, cwd=str(root.tmp))
    if found is None:
        raise WorkFailed(f"importing {', '.join(modules)} together failed:\n{output[-3000:]}",
                         where=str(profile), hint="a module that builds but does not import: see the error")
    result: dict[str, Any] = found
    problems = []
    if result["cuda_initialized"]:
        problems.append("torch reports a CUDA context after the import")
    if result["nvml"].get("our_process_listed"):
        problems.append("NVML lists the importing process on a GPU")
    if result["system_cuda"]:
        problems.append(f"libraries from a system CUDA were mapped: {result['system_cuda']}")
    if problems:
        raise WorkFailed("the import check failed: " + "; ".join(problems), where=str(profile),
                         hint="importing an extension must not touch CUDA or a system CUDA")
    cache.put(tree, result)
    return result
