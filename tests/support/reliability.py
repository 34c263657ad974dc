"""The reliability suite's machinery, shared by tests/test_reliability_*.py and bench/soak.

* ``CrashLab``: kill -9 a real ``hermetic realize`` of a real C++/CUDA fixture at a chosen phase (read from
  the JSON Lines progress on stdout) after a chosen delay; then check that no child of hermetic survives,
  that ``hermetic verify`` is clean, that the next realize gives the uninterrupted build's module (bytes,
  with nvcc's temporary file names masked as docs/reuse.md documents) and an honest receipt, and that gc
  leaves no garbage; every trial also audits the places outside the root.
* ``FileServer``: a loopback HTTP server of files, throttled, so a download lasts long enough to be killed.
* ``survivors``: live processes that belong to a scratch root (their environment or command line points
  into it), for "no child outlives hermetic".
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hermetic.audit import OutsideRootAudit
from hermetic.extensions.rebuild import normalized
from hermetic.store import Store
from tests.support import cli
from tests.support.cli import REPO, Result, hermetic_env
from tests.support.recipes import TOOLCHAIN_LOCK, recipe_toml
from tests.support.wheels import BuiltWheel, build_wheel

FIXTURE_SRC = REPO / "tests" / "data" / "reuse_src"
# The phase records realize prints with --json ({"event": "phase", "phase": ...}), in order.
PHASES = ("fetching", "materializing", "toolchain", "sources", "compiling", "linking", "checking", "receipt")
REQUIRED_PHASES = ("fetching", "materializing", "compiling", "linking", "receipt")
# How long after its record each phase lasts at most here (an upper bound for a random kill delay).
PHASE_SPAN_S = {"fetching": 0.4, "materializing": 0.3, "toolchain": 0.05, "sources": 0.05, "compiling": 2.0,
                "linking": 0.2, "checking": 2.0, "receipt": 0.008}


def crash_plan(n: int, phases: tuple[str, ...], seed: int) -> list[tuple[str, float]]:
    """``n`` (phase, delay) pairs: the phases in turn; the first round kills at each phase's record, later
    rounds at a random moment within the phase's span (seeded: a plan can be replayed)."""
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        phase = phases[i % len(phases)]
        plan.append((phase, 0.0 if i < len(phases) else round(rng.uniform(0, PHASE_SPAN_S[phase]), 4)))
    return plan



def child_env(home: Path, tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This machine's environment (its pip configuration too) with a private HOME and TMPDIR (watched by the
    audit) and no HERMETIC_*."""
    return hermetic_env(home, pip="machine", tmp=tmp, extra=extra)


# --- processes ---------------------------------------------------------------------------------------
def live_commands() -> dict[int, bytes]:
    """pid -> command line (NUL-separated) of every live process but this one; zombies are dead."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found[int(pid)] = cmd
    return found


def survivors(root: Path) -> list[str]:
    """Live processes of a scratch root: HOME or TMPDIR inside it (every child hermetic starts), or the root
    in their command line (compilers, ninja, the import check). Zombies are dead and not counted."""
    needles = [f"HOME={root}/".encode(), f"HOME={root}\0".encode(), f"TMPDIR={root}/".encode()]
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes() + b"\0"
        except OSError:
            continue
        if f"{root}/".encode() in cmd or any(n in environ for n in needles):
            shown = cmd.replace(b"\0", b" ").decode(errors="replace")[:200]
            found.append(f"{pid}: {shown}")
    return found


def children(pid: int) -> dict[int, bytes]:
    """pid -> command line of the live children of ``pid``."""
    found = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found[int(p)] = Path(f"/proc/{p}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
    return found


def kill_and_reap(pid: int, root: Path, limit_s: float = 120.0) -> tuple[list[str], float]:
    """kill -9 ``pid`` (a hermetic process) and say which of its children outlive it.

    It is stopped first (SIGSTOP), so the list of its children is complete, then killed. Its helpers are
    waited for: build reapers (procs.py: they kill a build's whole session when hermetic's pipe closes) and
    children caught between fork and exec (copies of hermetic). A limits shim still waiting at its gate
    (procs.py: it starts nothing until its reaper runs) is waited for too, and must exit without becoming
    anything else. Whatever else of ``root`` is alive then, nothing is going to stop: it outlived hermetic.
    No clock decides the verdict; ``limit_s`` only bounds the waits (what is left at the limit is listed).
    Returns the outliving processes and how long the waits took.
    """
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    os.kill(pid, signal.SIGSTOP)
    helpers = [c for c, cmd in children(pid).items() if b"kill_session" in cmd or cmd == own]
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    while any(_alive(h) for h in helpers) and time.monotonic() - start < limit_s:
        time.sleep(0.01)
    outlived = [f"helper {h}" for h in helpers if _alive(h)]
    for line in survivors(root):
        p = int(line.split(":", 1)[0])
        if not _gated(_cmdline(p)):
            outlived.append(line)
            continue
        while _alive(p) and _gated(_cmdline(p)) and time.monotonic() - start < limit_s:
            time.sleep(0.01)
        if _alive(p):  # it went through its gate after hermetic died: a build nothing will stop
            shown = _cmdline(p).replace(b"\0", b" ").decode(errors="replace")[:200]
            outlived.append(f"{p}: {shown}")
    return outlived, round(time.monotonic() - start, 3)


GATED_SHIM = b'lim.get("gate")'


def _gated(cmdline: bytes) -> bool:
    """Still on the way to the limits shim's gate, or at it: the shim itself, or bubblewrap about to become
    it (in the sandbox, bwrap's forked child carries bwrap's command line, the shim's text in it, until it
    execs the shim; that exec is not the gate). An empty command line is a process on its way out."""
    return GATED_SHIM in cmdline or cmdline == b""


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def end_processes(lines: list[str]) -> None:
    """Kill what a failed trial left running (``survivors`` lines start with the pid), so the next one is clean."""
    for line in lines:
        head = line.split(":", 1)[0]
        if head.isdigit():
            try:
                os.kill(int(head), signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- a throttled file server ---------------------------------------------------------------------------
class _FileHandler(BaseHTTPRequestHandler):
    files: dict[str, Path]
    chunk: int
    delay: float

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        path = self.files.get(self.path.lstrip("/"))
        if path is None:
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            for i in range(0, len(data), self.chunk):
                self.wfile.write(data[i: i + self.chunk])
                self.wfile.flush()
                time.sleep(self.delay)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client was killed mid-download: that is the point


@dataclass
class FileServer:
    url: str
    files: dict[str, Path]

    def add(self, path: Path) -> str:
        self.files[path.name] = path
        return f"{self.url}/{path.name}"


@contextmanager
def serve_files(*, chunk: int = 64 << 10, delay: float = 0.004) -> Iterator[FileServer]:
    files: dict[str, Path] = {}
    handler = type("H", (_FileHandler,), {"files": files, "chunk": chunk, "delay": delay})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FileServer(f"http://127.0.0.1:{server.server_address[1]}", files)
    finally:
        server.shutdown()
        server.server_close()


# --- roots -----------------------------------------------------------------------------------------------
def toolchain_wheels_from(store_root: Path, folder: Path) -> Path:
    """A find-links folder with the wheel files another root already holds (its unpacked entries' wheels)."""
    folder.mkdir(parents=True, exist_ok=True)
    store = Store(store_root / "store")
    for name in store.iter_entries():
        meta = store.record(name)
        if meta["kind"] != "unpacked":
            continue
        blob = store.blob_path(meta["wheel"])
        if blob.exists() and not (folder / meta["filename"]).exists():
            os.symlink(blob, folder / meta["filename"])
    return folder


def realize_toolchain(root: Path, env: dict[str, str], cwd: Path, find_links: Path | None = None) -> None:
    """The CUDA toolchain realized in ``root`` (from ``find_links`` only, when given; else pip's indexes)."""
    extra = {"PIP_FIND_LINKS": str(find_links), "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull} \
        if find_links else {}
    run = cli.run(root, "realize", REPO / "recipes" / "toolchain.toml", env={**env, **extra}, cwd=cwd)
    if run.rc != 0:
        raise RuntimeError(f"realizing the toolchain failed:\n{run.err[-3000:]}")


# --- the crash lab -----------------------------------------------------------------------------------------
def _env_wheels(out: Path) -> list[BuiltWheel]:
    """Two wheels for the recipe's environment: one of 3 MiB of incompressible bytes (a download that lasts),
    one of 300 small files (an unpack that lasts)."""
    rng = random.Random(7)
    bulk = build_wheel(out, "crashbulk", "1.0", {f"crashbulk/data{i}.bin": rng.randbytes(768 << 10)
                                                 for i in range(4)})
    many = build_wheel(out, "crashmany", "1.0", {f"crashmany/m{i // 50}/f{i}.py": f"V = {i}\n" * 20
                                                 for i in range(300)})
    return [bulk, many]


@dataclass
class Trial:
    index: int
    target: str                 # the phase the kill was aimed at
    delay_s: float              # how long after that phase's record the kill was sent
    phase: str | None = None    # the phase at death: the last phase record before the kill
    killed: bool = False
    rc: int | None = None
    survivors: list[str] = field(default_factory=list)
    survivors_wait_s: float = 0.0
    verify_rc: int | None = None
    verify_problems: list[dict[str, Any]] = field(default_factory=list)
    recovered: bool = False
    recovery_compiled: int = 0
    recovery_reused: int = 0
    module_identical: str = ""  # "bytes", "normalized" or "" (differs)
    receipt_ok: bool = False
    garbage_left: list[str] = field(default_factory=list)
    outside_root: list[str] = field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.killed and not self.problems


class CrashLab:
    """One scratch root (its toolchain already realized) and one project: a small real C++/CUDA extension
    (tests/data/reuse_src without its __TIME__) plus two environment wheels served slowly over loopback."""

    def __init__(self, work: Path, root: Path, env: dict[str, str], server: FileServer, name: str = "crash") -> None:
        self.work, self.root, self.name, self.server = work, root, name, server
        self.cwd = work / "cwd"
        self.home, self.tmp = work / "home", work / "tmp"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.env = {**env, "HOME": str(self.home), "TMPDIR": str(self.tmp)}
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.project = work / "project"
        self.recipe = self.project / "recipe.toml"
        self.reference: bytes | None = None
        self.reference_raw: bytes | None = None

    def setup(self) -> dict[str, Any]:
        """Write the project, realize it once uninterrupted (the reference module), then forget it."""
        shutil.copytree(FIXTURE_SRC, self.project / "src")
        clock = self.project / "src" / "clock.cpp"
        clock.write_text(clock.read_text().replace("__TIME__", '"fixed"'))  # else no two builds agree
        shutil.copy(TOOLCHAIN_LOCK, self.project)
        lines = [f"{w.name} @ {self.server.add(w.path)} --hash=sha256:{w.sha256}\n"
                 for w in _env_wheels(self.work / "wheels")]
        (self.project / "env.lock.txt").write_text("".join(lines))
        ext = 'name = "crash_ext"\nsource = "src"\nsources = ["*.cpp", "*.cu"]\ninclude_dirs = ["."]'
        self.recipe.write_text(recipe_toml(self.name, locks=["env.lock.txt"], toolchain=True, archs=["9.0"],
                                           sources={"src": "src"}, jobs=2, extensions=[ext]))
        start = time.monotonic()
        run = self._realize()
        if run.rc != 0:
            raise RuntimeError(f"the uninterrupted realize failed:\n{run.err[-3000:]}")
        self.reference_raw = self._module_bytes()
        self.reference = normalized(self.reference_raw)
        seconds = time.monotonic() - start
        receipt = json.loads(Path(run.result["receipt"]).read_text())  # before gc --drop-root removes it
        self._forget()
        return {"reference_realize_s": round(seconds, 2), "module_bytes": len(self.reference_raw),
                "phases": [r["phase"] for r in run.records if r.get("event") == "phase"],
                "sandbox": receipt.get("sandbox")}

    def _realize(self) -> Result:
        return cli.run(self.root, "realize", self.recipe, "--json", env=self.env, cwd=self.cwd)

    def _module_bytes(self) -> bytes:
        mods = sorted((self.root / "profiles" / self.name).glob("crash_ext*.so"))
        assert len(mods) == 1, mods
        return mods[0].read_bytes()

    def _forget(self) -> Result:
        """gc --drop-root: the recipe is cold again (wheels, sources, objects, module all collected)."""
        run = cli.run(self.root, "gc", "--drop-root", self.name, "--json", env=self.env, cwd=self.cwd)
        if run.rc != 0:
            raise RuntimeError(f"gc failed:\n{run.err[-3000:]}")
        return run

    def trial(self, index: int, target: str, delay_s: float) -> Trial:
        t = Trial(index, target, round(delay_s, 4))
        start = time.monotonic()
        audit = OutsideRootAudit(self.root, home=self.home, temp_dirs=[self.tmp], cwd=self.cwd)
        audit.start()
        proc = cli.popen(self.root, "realize", self.recipe, "--json", env=self.env, cwd=self.cwd)
        err_chunks: list[str] = []
        err_thread = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        err_thread.start()
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "phase" and rec.get("phase") == target:
                if delay_s:
                    time.sleep(delay_s)
                if proc.poll() is None:
                    t.survivors, t.survivors_wait_s = kill_and_reap(proc.pid, self.root)
                break
        lines += proc.stdout.read().splitlines(keepends=True)
        t.rc = proc.wait()
        err_thread.join()
        t.killed = t.rc == -signal.SIGKILL
        phases = [json.loads(x).get("phase") for x in lines if x.startswith("{") and '"phase"' in x
                  and json.loads(x).get("event") == "phase"]
        t.phase = phases[-1] if phases else None
        if not t.killed:
            t.problems.append(f"not killed: the realize ended with {t.rc} before the kill"
                              + (f":\n{''.join(err_chunks)[-1500:]}" if t.rc else ""))
        if t.survivors:
            t.problems.append(f"processes outlived hermetic: {t.survivors}")
            end_processes(t.survivors)
        verify = cli.run(self.root, "verify", "--json", env=self.env, cwd=self.cwd)
        t.verify_rc, t.verify_problems = verify.rc, verify.result.get("problems", [])
        if verify.rc != 0 or t.verify_problems:
            t.problems.append(f"verify after the kill: exit {verify.rc}, {t.verify_problems[:5]}")
        again = self._realize()
        t.recovered = again.rc == 0
        if not t.recovered:
            t.problems.append(f"the next realize failed ({again.rc}):\n{again.err[-2000:]}")
        else:
            self._check_recovery(t, again)
        gc = self._forget()
        store = self.root / "store"
        t.garbage_left = sorted(str(p.relative_to(store)) for d in ("tmp", "trash") if (store / d).exists()
                                for p in (store / d).iterdir())
        if t.garbage_left:
            t.problems.append(f"gc left garbage: {t.garbage_left[:5]}")
        if gc.result.get("live_entries", 0) <= 0:
            t.problems.append("gc reports no live entries: the toolchain root was lost")
        outside = audit.finish()
        t.outside_root = outside["created"] + outside["changed"] + outside["removed"]
        if t.outside_root:
            t.problems.append(f"written outside the root: {t.outside_root[:5]}")
        t.seconds = round(time.monotonic() - start, 2)
        return t

    def _check_recovery(self, t: Trial, run: Result) -> None:
        assert self.reference is not None and self.reference_raw is not None
        data = self._module_bytes()
        # nvcc's intermediate files are named after the object (--objdir-as-tempdir): byte for byte, unmasked
        if data == self.reference_raw:
            t.module_identical = "bytes"
        elif normalized(data) == self.reference:
            t.module_identical = "normalized"
            t.problems.append("the module differs from the uninterrupted build's but for nvcc's temp names")
        else:
            t.problems.append("the module differs from the uninterrupted build's (after masking nvcc temp names)")
        counts = run.result.get("counts", {})
        t.recovery_compiled = int(counts.get("objects_compiled", 0))
        t.recovery_reused = int(counts.get("objects_reused", 0))
        receipt_path = run.result.get("receipt")
        try:
            receipt = json.loads(Path(str(receipt_path)).read_text())
        except (OSError, ValueError, TypeError):
            t.problems.append(f"no readable receipt after recovery ({receipt_path})")
            return
        profile_mod = sorted((self.root / "profiles" / self.name).glob("crash_ext*.so"))[0]
        want = hashlib.sha256(profile_mod.read_bytes()).hexdigest()
        mods = receipt.get("modules", [])
        t.receipt_ok = (receipt.get("tree") == run.result.get("tree") and len(mods) == 1
                        and mods[0].get("sha256") == want and "outside_root_audit" in receipt)
        if not t.receipt_ok:
            t.problems.append(f"the receipt {receipt_path} does not describe the realized tree and module")


def summarize(trials: list[Trial]) -> dict[str, Any]:
    by_phase: dict[str, int] = {}
    for t in trials:
        if t.killed and t.phase:
            by_phase[t.phase] = by_phase.get(t.phase, 0) + 1
    return {
        "trials": len(trials),
        "killed": sum(t.killed for t in trials),
        "ok": sum(t.ok for t in trials),
        "kills_by_phase": dict(sorted(by_phase.items(), key=lambda kv: PHASES.index(kv[0]))),
        "missing_phases": [p for p in REQUIRED_PHASES if p not in by_phase],
        "corrupt_entries": sum(len(t.verify_problems) for t in trials),
        "survivors": sum(len(t.survivors) for t in trials),
        "max_reaper_wait_s": max((t.survivors_wait_s for t in trials), default=0.0),
        "modules_identical": {k: sum(t.module_identical == k for t in trials) for k in ("bytes", "normalized")},
        "bad_receipts": sum(t.recovered and not t.receipt_ok for t in trials),
        "outside_root_writes": sum(len(t.outside_root) for t in trials),
        "garbage_after_gc": sum(len(t.garbage_left) for t in trials),
        "failed": [asdict(t) for t in trials if not t.ok],
    }
