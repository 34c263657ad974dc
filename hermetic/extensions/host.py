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
from dataclasses import dataclass, fields
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


def _strs(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} is not a list of strings")
    return tuple(value)


def _str(value: object, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    return value


@dataclass(frozen=True)
class TorchFacts:
    """torch as the host interpreter has it: what its extension build commands are made of."""
    version: str
    cuda: str | None                    # torch.version.cuda (None: a CPU-only torch)
    dir: str                            # torch's package folder
    version_file: str                   # its version.py, resolved: a no-op and the cache trust its fingerprint
    cxx11_abi: bool
    include: tuple[str, ...]
    lib: str
    common_nvcc_flags: tuple[str, ...]
    common_extra: tuple[str, ...]       # the ABI defines torch adds to every command, where it adds them
    std: str                            # the C++ standard its commands name
    nvidia_include: str | None          # the host's nvidia wheels' headers (cusparse.h, ...), where present
    cxx: str

    @classmethod
    def from_json(cls, t: object) -> TorchFacts:
        if not isinstance(t, dict):
            raise ValueError("torch's facts are not an object")
        cxx11 = t.get("cxx11_abi")
        if not isinstance(cxx11, bool):
            raise ValueError("torch.cxx11_abi is not a boolean")
        return cls(_str(t.get("version"), "torch.version"), _str(t.get("cuda"), "torch.cuda", optional=True),
                   _str(t.get("dir"), "torch.dir"), _str(t.get("version_file"), "torch.version_file"), cxx11,
                   _strs(t.get("include"), "torch.include"), _str(t.get("lib"), "torch.lib"),
                   _strs(t.get("common_nvcc_flags"), "torch.common_nvcc_flags"),
                   _strs(t.get("common_extra"), "torch.common_extra"), _str(t.get("std"), "torch.std"),
                   _str(t.get("nvidia_include"), "torch.nvidia_include", optional=True),
                   _str(t.get("cxx"), "torch.cxx"))

    def to_json(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


@dataclass(frozen=True)
class TritonFacts:
    version: str
    file: str                           # its __init__.py, resolved: the cache trusts its fingerprint

    @classmethod
    def from_json(cls, t: object) -> TritonFacts:
        if not isinstance(t, dict):
            raise ValueError("triton's facts are not an object")
        return cls(_str(t.get("version"), "triton.version"), _str(t.get("file"), "triton.file"))


@dataclass(frozen=True)
class HostFacts:
    """The host interpreter's facts: what ``_PROBE`` prints (its JSON is the interpreters cache's record and the
    receipt's ``host``), read once, typed; only this module reads them by key."""
    python: str
    implementation: str
    executable: str
    ext_suffix: str
    python_include: str
    machine: str
    soabi: str | None
    torch: TorchFacts | None
    triton: TritonFacts | None
    torch_error: str | None = None      # why torch did not import, where it did not

    @classmethod
    def from_json(cls, value: object) -> HostFacts:
        """ValueError for anything but what the probe prints (a cache record of another shape is a miss)."""
        if not isinstance(value, dict):
            raise ValueError("the host's facts are not an object")
        v = value
        return cls(_str(v.get("python"), "python"), _str(v.get("implementation"), "implementation"),
                   _str(v.get("executable"), "executable"), _str(v.get("ext_suffix"), "ext_suffix"),
                   _str(v.get("python_include"), "python_include"), _str(v.get("machine"), "machine"),
                   _str(v.get("soabi"), "soabi", optional=True),
                   TorchFacts.from_json(v["torch"]) if v.get("torch") is not None else None,
                   TritonFacts.from_json(v["triton"]) if v.get("triton") is not None else None,
                   _str(v.get("torch_error"), "torch_error", optional=True))

    def to_json(self) -> dict[str, Any]:
        """Exactly the probe's keys and values (``torch_error`` only where set)."""
        out: dict[str, Any] = {"python": self.python, "implementation": self.implementation,
                               "executable": self.executable, "ext_suffix": self.ext_suffix,
                               "python_include": self.python_include, "machine": self.machine, "soabi": self.soabi,
                               "torch": self.torch.to_json() if self.torch else None,
                               "triton": {"version": self.triton.version, "file": self.triton.file}
                               if self.triton else None}
        if self.torch_error is not None:
            out["torch_error"] = self.torch_error
        return out

    def identity(self) -> HostIdentity:
        """What a built module depends on: a module built for another interpreter or torch is never reused."""
        t = self.torch
        return {"python": self.python, "implementation": self.implementation, "soabi": self.soabi,
                "machine": self.machine, "torch": t.version if t else None, "torch_cuda": t.cuda if t else None,
                "cxx11_abi": t.cxx11_abi if t else None}

    def record(self) -> HostIdentity:
        """``identity`` and triton's version where triton is there: what a module's record says it was built
        with, and what an imported closure is checked against. (Not in the keys: triton does not change what the
        compilers produce, and a key change would rebuild every module once.)"""
        record = self.identity()
        if self.triton is not None:
            record["triton"] = self.triton.version
        return record

    def differences(self, probed: HostFacts) -> list[str]:
        """The facts a guess got wrong: top-level names, then ``torch.<name>``."""
        a, b = self.to_json(), probed.to_json()
        out = [k for k in sorted(set(a) | set(b)) if k != "torch" and a.get(k) != b.get(k)]
        t, u = a.get("torch") or {}, b.get("torch") or {}
        return out + [f"torch.{k}" for k in sorted(set(t) | set(u)) if t.get(k) != u.get(k)]

    def watched(self) -> list[str]:
        """The files whose fingerprints the cached facts are trusted by, beside the interpreter's own."""
        return [*([self.torch.version_file] if self.torch else []), *([self.triton.file] if self.triton else [])]

    def require_torch(self, exe: Path | str) -> TorchFacts:
        """torch's facts; a failed precondition where torch does not import in the interpreter ``exe``."""
        if self.torch is None:
            raise PreconditionFailed(f"torch does not import in the host interpreter {exe}: "
                                     f"{self.torch_error or 'not installed'}",
                                     hint=f"install torch there ({exe} -m pip install torch), or set recipe.python")
        return self.torch



def qualify(root: Root, python: str | None, *, need_torch: bool, where: str = WHERE) -> HostFacts:
    """The host interpreter's facts, from the cache when neither the interpreter, torch nor triton changed."""
    # not resolved: a venv's python is a symlink, and resolving it would lose the venv's site-packages
    exe = find_python(python, where)
    cached = _cached(root, exe)
    if cached is not None:
        return _checked(cached, exe, need_torch)
    return _probed(root, exe, need_torch, *_run_probe(root, exe))


def _cached(root: Root, exe: Path) -> HostFacts | None:
    try:
        return HostFacts.from_json(root.cache("interpreters").get(str(exe)))
    except ValueError:   # none, or a record of another shape: probed again
        return None


def _probe_argv(root: Root, exe: Path) -> tuple[list[str], dict[str, str], str]:
    """The probe's command, environment and folder."""
    env = root.child_env()
    # torch's cpp_extension looks for a CUDA at import; give it none to find outside the root
    env.update(CUDA_HOME=str(root.no_cuda), CUDA_PATH=str(root.no_cuda),
               CUDA_VISIBLE_DEVICES="", PYTHONNOUSERSITE="1")
    root.tmp.mkdir(parents=True, exist_ok=True)
    return [str(exe), "-c", PYC_GUARD + _PROBE], env, str(root.tmp)   # .pyc files written whole or not at all


def _run_probe(root: Root, exe: Path) -> tuple[dict[str, Any] | None, str]:
    argv, env, cwd = _probe_argv(root, exe)
    # in a session of its own: it dies with hermetic, like a compiler
    return run_probe(argv, env=env, cwd=cwd)


def _probed(root: Root, exe: Path, need_torch: bool, found: dict[str, Any] | None, output: str) -> HostFacts:
    """The probe's answer, cached and checked."""
    try:
        facts = HostFacts.from_json(found)
    except ValueError as e:
        why = "" if found is None else f" (its answer: {e})"
        raise PreconditionFailed(f"the host interpreter {exe} could not be qualified{why}:\n{output[-2000:]}",
                                 hint="check that it starts and that torch imports in it") from None
    # valid while the interpreter binary, torch's version.py and triton's __init__.py keep their fingerprints
    root.cache("interpreters").put(str(exe), facts.to_json(), [exe, *facts.watched()])
    return _checked(facts, exe, need_torch)


class GuessWrong(Exception):
    """The probe contradicted the guess a realize went on with: start again (the cache holds the answer)."""

    def __init__(self, differ: list[str]) -> None:
        super().__init__("the host's qualification differed from what torch's files said ("
                         + ", ".join(differ) + ")")


class Qualifying:
    """The host's facts for one realize (``start_qualify``): ``facts`` now, confirmed by ``confirm``."""

    def __init__(self, root: Root, exe: Path, facts: HostFacts, source: str) -> None:
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

    def confirm(self, *, wait: bool = True) -> HostFacts:
        """The facts, confirmed: waits for the probe where one runs (``wait``; else only where it has answered
        already). Its answer is cached; one that differs from the guess raises GuessWrong, one without torch
        PreconditionFailed."""
        if self._probe is None or not (wait or self.done()):
            return self.facts
        probe, self._probe = self._probe, None
        result = probe.join()
        self._probe_s = probe.seconds
        found = _probed(self.root, self.exe, True, *result)
        differ = self.facts.differences(found)
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
    cached = _cached(root, exe)
    if cached is not None:
        return Qualifying(root, exe, _checked(cached, exe, True), "cache")
    guessed = guess_facts(exe) if guess else None
    if guessed is None:
        return Qualifying(root, exe, _probed(root, exe, True, *_run_probe(root, exe)), "probe")
    q = Qualifying(root, exe, guessed, "guess")
    q.start()
    return q


def guess_facts(exe: Path) -> HostFacts | None:
    """What ``_PROBE`` will print, read from files without importing torch: for the interpreter running
    hermetic only, and None where a file does not say (no torch found, a cpp_extension.py whose literals are
    not there, ABI defines that only ``torch._C`` knows). A guess, confirmed or refuted by the probe."""
    if str(exe) != os.path.abspath(sys.executable):
        return None
    import importlib.metadata
    import importlib.util
    import platform
    import sysconfig
    triton = None
    try:
        spec = importlib.util.find_spec("triton")
        if spec is not None and spec.origin:
            triton = TritonFacts(importlib.metadata.version("triton"), os.path.realpath(spec.origin))
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
    try:
        torch = TorchFacts(
            version["__version__"], cuda, tdir, os.path.realpath(os.path.join(tdir, "version.py")),
            True,  # cxx11_abi: every torch of these years; the one fact only torch._C knows
            (os.path.join(torch_path, "include"),
             os.path.join(torch_path, "include", "torch", "csrc", "api", "include")),
            os.path.join(torch_path, "lib"), _strs(nvcc, "COMMON_NVCC_FLAGS"), (), std[0] if std else "c++17",
            nv_inc if nv_inc and os.path.isdir(nv_inc) else None, os.environ.get("CXX", "c++"))
    except ValueError:
        return None
    return HostFacts(platform.python_version(), sys.implementation.name, str(exe),
                     sysconfig.get_config_var("EXT_SUFFIX"), sysconfig.get_path("include", scheme="posix_prefix"),
                     platform.machine(), sysconfig.get_config_var("SOABI"), torch, triton)


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


def _checked(facts: HostFacts, exe: Path, need_torch: bool) -> HostFacts:
    if need_torch:
        facts.require_torch(exe)
    return facts
