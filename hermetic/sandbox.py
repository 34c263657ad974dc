"""The sandbox: hermetic's children run where only the scratch root is writable.

Where bubblewrap works (asked per bwrap binary, kernel, user, root and sandbox command line; a yes is cached in
the root's ``state/sandbox-v1``, a no asked again by the next command), every child a realize, a run or
``verify`` starts goes through it (``procs.confined``): the probes of the interpreter and torch, ``patch``,
ninja and every compiler under it, the linker, the import check, ``verify --rebuild-sample``'s compiles and the
measuring process of ``hermetic run``::

    bwrap --die-with-parent --unshare-pid --ro-bind / / --dev /dev --proc /proc
          --bind ROOT ROOT [--dev-bind-try /dev/nvidia... (GPU_DEVICES)] -- COMMAND

The whole system is visible, read-only; ``/dev`` is the sandbox's own (null, zero, random, urandom, tty, a
private ``/dev/shm``) plus the GPU's nodes where the machine has them; ``/proc`` is a fresh one. A write
anywhere else fails at once with EROFS ("Read-only file system"), which ``procs`` recognizes in the child's
output and turns into an error naming the path. The lock folder is shared by every user of the machine and may
be any folder (HERMETIC_LOCK_DIR, a runner's ``gpu.lock_dir``: the home folder, even): it stays read-only
inside. hermetic itself, outside the sandbox, takes and writes the lock files it holds; no child needs one
writable, so none is bound (binding the held ones would only let a child scribble in them), and the audit
watches the folder (anything there but lock files is a leak). The mount namespace is new, and so is the pid
namespace (``--unshare-pid``): bubblewrap's own first process inside waits for the child and, when the child
ends, ends too, and the kernel kills every process left in the namespace, so nothing a compiler starts (a
process it detaches with setsid, a compiler server) outlives its child, with the root writable to it. Seen
from outside they keep hermetic's session (the reaper and the memory guard find them as before), network and
user. It
is a guard against a tool writing where it should not (a cache in the real HOME, a temporary file in /tmp),
not a security boundary: a child running as root could remount.

``[limits] sandbox`` in a recipe, ``sandbox`` in a runner's ``[cpu]``/``[gpu]`` table, ``HERMETIC_SANDBOX`` or
``--sandbox`` (the command line first, then the environment, then the file): ``auto`` (the default) uses it
where it works and says in the receipt why not where it does not; ``required`` exits 3 where no sandbox can
be had; ``off`` never uses it. ``HERMETIC_BWRAP`` names the bwrap binary (default: ``bwrap`` on PATH).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic.errors import HermeticError, PreconditionFailed
from hermetic.procs import Confinement, Limits, TimedOut, confined, run_limited
from hermetic.root import Root

ENV_MODE = "HERMETIC_SANDBOX"
ENV_BWRAP = "HERMETIC_BWRAP"
PROBE_TIMEOUT_S = 30.0
INSTALL = ("install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), "
           "or name a bwrap binary in HERMETIC_BWRAP")

# What CUDA's driver opens: each pattern that matches on this machine is bound into every sandbox (the
# measuring process on a GPU, and the import check, whose NVML probe proves the import created no context).
# Not yet proven on the H200: if a GPU run fails inside the sandbox, the node it lacks belongs here.
# Everything else CUDA reads is visible read-only already: the driver's libraries, /sys, /proc/driver/nvidia
# (in the fresh /proc), nvidia-persistenced's socket (connecting to a socket needs no writable mount); its
# JIT cache is CUDA_CACHE_PATH, inside the root; /dev/shm is the sandbox's own.
GPU_DEVICES = (
    "/dev/nvidiactl",                   # the driver's control node: every CUDA and NVML call opens it
    "/dev/nvidia[0-9]*",                # one node per GPU
    "/dev/nvidia-uvm",                  # unified memory: cuInit fails without it
    "/dev/nvidia-uvm-tools",            # profilers and debuggers
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps",                 # MIG's capability nodes (a folder)
    "/dev/nvidia-caps-imex-channels",   # IMEX channels (multi-node NVLink)
    "/dev/nvidia-nvswitchctl",          # NVSwitch machines (HGX): the fabric
    "/dev/nvidia-nvswitch[0-9]*",
    "/dev/nvidia-nvlink",
)

# the probe: a file inside the root must be written, one outside refused with EROFS
_PROBE = r"""
import errno, os, sys
inside, outside = sys.argv[1:3]
try:
    with open(inside, "w") as f:
        f.write("ok")
except OSError as e:
    print("hermetic-sandbox-probe: inside", e.errno, e.strerror)
    sys.exit(0)
try:
    fd = os.open(outside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
except OSError as e:
    print("hermetic-sandbox-probe: refused", e.errno)
else:
    os.close(fd)
    print("hermetic-sandbox-probe: written")
"""


@dataclass(frozen=True)
class Found:
    """Whether bubblewrap sets the sandbox up here, and if not, why."""
    works: bool
    why: str = ""
    tool: str | None = None
    version: str | None = None


@dataclass
class Sandbox:
    mode: str
    set_by: str
    found: Found
    writable: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    confinement: Confinement | None = None

    @property
    def used(self) -> bool:
        return self.confinement is not None

    @property
    def why_not(self) -> str:
        return "" if self.used else (f"sandbox = off ({self.set_by})" if self.mode == "off" else self.found.why)

    def confined(self) -> contextlib.AbstractContextManager[Confinement | None]:
        """Every child started inside the block runs in this sandbox (or in none, where it is not used)."""
        return confined(self.confinement)

    def record(self) -> dict[str, Any]:
        """What the receipt says: whether the sandbox was used, and why not."""
        rec: dict[str, Any] = {"mode": self.mode, "set_by": self.set_by, "used": self.used}
        if not self.used:
            rec["why_not"] = self.why_not
            return rec
        assert self.confinement is not None
        rec.update(tool=self.found.tool, version=self.found.version, writable=list(self.writable),
                   devices=list(self.devices),
                   refused=[{"path": r.path, "program": r.program, "line": r.line}
                            for r in self.confinement.refused])
        return rec


def choose(root: Root, mode: str, set_by: str, lock_folder: Path) -> Sandbox:
    """The sandbox this command's children run in: detected (once, cached) unless ``mode`` is off; where none
    can be had, ``required`` is a failed precondition (exit 3) and ``auto`` goes on without one."""
    if mode == "off":
        return Sandbox(mode, set_by, Found(False, "turned off"))
    writable = _writable(root, lock_folder)
    found = detect(root, lock_folder)
    if not found.works:
        if mode == "required":
            raise PreconditionFailed(f"sandbox = required, and no sandbox can be had here: {found.why}",
                                     where=set_by, hint=f"{INSTALL}; or set sandbox = \"auto\" to build without "
                                                        f"one (the receipt then says why)")
        return Sandbox(mode, set_by, found, writable)
    assert found.tool is not None
    devices = gpu_devices()
    return Sandbox(mode, set_by, found, writable, devices,
                   Confinement(prefix(found.tool, writable, devices), writable))


def prefix(tool: str, writable: tuple[str, ...], devices: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The bwrap command line before the child's: the system read-only, the writable places bound over it
    (outer ones first; the root, ``writable[0]``, must exist, the lock folder may not yet), the GPU's nodes
    into the sandbox's own /dev."""
    args = [tool, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for w in sorted(writable, key=len):
        args += ["--bind" if w == writable[0] else "--bind-try", w, w]
    for d in devices:
        args += ["--dev-bind-try", d, d]
    return (*args, "--")


def gpu_devices() -> tuple[str, ...]:
    """The nodes of GPU_DEVICES this machine has (none on a machine without NVIDIA's driver)."""
    found: list[str] = []
    for pattern in GPU_DEVICES:
        found += sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else \
            ([pattern] if os.path.exists(pattern) else [])
    return tuple(dict.fromkeys(found))


def _writable(root: Root, lock_folder: Path) -> tuple[str, ...]:
    """The root alone: the lock folder (any folder a setting names) is never bound writable."""
    del lock_folder
    return (os.path.realpath(root.path),)


def bwrap_path() -> tuple[str | None, str]:
    """The bwrap binary (HERMETIC_BWRAP, else bwrap on PATH), or None and why there is none."""
    named = os.environ.get(ENV_BWRAP)
    if named:
        if not os.path.isfile(named) or not os.access(named, os.X_OK):
            return None, f"{ENV_BWRAP} names {named}, which is not an executable file"
        return os.path.abspath(named), ""
    found = shutil.which("bwrap")
    if found is None:
        return None, "bubblewrap is not installed (no bwrap on PATH)"
    return found, ""


PROBE_VERSION = 2   # 2: the sandbox has a pid namespace of its own (--unshare-pid)


def detect(root: Root, lock_folder: Path) -> Found:
    """Whether bubblewrap sets the sandbox up here: asked per bwrap binary (its stat fingerprint), kernel, user,
    root and sandbox command line. A yes is cached in the root's state/sandbox-v1; a no is asked again by the
    next command (a failure may be passing: a full or read-only ROOT/tmp once must not turn the sandbox off for
    good)."""
    tool, why = bwrap_path()
    if tool is None:
        return Found(False, why)
    key = f"{tool}|{os.uname().release}|uid {os.geteuid()}|{os.path.realpath(root.path)}|probe {PROBE_VERSION}"
    cache = root.cache("sandbox")
    cached = cache.get(key)
    if isinstance(cached, dict) and cached.get("works") is True:
        return Found(True, "", tool, cached.get("version"))
    found = _probe(root, tool, _writable(root, lock_folder))
    if found.works:
        cache.put(key, {"works": True, "why": "", "version": found.version}, [tool])
    return found


def _probe(root: Root, tool: str, writable: tuple[str, ...]) -> Found:
    root.tmp.mkdir(parents=True, exist_ok=True)
    inside = root.tmp / f"sandbox-probe-{os.getpid()}"
    outside = Path(os.path.realpath(root.path)).parent / f".hermetic-sandbox-probe-{os.getpid()}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root.home), "TMPDIR": str(root.tmp)}
    probe = Confinement(prefix(tool, writable), writable)
    version = _version(tool, str(root.tmp), env, probe)
    try:
        with confined(probe):
            rc, tail = run_limited([sys.executable, "-S", "-c", _PROBE, str(inside), str(outside)],
                                   cwd=str(root.tmp), env=env, limits=Limits(), timeout=PROBE_TIMEOUT_S,
                                   on_line=lambda _line: None)
    except TimedOut:
        return Found(False, f"{tool} did not answer within {PROBE_TIMEOUT_S:g} s", tool, version)
    except HermeticError as e:  # bwrap said why it could not set the sandbox up
        return Found(False, f"{tool} cannot set the sandbox up here: {e.what.split(': ', 1)[-1]}", tool, version)
    finally:
        wrote_inside = inside.exists()
        with contextlib.suppress(OSError):
            inside.unlink()
        if os.path.lexists(outside):  # a bwrap that did not confine: take the probe's file back
            with contextlib.suppress(OSError):
                os.unlink(outside)
    said = next((ln.split(": ", 1)[1] for ln in tail if ln.startswith("hermetic-sandbox-probe: ")), None)
    if rc != 0 or said is None:
        return Found(False, f"{tool} failed (exit {rc}): {_last_words(tail)}", tool, version)
    if said.startswith("inside "):
        return Found(False, f"{tool} ran the probe, but its write inside the root failed "
                            f"({said.split(' ', 2)[-1]}: {inside})", tool, version)
    if not wrote_inside:
        return Found(False, f"{tool} ran the probe, but its write inside the root did not land", tool, version)
    if said != f"refused {errno.EROFS}":
        what = "was not refused" if said == "written" else f"failed otherwise (errno {said.split()[-1]})"
        return Found(False, f"{tool} ran the probe, but its write outside the root {what}", tool, version)
    return Found(True, "", tool, version)


def _last_words(tail: list[str]) -> str:
    """What a failed probe said, at most three lines, with no Python traceback's frames (its last line, the
    error, is kept)."""
    kept = [ln for ln in tail if ln.strip() and not ln.startswith(("Traceback (most recent call last)", "  "))]
    return " | ".join(kept[-3:]) or "nothing"


def _version(tool: str, cwd: str, env: dict[str, str], probe: Confinement) -> str | None:
    """bwrap's own --version, asked inside the sandbox it is being tried as (it prints before it sets anything
    up), so that no child of a sandboxed command runs outside it, this one included."""
    try:
        with confined(probe):
            rc, tail = run_limited([tool, "--version"], cwd=cwd, env=env, limits=Limits(), timeout=PROBE_TIMEOUT_S,
                                   on_line=lambda _line: None)
    except (TimedOut, HermeticError):  # it does not run here: the probe that follows says why
        return None
    return tail[-1].strip() if rc == 0 and tail else None
