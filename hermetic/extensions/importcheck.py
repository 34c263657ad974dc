"""After linking: import every module of the recipe together in one fresh interpreter, and prove that the
import created no CUDA context (torch's view, and NVML's list of compute processes where a GPU exists) and
mapped no library from a system CUDA.

It imports from the tree entry the realize holds (pinned in its temp root), never through ``profiles/<name>``:
``gc --drop-root`` beside the realize may remove the profile, never the pinned tree (docs/layout.md, "Who
holds what").

The interpreter may be started while the compiles run (``ImportCheck.start``): it imports torch, the seconds
the check would otherwise add after the links, then waits on a pipe in the root's tmp/ for the tree's folder
and the names of the modules. It is the same fresh interpreter with the same environment either way; nothing
but torch is imported before the names arrive, and the tree's folder goes on its path where PYTHONPATH would
have put it. A realize whose tree holds wheels of its own starts it only when the check runs, with the tree on
PYTHONPATH: torch's import could read those wheels, and they are not laid out before then.

A .pyc cut short in the children's bytecode cache (a disk that filled while a child wrote it) fails every
import of its module with "marshal data too short": the check clears that derived cache and runs once more,
and the realize says so.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from hermetic import fs, procs
from hermetic.errors import WorkFailed
from hermetic.root import Root

_PROBE = procs.PYC_GUARD + r"""
import importlib, importlib.machinery, json, os, sys, time
gate = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)  # never waits, even where hermetic has let go
os.set_blocking(gate, True)  # a read waits for the names while hermetic holds its end, then says EOF
began = time.monotonic()
import torch
torch_s = time.monotonic() - began
names = b""
while not names.endswith(b"\n"):
    chunk = os.read(gate, 65536)
    if not chunk:
        sys.exit(0)  # hermetic did not need the check after all
    names += chunk
waited = time.monotonic()
folder, _, mods = names.decode().rstrip("\n").partition("\t")
mods = mods.split()
if folder not in sys.path:  # where PYTHONPATH puts it: after the script's own entry
    sys.path.insert(1, folder)
for path in [p for p, finder in sys.path_importer_cache.items() if finder is None]:
    del sys.path_importer_cache[path]  # a folder that did not exist yet when this interpreter started
importlib.invalidate_caches()
operators = {}
for lib in [m[1:] for m in mods if m.startswith("@")]:  # a torch operator library: loaded as torch loads one
    before = set(torch._C._dispatch_get_all_op_names())
    torch.ops.load_library(os.path.join(folder, lib))
    operators[lib] = sorted(set(torch._C._dispatch_get_all_op_names()) - before)
not_built = {}
for m in [m for m in mods if not m.startswith("@")]:
    mod = importlib.import_module(m)
    # a module built into the tree must be what the import found: not a package folder or a .py file of the
    # same dotted name, which Python's importer may prefer
    built = [m.replace(".", "/") + s for s in importlib.machinery.EXTENSION_SUFFIXES]
    built = [b for b in built if os.path.isfile(os.path.join(folder, b))]
    found = getattr(mod, "__file__", None)
    if built and (not isinstance(found, str) or os.path.realpath(found) not in
                  [os.path.realpath(os.path.join(folder, b)) for b in built]):
        not_built[m] = [found, built[0]]
res = {"modules": mods, "operators": operators, "cuda_initialized": bool(torch.cuda.is_initialized()),

       "torch_import_s": round(torch_s, 3), "modules_import_s": round(time.monotonic() - waited, 3)}
if not_built:
    res["not_built"] = not_built
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

_SERIAL = itertools.count()


IMPORT_TIMEOUT = 600.0   # seconds the import check may take (torch and the modules import in seconds)


class ImportCheck:
    """The check of one realize: ``start`` (at most once, as early as wanted), then ``run`` or ``cancel``."""

    def __init__(self, root: Root, python: str, profile: Path, env: dict[str, str]) -> None:
        self.root, self.python, self.profile = root, python, profile   # the profile: what messages name
        self.env = dict(env)
        self.env.pop("PYTHONPATH", None)   # the tree's folder is told with the names (or set for a late start)
        self.env.pop("CUDA_VISIBLE_DEVICES", None)  # where a GPU exists, let the import see it: it must not use it
        self.started_early = False
        self.bytecode_cleared = False
        self._gate: Path | None = None
        self._fd: int | None = None
        self._probe: procs.BackgroundProbe | None = None

    def start(self, *, early: bool = True, folder: Path | None = None) -> None:
        """Start the interpreter; it imports torch and waits for the names. ``folder`` (a late start): the
        tree, on PYTHONPATH from the start."""
        if self._probe is not None:
            return
        self.started_early = early
        self.root.tmp.mkdir(parents=True, exist_ok=True)
        self._gate = self.root.tmp / f"import-check-{os.getpid()}-{next(_SERIAL)}"
        os.mkfifo(self._gate, 0o600)
        self._fd = os.open(self._gate, os.O_RDWR)  # a reader and a writer: neither end's open waits
        env = self.env if folder is None else {**self.env, "PYTHONPATH": str(folder)}
        # a damaged bytecode cache is healed here, not by the probe: the names would have to be told again. The
        # package's own code runs here: in the sandbox no unix socket either (an ssh-agent's), as for setup.py
        self._probe = procs.BackgroundProbe([self.python, "-c", _PROBE, str(self._gate)], env=env,
                                            cwd=str(self.root.tmp), name="import-check", heal_bytecode=False,
                                            no_unix_sockets=True)
        self._probe.start()

    def run(self, modules: list[str], tree: str, folder: Path, libraries: tuple[str, ...] = ()) -> dict[str, Any]:
        """The check of ``modules`` in the tree entry ``tree``, imported from ``folder`` (its ``out/``, pinned
        by this process): once per tree (cached by its content-addressed name), so a no-op imports nothing.
        ``libraries``: torch operator libraries (their files in the tree), loaded first with
        ``torch.ops.load_library``; the operators each registered are recorded, and one that registers none
        fails the check."""
        modules = [*(f"@{lib}" for lib in libraries), *modules]
        cache = self.root.cache("imports")
        # the tree, and what is asked of it: the same files checked as a Python module or as an operator
        # library are two checks
        key = tree if not libraries else f"{tree}-{fs.sha256_bytes(' '.join(modules).encode())[:16]}"
        cached = cache.get(key)
        if isinstance(cached, dict):
            self.cancel()
            return cached
        found, output = self._ask(modules, folder)
        if found is None and (prefix := procs.damaged_bytecode(output, self.env)) is not None:
            procs.clear_bytecode(prefix)   # derived; the interpreter that read it is gone: ask a fresh one
            self.bytecode_cleared = True
            found, output = self._ask(modules, folder)
        if found is None:
            hint = "a module that builds but does not import: see the error"
            if "does not define module export function" in output:
                hint = ("a torch operator library (TORCH_LIBRARY, no PyInit_) is not a Python module: say "
                        "python_module = false for its extension")
            raise WorkFailed(f"importing {', '.join(m.lstrip('@') for m in modules)} together failed:\n"
                             f"{output[-3000:]}",
                             where=str(self.profile), hint=hint)
        result: dict[str, Any] = {**found, "started_early": self.started_early}
        problems = []
        for lib, ops in result.get("operators", {}).items():
            if not ops:
                problems.append(f"the operator library {lib} registered no operator")
        for mod, (found, built) in (result.get("not_built") or {}).items():
            problems.append(f"import {mod} ran {found}, not the built module {built}")
        if result["cuda_initialized"]:
            problems.append("torch reports a CUDA context after the import")
        if result["nvml"].get("our_process_listed"):
            problems.append("NVML lists the importing process on a GPU")
        if result["system_cuda"]:
            problems.append(f"libraries from a system CUDA were mapped: {result['system_cuda']}")
        if problems:
            raise WorkFailed("the import check failed: " + "; ".join(problems), where=str(self.profile),
                             hint="a package's file or folder named as a built module: leave it out of the "
                                  "package" if result.get("not_built") else
                             "importing an extension must not touch CUDA or a system CUDA")
        cache.put(key, result)
        return result

    def _ask(self, modules: list[str], folder: Path) -> tuple[dict[str, Any] | None, str]:
        """Tell the interpreter (started now if need be) the folder and the names; its answer."""
        self.start(early=False, folder=folder)
        assert self._fd is not None and self._probe is not None
        try:
            os.write(self._fd, f"{folder}\t{' '.join(modules)}\n".encode())
        except OSError:
            pass  # the interpreter is gone already: its output says why
        try:  # hermetic's end stays open until the answer: a pipe no one holds loses what it was told
            return self._probe.join(timeout=IMPORT_TIMEOUT)
        except procs.TimedOut:
            raise WorkFailed(f"importing {', '.join(m.lstrip('@') for m in modules)} did not finish within "
                             f"{IMPORT_TIMEOUT:g} s: stopped", where=str(self.profile),
                             hint="a module whose import waits or loops (its package's __init__?); an import "
                                  "takes seconds") from None
        finally:
            self._finish()

    def cancel(self) -> None:
        """Not needed (a failed build, a cached check): stop the interpreter now, wherever it is."""
        if self._probe is None:
            return
        self._probe.cancel()
        self._finish()

    def _finish(self) -> None:
        """Let go of the pipe (a waiting interpreter reads EOF and ends), wait for the interpreter, remove the
        pipe."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._probe is not None:
            self._probe.wait()
            self._probe = None
        if self._gate is not None:
            self._gate.unlink(missing_ok=True)
            self._gate = None
