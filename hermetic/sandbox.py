"""The sandbox: hermetic's children run where only the scratch root is writable.

Where bubblewrap works (asked per bwrap binary, kernel, user, root and sandbox command line; a yes is cached in
the root's ``state/sandbox-v1``, a no asked again by the next command), every child a realize, a run or
``verify`` starts goes through it (``procs.confined``): the probes of the interpreter and torch, ``patch``,
ninja and every compiler under it, the linker, the import check, ``verify --rebuild-sample``'s compiles and the
measuring process of ``hermetic run``::

    bwrap --die-with-parent --unshare-pid [--unshare-net] --ro-bind / / --dev /dev --proc /proc
          --bind ROOT ROOT --ro-bind-try ROOT/store ROOT/store ... (READ_ONLY)
          [--bind ROOT/state/kernels-v2/run-NAME ... (kernel_cache)] [--dev-bind-try /dev/nvidia... (GPU_DEVICES)]
          -- COMMAND

The root's records (``READ_ONLY``: the store, profiles, gc roots, receipts, imports, derived state, the marker)
are read-only over the writable root (issue 41: a stranger's setup.py or the package the import check imports
forged the store consistently, and ``verify`` called it valid); ``patch`` alone gets its staging folder
(``procs.run_limited``'s ``writable_too``). So are ``home/`` (``hermetic env``'s, unconfined) and ``build/``: the
children of one trust domain get a home of their own (``BOXES``) and a realize its recipe's build folder, ninja's
``build.ninja`` there read-only to every compile (``read_only_too``). The network is the sandbox's own
(``--unshare-net``: a loopback that is down) unless the command needs the machine's (``choose``'s ``network``: a
build cluster, ``hermetic run``'s measuring process) or bwrap cannot unshare it here (the probe asks; the record
says ``network: host`` and why). The whole system is visible, read-only; ``/dev`` is the sandbox's own (null,
zero, random, urandom, tty, a private ``/dev/shm``) plus the GPU's nodes where the machine has them; ``/proc`` is
a fresh one. A write anywhere else fails at once with EROFS ("Read-only file system"), which ``procs`` recognizes
in the child's output and turns into an error naming the path. The lock folder is shared by every user of the
machine and may be any folder (HERMETIC_LOCK_DIR, a runner's ``gpu.lock_dir``: the home folder, even): it stays
read-only inside. hermetic itself, outside the sandbox, takes and writes the lock files it holds; no child needs
one writable, so none is bound (binding the held ones would only let a child scribble in them), and the audit
watches the folder (anything there but lock files is a leak). The mount namespace is new, and so is the pid
namespace (``--unshare-pid``): bubblewrap's own first process inside waits for the child and, when the child ends,
ends too, and the kernel kills every process left in the namespace, so nothing a compiler starts (a process it
detaches with setsid, a compiler server) outlives its child, with the root writable to it. Seen from outside they
keep hermetic's session (the reaper and the memory guard find them as before), network and user. It is a guard
against a tool writing where it should not (a cache in the real HOME, a temporary file in /tmp), not a security
boundary: a child running as root could remount.

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
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput, HermeticError, PreconditionFailed
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

# The root's records, which only hermetic itself writes (outside the sandbox): read-only inside it, bound over
# the writable root, so that a child (a stranger's setup.py, the import check importing the package, a
# compiler) cannot rewrite the store consistently (a blob, an entry's out/, its meta.json), a profile, a gc
# root or a receipt. What children write stays writable: tmp/, their domain's home and a realize's own build
# folder (below), under state/ the one folder a child fills (``kernel_cache``: a runner's compiled kernels, for
# its own measuring process only), and under runs/ the folder of the run being measured, for its measuring
# process alone (``Sandbox.let_write``): a compile, a stranger's setup.py or a later run rewrote an earlier
# run's report.md and results.json before (the receipt in receipts/ was safe; the report a user reads was not).
READ_ONLY = ("HERMETIC_ROOT", "store", "profiles", "roots", "receipts", "imports", "state", "home", "build", "runs")
# home/ and build/ are read-only inside too (the re-attacks on issues 39 and 41): home/ is the home of `hermetic
# env`, which runs the user's commands unconfined (a child that planted a stdlib .pyc in its bytecode cache, or
# a .gitconfig, ran code outside the sandbox), and build/ holds every recipe's build folder (a compile of one
# recipe rewrote another's build.ninja, and its objects were stored under honest keys). A sandbox's children
# get a home of their trust domain instead (``BOXES``/<domain>: a recipe's realize, a runner's run; a fresh one
# for a stranger's setup.py and a rebuild sample), bound writable again, and a realize its recipe's build folder.
BOXES = "home/.sandboxed"

# the probe: a file inside the root must be written, one outside refused with EROFS, and so must one in the
# root's store (READ_ONLY); with the network unshared, a connection to loopback must find no listener there
_PROBE = r"""
import errno, os, socket, sys
inside, outside, record = sys.argv[1:4]
try:
    with open(inside, "w") as f:
        f.write("ok")
except OSError as e:
    print("hermetic-sandbox-probe: inside", e.errno, e.strerror)
    sys.exit(0)
for what, path in (("outside", outside), ("record", record)):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        print("hermetic-sandbox-probe:", what, "refused", e.errno)
    else:
        os.close(fd)
        print("hermetic-sandbox-probe:", what, "written")
try:
    names = sorted(n for _i, n in socket.if_nameindex())
except OSError:
    names = []
print("hermetic-sandbox-probe: interfaces", ",".join(names))
"""


@dataclass(frozen=True)
class Found:
    """Whether bubblewrap sets the sandbox up here, and if not, why."""
    works: bool
    why: str = ""
    tool: str | None = None
    version: str | None = None
    net: bool = False           # bwrap can give a child a network namespace of its own (no network at all)
    net_why: str = ""           # and if not, why


@dataclass
class Sandbox:
    mode: str
    set_by: str
    found: Found
    writable: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    confinement: Confinement | None = None
    read_only: tuple[str, ...] = ()
    network: str = "host"       # "none": the children have no network (--unshare-net); "host": the machine's
    network_why: str = ""       # why the children keep the machine's network

    @property
    def used(self) -> bool:
        return self.confinement is not None

    @property
    def why_not(self) -> str:
        return "" if self.used else (f"sandbox = off ({self.set_by})" if self.mode == "off" else self.found.why)

    def confined(self) -> contextlib.AbstractContextManager[Confinement | None]:
        """Every child started inside the block runs in this sandbox (or in none, where it is not used)."""
        return confined(self.confinement)

    def let_write(self, folder: Path) -> None:
        """``folder``, below one of the root's read-only records (a run's own folder under runs/), writable to
        the children started from now on (bound writable over the read-only binds), and said so in the
        receipt's ``writable``."""
        if self.confinement is None:
            return
        where = os.path.realpath(folder)
        c = self.confinement
        assert c.prefix[-1] == "--"
        c.prefix = (*c.prefix[:-1], "--bind", where, where, "--")
        c.writable = (*c.writable, where)
        self.writable = (*self.writable, where)

    def record(self) -> dict[str, Any]:
        """What the receipt says: whether the sandbox was used, and why not."""
        rec: dict[str, Any] = {"mode": self.mode, "set_by": self.set_by, "used": self.used}
        if not self.used:
            rec["why_not"] = self.why_not
            return rec
        assert self.confinement is not None
        rec.update(tool=self.found.tool, version=self.found.version, writable=list(self.writable),
                   read_only=list(self.read_only), network=self.network,
                   unix_sockets="refused" if self.confinement.no_unix_sockets else "allowed",
                   devices=list(self.devices),
                   refused=[{"path": r.path, "program": r.program, "line": r.line}
                            for r in self.confinement.refused])
        if self.network != "none":
            rec["network_why"] = self.network_why
        return rec


def choose(root: Root, mode: str, set_by: str, lock_folder: Path, *, network: str = "",
           unix_sockets: bool = True, domain: str | None = None, build: str | None = None,
           kernels: bool = False) -> Sandbox:
    """The sandbox this command's children run in: detected (once, cached) unless ``mode`` is off; where none
    can be had, ``required`` is a failed precondition (exit 3) and ``auto`` goes on without one. ``network``:
    why the children need the machine's network (a build cluster), or "" to take it from them where bwrap can
    (--unshare-net). ``unix_sockets`` False: a seccomp filter refuses the children socket(AF_UNIX) (a socket
    on the file system, an ssh-agent's, is reached through the read-only system otherwise) and io_uring.
    ``domain``: whose children these are (``recipe-<name>``, ``run-<name>``; None: this command's alone), which
    names their home (``BOXES``); ``build``: the one folder of build/ they may write (a realize's recipe's);
    ``kernels``: the domain's compiled-kernel cache is writable (``kernel_cache``: a runner's measuring process
    alone; a stranger's setup.py planted kernels there for every later run: the re-attack's B3; and one runner's
    package is not another's: each runner has its own)."""
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
    read_only = records(root)
    again = (os.path.realpath(kernel_cache(root, domain)),) if kernels and domain is not None else ()
    box, homes, temps = _box_home(root, domain)
    own = [box]
    if build is not None:
        folder = root.path / "build" / build
        fs.refuse_linked_folders(root.path, folder)
        folder.mkdir(parents=True, exist_ok=True)
        own.append(os.path.realpath(folder))
    unshare = found.net and not network
    why = network or found.net_why
    return Sandbox(mode, set_by, found, writable, devices,
                   Confinement(prefix(found.tool, writable, devices, read_only=read_only,
                                      writable_again=(*again, *own), unshare_net=unshare),
                               (*writable, *own), read_only=read_only, no_unix_sockets=not unix_sockets,
                               homes=homes, temps=temps),
                   read_only, "none" if unshare else "host", "" if unshare else why)


Moves = tuple[tuple[str, str], ...]
ONCE = "once-"   # the prefix of a fresh home (``fs.folder_for_this_process``: locked while its process lives)


def sweep_once_homes(root: Root) -> list[Path]:
    """Remove the fresh homes (``BOXES``/once-*) whose process is gone: a kill -9 runs no exit handler. Their
    lock is free; a live process's is held."""
    top = _boxes(root)
    return fs.sweep_process_folders(top, ONCE) if top is not None else []


def live_once_homes(root: Root) -> list[Path]:
    """The fresh homes (``BOXES``/once-*) of commands still running (`recipe new`, `verify --rebuild-sample`):
    `gc --all` removes no root in which one lives."""
    top = _boxes(root)
    return fs.live_process_folders(top, ONCE) if top is not None else []


def _boxes(root: Root) -> Path | None:
    """``BOXES`` when it is a plain folder of the root (never a link, nor under one), else None."""
    top = root.path / BOXES
    try:
        fs.refuse_linked_folders(root.path, top)
    except BadInput:
        return None
    return top if top.is_dir() else None


def _box_home(root: Root, domain: str | None) -> tuple[str, Moves, Moves]:
    """The home of a trust domain's children (``BOXES``/<domain>; a fresh one, removed at exit, for None), the
    map from the root's home (``hermetic env``'s) to it and the one from the root's tmp/ to its tmp/, which
    ``procs.run_limited`` applies to every child's environment: HOME, the XDG folders, the bytecode cache, the
    tools' caches and the temp folder all move there."""
    top = root.path / BOXES
    fs.refuse_linked_folders(root.path, top)
    top.mkdir(parents=True, exist_ok=True)
    if domain is None:
        box = str(fs.folder_for_this_process(top, ONCE))   # sweeps those a kill -9 left
    else:
        folder = top / _domain_folder(domain)
        fs.refuse_linked_folders(root.path, folder)
        folder.mkdir(exist_ok=True)
        box = str(folder)
    box = os.path.realpath(box)
    temp = os.path.join(box, "tmp")
    os.makedirs(temp, exist_ok=True)
    home, tmp = str(root.home), str(root.tmp)
    return (box, tuple({(home, box), (os.path.realpath(home), box)}),
            tuple({(tmp, temp), (os.path.realpath(tmp), temp)}))



def records(root: Root) -> tuple[str, ...]:
    """The root's records bound read-only inside the sandbox (``READ_ONLY``: each made first where it is
    missing, so that no child can make it)."""
    base = os.path.realpath(root.path)
    for d in READ_ONLY[1:]:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.join(base, d), exist_ok=True)
    return tuple(os.path.join(base, n) for n in READ_ONLY)


def kernel_cache(root: Root, domain: str) -> Path:
    """The compiled-kernel cache of one trust domain (``run-<runner>``): ``state/kernels-v2/<domain>``, made here,
    the one folder of state/ its measuring process may write (and no other domain's: a package measured by one
    runner could plant Inductor or Triton code that another runner's process loads on a cache hit)."""
    folder = root.cache_dir("kernels") / _domain_folder(domain)
    fs.refuse_linked_folders(root.path, folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _domain_folder(domain: str) -> str:
    """A domain's folder name: the domain itself when it is a plain name, else a digest of it."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", domain) or len(domain) > 200:
        return "h-" + fs.sha256_bytes(domain.encode())[:32]
    return domain


def prefix(tool: str, writable: tuple[str, ...], devices: tuple[str, ...] = (), *,
           read_only: tuple[str, ...] = (), writable_again: tuple[str, ...] = (),
           unshare_net: bool = False) -> tuple[str, ...]:
    """The bwrap command line before the child's: the system read-only, the writable places bound over it
    (outer ones first; the root, ``writable[0]``, must exist, the lock folder may not yet), the root's records
    read-only over those (``read_only``, each where it exists), the folders below them that children fill
    writable again (``writable_again``), the GPU's nodes into the sandbox's own /dev; with ``unshare_net`` a
    network namespace of its own (only a loopback that is down: no connection reaches anything)."""
    args = [tool, "--die-with-parent", "--unshare-pid", *(("--unshare-net",) if unshare_net else ()),
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for w in sorted(writable, key=len):
        args += ["--bind" if w == writable[0] else "--bind-try", w, w]
    for r in read_only:
        args += ["--ro-bind-try", r, r]
    for w in writable_again:
        args += ["--bind-try", w, w]
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


PROBE_VERSION = 3   # 2: a pid namespace of its own (--unshare-pid); 3: the root's records read-only, the network
                    # unshared where bwrap can


def detect(root: Root, lock_folder: Path) -> Found:
    """Whether bubblewrap sets the sandbox up here, and whether it can take the network from a child
    (--unshare-net): asked per bwrap binary (its stat fingerprint), kernel, user, root and sandbox command line.
    A yes is cached in the root's state/sandbox-v1; a no is asked again by the next command (a failure may be
    passing: a full or read-only ROOT/tmp once must not turn the sandbox off for good). Where the sandbox
    works but not with --unshare-net, it is used as before, with the machine's network, and says why."""
    tool, why = bwrap_path()
    if tool is None:
        return Found(False, why)
    key = f"{tool}|{os.uname().release}|uid {os.geteuid()}|{os.path.realpath(root.path)}|probe {PROBE_VERSION}"
    cache = root.cache("sandbox")
    cached = cache.get(key)
    if isinstance(cached, dict) and cached.get("works") is True and isinstance(cached.get("net"), bool):
        return Found(True, "", tool, cached.get("version"), cached["net"], str(cached.get("net_why") or ""))
    writable = _writable(root, lock_folder)
    found = _probe(root, tool, writable, unshare_net=True)
    if found.works:
        found = Found(True, "", tool, found.version, True)
    else:
        without = _probe(root, tool, writable, unshare_net=False)
        if without.works:
            found = Found(True, "", tool, without.version, False,
                          f"{tool} cannot take the network from a child here (--unshare-net): "
                          f"{found.why.split(': ', 1)[-1]}")
        else:
            found = without
    if found.works:
        cache.put(key, {"works": True, "why": "", "version": found.version, "net": found.net,
                        "net_why": found.net_why}, [tool])
    return found


def _probe(root: Root, tool: str, writable: tuple[str, ...], *, unshare_net: bool) -> Found:
    root.tmp.mkdir(parents=True, exist_ok=True)
    inside = root.tmp / f"sandbox-probe-{os.getpid()}"
    outside = Path(os.path.realpath(root.path)).parent / f".hermetic-sandbox-probe-{os.getpid()}"
    read_only = records(root)
    record = Path(read_only[READ_ONLY.index("store")]) / f".hermetic-sandbox-probe-{os.getpid()}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root.home), "TMPDIR": str(root.tmp)}
    probe = Confinement(prefix(tool, writable, read_only=read_only, unshare_net=unshare_net),
                        writable)
    version = _version(tool, str(root.tmp), env, probe)
    try:
        with confined(probe):
            rc, tail = run_limited([sys.executable, "-I", "-S", "-c", _PROBE, str(inside), str(outside), str(record)],
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
        for p in (outside, record):   # a bwrap that did not confine: take the probe's file back
            if os.path.lexists(p):
                with contextlib.suppress(OSError):
                    os.unlink(p)
    said = {ln.split(": ", 1)[1].split(" ", 1)[0]: ln.split(": ", 1)[1].partition(" ")[2]
            for ln in tail if ln.startswith("hermetic-sandbox-probe: ")}
    if rc != 0 or not said:
        return Found(False, f"{tool} failed (exit {rc}): {_last_words(tail)}", tool, version)
    if "inside" in said:
        return Found(False, f"{tool} ran the probe, but its write inside the root failed "
                            f"({said['inside'].split(' ', 1)[-1]}: {inside})", tool, version)
    if not wrote_inside:
        return Found(False, f"{tool} ran the probe, but its write inside the root did not land", tool, version)
    for what, where in (("outside", "outside the root"), ("record", "into the root's store")):
        got = said.get(what, "")
        if got != f"refused {errno.EROFS}":
            how = "was not refused" if got == "written" else \
                f"failed otherwise (errno {got.split()[-1] if got else '?'})"
            return Found(False, f"{tool} ran the probe, but its write {where} {how}", tool, version)
    interfaces = said.get("interfaces", "").strip()
    if unshare_net and interfaces not in ("", "lo"):
        return Found(False, f"{tool} ran the probe with --unshare-net, but it saw the network interfaces "
                            f"{interfaces}", tool, version)
    return Found(True, "", tool, version, unshare_net)


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
