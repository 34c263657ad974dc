"""Qualify the host interpreter: Python, torch, torch's CUDA, C++ ABI, and the pieces of torch's extension
build (include and library folders, nvcc flags, pybind11 ABI defines, the C++ standard).

Asking costs an ``import torch`` (seconds), so the answer is cached by interpreter identity: the stat
fingerprints of the interpreter binary, of torch's version.py and of triton's package (when triton is there:
its version is recorded beside torch's). A no-op realize never imports torch.

Where the cache has no answer, a realize does not wait for the import (``start_qualify``): for the interpreter
running hermetic, torch's files say the same without importing it (its version.py, and the literals of its
cpp_extension.py), so the steps go on with that guess while the probe imports torch beside them. Nothing is
recorded before the probe has confirmed the guess (``Qualifying.confirm``: the build graph asks before the
first object's record, the pipeline before the links and before any error is reported); a guess the probe
contradicts ends the attempt (``GuessWrong``) and the realize starts again with the probe's answer, cached by
then. A guess is only made where every fact can be read: a torch whose build commands carry ABI defines
from ``torch._C`` is probed first, as is a named interpreter.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from typing import Any

from hermetic.errors import PreconditionFailed
from hermetic.interpreter import WHERE, find_python
from hermetic.procs import PYC_GUARD, BackgroundProbe, run_probe
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
    cached = root.cache("interpreters").get(str(exe))
    if isinstance(cached, dict):
        return _checked(cached, exe, need_torch)
    return _probed(root, exe, need_torch, *_run_probe(root, exe))


def _probe_argv(root: Root, exe: Path) -> tuple[list[str], dict[str, str], str]:
    """The probe's command, environment and folder."""
    env = root.child_env()
    # torch's cpp_extension looks for a CUDA at import; give it none to find outside the root
    env.update(CUDA_HOME=str(root.tmp / "no-cuda"), CUDA_PATH=str(root.tmp / "no-cuda"),
               CUDA_VISIBLE_DEVICES="", PYTHONNOUSERSITE="1")
    root.tmp.mkdir(parents=True, exist_ok=True)
    return [str(exe), "-c", PYC_GUARD + _PROBE], env, str(root.tmp)   # .pyc files written whole or not at all


def _run_probe(root: Root, exe: Path) -> tuple[dict[str, Any] | None, str]:
    argv, env, cwd = _probe_argv(root, exe)
    # in a session of its own: it dies with hermetic, like a compiler
    return run_probe(argv, env=env, cwd=cwd)


def _probed(root: Root, exe: Path, need_torch: bool, found: dict[str, Any] | None, output: str) -> dict[str, Any]:
    """The probe's answer, cached and checked."""
    if found is None:
        raise PreconditionFailed(f"the host interpreter {exe} could not be qualified:\n{output[-2000:]}",
                                 hint="check that it starts and that torch imports in it")
    facts: dict[str, Any] = found
    t, tr = facts["torch"], facts.get("triton")
    # valid while the interpreter binary, torch's version.py and triton's __init__.py keep their fingerprints
    root.cache("interpreters").put(str(exe), facts,
                                   [exe, *([t["version_file"]] if t else []), *([tr["file"]] if tr else [])])
    return _checked(facts, exe, need_torch)


class GuessWrong(Exception):
    """The probe contradicted the guess a realize went on with: start again (the cache holds the answer)."""

    def __init__(self, differ: list[str]) -> None:
        super().__init__("the host's qualification differed from what torch's files said ("
                         + ", ".join(differ) + ")")


class Qualifying:
    """The host's facts for one realize (``start_qualify``): ``facts`` now, confirmed by ``confirm``."""

    def __init__(self, root: Root, exe: Path, facts: dict[str, Any], source: str) -> None:
        self.root, self.exe, self.facts = root, exe, facts
        self.source = source                      # "cache", "probe" or "guess"
        self._probe: BackgroundProbe | None = None
        self._probe_s: float | None = None        # how long the probe took, where one ran

    def start(self) -> None:
        """The probe, in a thread of its own (the guess in ``facts`` is used meanwhile)."""
        argv, env, cwd = _probe_argv(self.root, self.exe)
        self._probe = BackgroundProbe(argv, env=env, cwd=cwd, name="qualify")
        self._probe.start()

    @property
    def probe_s(self) -> float | None:
        return self._probe.seconds if self._probe is not None else self._probe_s

    def done(self) -> bool:
        """The probe has answered (or none runs): ``confirm`` will not wait."""
        return self._probe is None or not self._probe.alive()

    def confirm(self) -> dict[str, Any]:
        """The facts, confirmed: waits for the probe where one runs. Its answer is cached; one that differs
        from the guess raises GuessWrong, one without torch PreconditionFailed."""
        if self._probe is None:
            return self.facts
        probe, self._probe = self._probe, None
        result = probe.join()
        self._probe_s = probe.seconds
        found = _probed(self.root, self.exe, True, *result)
        differ = _differ(self.facts, found)
        if differ:
            raise GuessWrong(differ)
        return self.facts

    def cancel(self) -> None:
        """Not needed any more (the realize failed): stop the probe now, started or not."""
        if self._probe is None:
            return
        probe, self._probe = self._probe, None
        probe.cancel()
        self._probe_s = probe.seconds

    def record(self) -> dict[str, Any]:
        """What the receipt says of it."""
        return {"from": self.source, "probe_s": self.probe_s}


def start_qualify(root: Root, python: str | None, *, where: str = WHERE, guess: bool = True) -> Qualifying:
    """The facts of a recipe that builds (torch needed): from the cache; else guessed from torch's files while
    the probe runs, where a guess can be made and ``guess``; else probed now."""
    exe = find_python(python, where)
    cached = root.cache("interpreters").get(str(exe))
    if isinstance(cached, dict):
        return Qualifying(root, exe, _checked(cached, exe, True), "cache")
    guessed = guess_facts(exe) if guess else None
    if guessed is None:
        return Qualifying(root, exe, _probed(root, exe, True, *_run_probe(root, exe)), "probe")
    q = Qualifying(root, exe, guessed, "guess")
    q.start()
    return q


def _differ(guess: dict[str, Any], found: dict[str, Any]) -> list[str]:
    out = [k for k in sorted(set(guess) | set(found)) if k != "torch" and guess.get(k) != found.get(k)]
    t, u = guess.get("torch") or {}, found.get("torch") or {}
    return out + [f"torch.{k}" for k in sorted(set(t) | set(u)) if t.get(k) != u.get(k)]


def guess_facts(exe: Path) -> dict[str, Any] | None:
    """What ``_PROBE`` will print, read from files without importing torch: for the interpreter running
    hermetic only, and None where a file does not say (no torch found, a cpp_extension.py whose literals are
    not there, ABI defines that only ``torch._C`` knows). A guess, confirmed or refuted by the probe."""
    if str(exe) != os.path.abspath(sys.executable):
        return None
    import importlib.metadata
    import importlib.util
    import platform
    import sysconfig
    out: dict[str, Any] = {
        "python": platform.python_version(), "implementation": sys.implementation.name, "executable": str(exe),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "python_include": sysconfig.get_path("include", scheme="posix_prefix"), "machine": platform.machine(),
        "soabi": sysconfig.get_config_var("SOABI"), "torch": None, "triton": None}
    try:
        spec = importlib.util.find_spec("triton")
        if spec is not None and spec.origin:
            out["triton"] = {"version": importlib.metadata.version("triton"), "file": os.path.realpath(spec.origin)}
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None  # the probe says why
    tdir = os.path.dirname(spec.origin)
    try:
        version = _literals(Path(tdir, "version.py").read_text(), ("__version__", "cuda"))
        ce_src = Path(tdir, "utils", "cpp_extension.py").read_text()
        ce = ast.parse(ce_src)
    except (OSError, SyntaxError, ValueError):
        return None
    nvcc = _literals(ce_src, ("COMMON_NVCC_FLAGS",), ce).get("COMMON_NVCC_FLAGS")
    writer = next((ast.get_source_segment(ce_src, n) for n in ce.body if isinstance(n, ast.FunctionDef)
                   and n.name == "_write_ninja_file_to_build_library"), None)
    if "__version__" not in version or not isinstance(nvcc, list) or writer is None \
            or "_get_pybind11_abi_build_flags" in writer or "_get_glibcxx_abi_build_flags" in writer:
        return None
    cuda = version.get("cuda")
    site = os.path.dirname(tdir)
    torch_path = os.path.join(site, "torch")  # cpp_extension's _TORCH_PATH
    nv_inc = os.path.join(site, "nvidia", "cu" + cuda.split(".")[0], "include") if cuda else None
    std = re.findall(r"-std=(c\+\+\d+)", writer)
    out["torch"] = {
        "version": version["__version__"], "cuda": cuda, "dir": tdir,
        "version_file": os.path.realpath(os.path.join(tdir, "version.py")),
        "cxx11_abi": True,  # every torch of these years; the one fact only torch._C knows
        "include": [os.path.join(torch_path, "include"),
                    os.path.join(torch_path, "include", "torch", "csrc", "api", "include")],
        "lib": os.path.join(torch_path, "lib"), "common_nvcc_flags": nvcc, "common_extra": [],
        "std": std[0] if std else "c++17", "nvidia_include": nv_inc if nv_inc and os.path.isdir(nv_inc) else None,
        "cxx": os.environ.get("CXX", "c++")}
    return out


def _literals(src: str, names: tuple[str, ...], tree: ast.Module | None = None) -> dict[str, Any]:
    """The module-level assignments of ``names`` in ``src`` whose values are literals."""
    out: dict[str, Any] = {}
    for node in (tree or ast.parse(src)).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Name) and t.id in names:
                try:
                    out[t.id] = ast.literal_eval(value)
                except ValueError:
                    pass
    return out



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
