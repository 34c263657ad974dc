"""Which device a run measures, the machine-wide locks that keep two runs off one device, and the facts of
the device that go into the receipt (GPU preconditions through NVML, read only; the CPU's model and load).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput, PreconditionFailed, path_error
from hermetic.reporter import Reporter
from hermetic.root import DEFAULT_LOCK_DIRS, lock_dir
from hermetic.run.spec import Runner

__all__ = ["DEFAULT_LOCK_DIRS", "cpu_facts", "gpu_preconditions", "lock_dir", "pick_device", "take_lock"]


# the device and its lock -----------------------------------------------------------------------------------
def pick_device(requested: str) -> str:
    from hermetic.run.gpu import gpu_count
    if requested == "cpu":
        return "cpu"
    n = gpu_count()
    if requested == "gpu" and n == 0:
        raise PreconditionFailed("no GPU is visible through NVML", where="--device gpu",
                                 hint="run on a GPU machine, or use --device cpu")
    return "gpu" if n else "cpu"


def take_lock(directory: Path, name: str, timeout: float, reporter: Reporter, what: str) -> tuple[fs.FileLock, float]:
    """flock ``directory/name``, waiting up to ``timeout`` seconds; (lock, seconds waited)."""
    path = directory / name
    lock = fs.FileLock(path, timeout=timeout, what=what, single_link=True)
    try:
        if not os.path.lexists(directory):
            if str(directory) not in DEFAULT_LOCK_DIRS:   # a named folder is the admin's to make, never ours
                raise BadInput(f"the lock folder {directory} does not exist: hermetic makes only its default lock "
                               f"folders ({', '.join(DEFAULT_LOCK_DIRS)}), never one a setting names",
                               where=str(directory),
                               hint=f"make it once for every user (mkdir -m 1777 {directory}), or name an existing "
                                    f"lock folder (HERMETIC_LOCK_DIR, a hermetic.toml's lock_dir; `hermetic config` "
                                    f"says which one named this)")
            _make_shared_folder(directory)
        t0 = time.monotonic()
        got = lock.acquire(blocking=False)
    except OSError as e:
        raise path_error(e, doing="the lock folder cannot be used",
                         hint=f"the lock folder is {directory} (HERMETIC_LOCK_DIR, else gpu.lock_dir, else a "
                              f"hermetic.toml's lock_dir (`hermetic config` says which), else the first of "
                              f"{', '.join(DEFAULT_LOCK_DIRS)} whose parent is writable)") or e from None
    if not got:
        holder = _holder(path)
        reporter.event("lock-wait", f"waiting up to {timeout:g} s for {what} ({path}"
                                    f"{'; held by ' + holder if holder else ''})", path=str(path), holder=holder)
        wait = reporter.wait(f"waiting for {what}", timeout, _held_by(holder))
        try:  # the row says who holds it now (the holder may change while we wait), waited and left
            lock.acquire(on_wait=lambda waited: wait.update(waited, _held_by(_holder(path))))
        except BaseException:
            wait.close()
            raise
        wait.close(f"took the lock on {what} after {time.monotonic() - t0:.1f} s")
    lock.note(f"pid {os.getpid()} on {socket.gethostname()} since "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    lock.share_with_everyone()   # through the held descriptor, on a file of ours only
    return lock, time.monotonic() - t0


def _make_shared_folder(directory: Path) -> None:
    """The lock folder, made for every user (1777: each creates lock files here; the sticky bit guards them),
    chmodded through the descriptor of the folder just made, never through a link put in its place."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        return   # made meanwhile by another process (or something else is there: the lock's open says so)
    fd = fs.open_dir(directory)
    try:
        os.fchmod(fd, 0o1777)
    finally:
        os.close(fd)


def _holder(path: Path) -> str:
    """Who holds a lock, as its holder wrote it into the file ("pid N on HOST since TIME"), or "": read without
    following a link and without blocking on a FIFO."""
    try:
        return fs.read_regular(path, 4096).decode(errors="replace").strip()
    except (OSError, ValueError):
        return ""


def _held_by(holder: str) -> str:
    return f"held by {holder}" if holder else "holder unknown"


def gpu_preconditions(runner: Runner, archs: tuple[str, ...], cuda: str | None, index: int, spec: Any, *,
                      peer: bool = False) -> Any:
    """The GPU's facts read again (now that the lock is ours), checked against the runner's limits and what
    the realized modules were built for (``archs``, the toolchain's ``cuda``); a failed precondition if not."""
    from hermetic.run.gpu import check_preconditions, nvml_facts, own_process_tree
    facts = nvml_facts(index)  # again, now that the lock is ours
    failures = check_preconditions(facts, power_cap_w=None if peer else spec.power_cap_w,
                                   min_free_memory=spec.min_free_memory,
                                   archs=archs, toolchain_cuda=cuda, own_pids=own_process_tree())
    if failures:
        lines = "; ".join(f"{f.key}: found {f.found}, expected {f.expected}" for f in failures)
        raise PreconditionFailed(f"GPU {index} ({facts.name}, {facts.uuid}) is not ready: {lines}",
                                 where=str(runner.path), hint=failures[0].hint)
    return facts


def cpu_facts(spec: Any) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": model, "logical_cpus": os.cpu_count(), "host": socket.gethostname(),
            "load_avg": list(os.getloadavg())}
