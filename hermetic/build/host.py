"""Qualify the host interpreter: Python, torch, torch's CUDA, C++ ABI, and the pieces of torch's extension
build (include and library folders, nvcc flags, pybind11 ABI defines, the C++ standard).

Asking costs an ``import torch`` (seconds), so the answer is cached by interpreter identity: the stat
fingerprints of the interpreter binary, of torch's version.py and of triton's package (when triton is there:
its version is recorded beside torch's). A no-op realize never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hermetic.errors import PreconditionFailed
from hermetic.interpreter import WHERE, find_python
from hermetic.root import Root
from hermetic.store.records import HostIdentity

# Runs inside the host interpreter. It reads torch's own build helpers, so hermetic builds with exactly the
# flags torch.utils.cpp_extension would use for this torch (its private helpers are read defensively). A
# change to what it prints bumps root.CACHES["interpreters"].
_PROBE = r"""
import inspect, json, os, platform, re, sys, sysconfig
out = {"python": platform.python_version(), "implementation": sys.implementation.name,
       "executable": sys.executable, "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
       "python_include": sysconfig.get_path("include", scheme="posix_prefix"), "machine": platform.machine(),
       "soabi": sysconfig.get_config_var("SOABI"), "torch": None, "triton": None}
try:
    import importlib.metadata, importlib.util
    spec = importlib.util.find_spec("triton")  # found, not imported: torch imports triton only when it compiles
    if spec is not None and spec.origin:
        out["triton"] = {"version": importlib.metadata.version("triton"), "file": os.path.realpath(spec.origin)}
except (ImportError, ValueError):
    pass
try:
    import torch
    import torch.utils.cpp_extension as ce
except ImportError as e:
    out["torch_error"] = str(e)
else:
    src = inspect.getsource(ce._write_ninja_file_to_build_library)
    std = re.findall(r"-std=(c\+\+\d+)", src)
    cuda = torch.version.cuda
    site = os.path.dirname(os.path.dirname(torch.__file__))
    nv_inc = os.path.join(site, "nvidia", "cu" + cuda.split(".")[0], "include") if cuda else None
    out["torch"] = {
        "version": torch.__version__, "cuda": cuda, "dir": os.path.dirname(torch.__file__),
        "version_file": os.path.realpath(torch.version.__file__),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "include": ce.include_paths("cpu"), "lib": ce.library_paths("cpu")[0],
        "common_nvcc_flags": list(ce.COMMON_NVCC_FLAGS),
        # the ABI defines torch adds to every command, where this torch version's ninja writer adds them
        "common_extra": (list(ce._get_pybind11_abi_build_flags())
                         if "_get_pybind11_abi_build_flags" in src else [])
                        + (list(ce._get_glibcxx_abi_build_flags())
                           if "_get_glibcxx_abi_build_flags" in src else []),
        "std": std[0] if std else "c++17",
        "nvidia_include": nv_inc if nv_inc and os.path.isdir(nv_inc) else None,
        "cxx": ce.get_cxx_compiler(),
    }
print("hermetic-probe-result: " + json.dumps(out))
"""


def qualify(root: Root, python: str | None, *, need_torch: bool, where: str = WHERE) -> dict[str, Any]:
    """The host interpreter's facts, from the cache when neither the interpreter, torch nor triton changed."""
    # not resolved: a venv's python is a symlink, and resolving it would lose the venv's site-packages
    exe = find_python(python, where)
    cache = root.cache("interpreters")
    cached = cache.get(str(exe))
    if isinstance(cached, dict):
        return _checked(cached, exe, need_torch)
    env = root.child_env()
    # torch's cpp_extension looks for a CUDA at import; give it none to find outside the root
    env.update(CUDA_HOME=str(root.tmp / "no-cuda"), CUDA_PATH=str(root.tmp / "no-cuda"),
               CUDA_VISIBLE_DEVICES="", PYTHONNOUSERSITE="1")
    from hermetic.procs import run_probe  # in a session of its own: it dies with hermetic, like a compiler
    found, output = run_probe([str(exe), "-c", _PROBE], env=env, cwd=str(root.tmp))
    if found is None:
        raise PreconditionFailed(f"the host interpreter {exe} could not be qualified:\n{output[-2000:]}",
                                 hint="check that it starts and that torch imports in it")
    facts: dict[str, Any] = found
    t, tr = facts["torch"], facts.get("triton")
    # valid while the interpreter binary, torch's version.py and triton's __init__.py keep their fingerprints
    cache.put(str(exe), facts, [exe, *([t["version_file"]] if t else []), *([tr["file"]] if tr else [])])
    return _checked(facts, exe, need_torch)



def _checked(facts: dict[str, Any], exe: Path, need_torch: bool) -> dict[str, Any]:
    if need_torch and facts.get("torch") is None:
        raise PreconditionFailed(f"torch does not import in the host interpreter {exe}: "
                                 f"{facts.get('torch_error', 'not installed')}",
                                 hint=f"install torch there ({exe} -m pip install torch), or set recipe.python")
    return facts


def host_record(facts: dict[str, Any]) -> HostIdentity:
    """``host_identity`` and triton's version where triton is there: what a module's record says it was built
    with, and what an imported closure is checked against. (Not in the keys: triton does not change what the
    compilers produce, and a key change would rebuild every module once.)"""
    record = host_identity(facts)
    if facts.get("triton"):
        record["triton"] = facts["triton"]["version"]
    return record


def host_identity(facts: dict[str, Any]) -> HostIdentity:
    """What a built module depends on: a module built for another interpreter or torch is never reused."""
    t = facts.get("torch") or {}
    return {"python": facts["python"], "implementation": facts["implementation"], "soabi": facts.get("soabi"),
            "machine": facts["machine"], "torch": t.get("version"), "torch_cuda": t.get("cuda"),
            "cxx11_abi": t.get("cxx11_abi")}
