"""Runner files (`runner/worker.toml`): what `hermetic run` realizes, measures and checks. Strictly validated.

docs/run.md documents every key. Cells are named configurations of one worker call (graph, depth, batch,
request mask); each cell runs once per kernel set of the device (`torch` on a CPU; the stock and facc
exllamav3 modules on a GPU; ``compiled``, torch's ops through torch.compile, on both), so a label is
``cell/kernels``. Comparisons name two labels; a label without ``/kernels`` means the device's first kernel set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hermetic.errors import BadInput
from hermetic.recipe import MODULE_RE, NAME_RE, inside_repo, repo_file, size_bytes, strings, usable_cpus
from hermetic.tomlutil import KeyPath, TomlDoc, check_keys, expect_type, get_key, load_toml, sandbox_mode

MASKS = ("greedy", "alternate", "alternate-odd", "sampled")
GRAPHS = ("original", "switch")
REPETITIONS_MAX = 1000                # what --repetitions and [protocol] repetitions accept
COMPILE_BACKENDS = ("inductor",)      # `compiled = { compile = "inductor" }`: C++ on a CPU, Triton on a GPU


@dataclass(frozen=True)
class Cell:
    name: str
    graph: str
    depth: int
    batch: int
    mask: str = "greedy"

    def mask_bits(self) -> list[int]:
        return mask_bits(self.mask, self.batch)


def mask_bits(mask: str, batch: int) -> list[int]:
    """Per-row 0 (greedy, T0) / 1 (sampled, T1)."""
    if mask == "greedy":
        return [0] * batch
    if mask == "sampled":
        return [1] * batch
    first = 1 if mask == "alternate-odd" else 0
    return [(i + first) % 2 for i in range(batch)]


@dataclass(frozen=True)
class Compare:
    name: str
    a: str
    b: str


@dataclass(frozen=True)
class DeviceSpec:
    """Limits and preconditions for one kind of run (cpu or gpu)."""
    kind: str
    realize: tuple[Path, ...]
    kernels: tuple[str, ...]
    threads: int = 1
    cpus: tuple[int, ...] | None = None
    nice: int = 0
    memory: int = 8 << 30                 # resident-memory guard over the worker's process tree
    address_space: int | None = None      # CPU runs only (CUDA's mappings need more than any sane limit)
    sandbox: str | None = None            # the measuring process's: auto, required or off; None: not set here
    warnings: tuple[str, ...] = ()        # what the run says of these limits (CPUs of cpus this machine lacks)
    # gpu only
    lock_timeout: float = 3600.0
    lock_dir: str | None = None
    power_cap_w: float | None = None
    min_free_memory: int = 0
    l2_flush: bool = True
    settle_seconds: float = 0.5
    heavy_power_fraction: float = 0.8


@dataclass(frozen=True)
class Protocol:
    repetitions: int = 5
    calls: int = 10
    warmup_calls: int = 3
    warmup_seconds: float = 1.0
    threshold: float = 0.005
    target_halfwidth: float = 0.005
    confidence: float = 0.95
    aa_cell: str = ""
    aa_max_width: float = 4.0         # the widest A/A interval that still decides, in thresholds
    cpu_lock_timeout: float = 600.0


@dataclass(frozen=True)
class Runner:
    path: Path
    name: str
    worker: Path
    factory: str
    states: Path
    digests: Path
    params: dict[str, Any]
    modules: dict[str, str]           # kernel set -> module ("" = torch's own ops, and every compiled set)
    p2p_module: str
    cpu: DeviceSpec
    gpu: DeviceSpec
    protocol: Protocol
    cells: tuple[Cell, ...]
    compares: tuple[Compare, ...]
    check_depths: tuple[int, ...]
    check_batches: tuple[int, ...]
    doc: TomlDoc = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    compiled: dict[str, str] = field(default_factory=dict)  # kernel set -> torch.compile backend

    def device(self, kind: str) -> DeviceSpec:
        return self.gpu if kind == "gpu" else self.cpu

    def with_overrides(self, *, repetitions: int | None = None, power_cap_w: float | None = None,
                       lock_timeout: float | None = None, states: Path | None = None) -> Runner:
        r = self
        if repetitions is not None:
            if not 2 <= repetitions <= REPETITIONS_MAX:
                raise BadInput(f"--repetitions must be 2-{REPETITIONS_MAX}, found {repetitions}", where="--repetitions",
                               hint="at least 2 (paired ratios), 10 or more for decisions")
            r = replace(r, protocol=replace(r.protocol, repetitions=repetitions))
        if power_cap_w is not None:
            r = replace(r, gpu=replace(r.gpu, power_cap_w=power_cap_w))
        if lock_timeout is not None:
            r = replace(r, gpu=replace(r.gpu, lock_timeout=lock_timeout),
                        protocol=replace(r.protocol, cpu_lock_timeout=lock_timeout))
        if states is not None:
            if not states.is_file():
                raise BadInput(f"states file {states} does not exist", where="--states",
                               hint="a JSON file of request states (runner/make_states.py writes one)")
            r = replace(r, states=states.resolve())
        return r


def load_runner(path: Path) -> Runner:
    doc = load_toml(path)
    data = doc.data
    folder = path.resolve().parent
    check_keys(doc, data, {"runner", "worker", "kernels", "cpu", "gpu", "protocol", "checks", "cells",
                           "compare"}, ())
    run = _table(doc, data, "runner", required=True)
    check_keys(doc, run, {"name", "states", "digests"}, ("runner",))
    name = expect_type(doc, run.get("name"), str, ("runner", "name"))
    if not NAME_RE.match(name):
        raise BadInput(f"runner name {name!r} is not a plain name", where=doc.where("runner", "name"),
                       hint="use letters, digits, '.', '_' and '-'")
    states = repo_file(doc, folder, run.get("states"), ("runner", "states"))
    digests = inside_repo(doc, folder, expect_type(doc, run.get("digests"), str, ("runner", "digests")),
                      ("runner", "digests"))

    wk = _table(doc, data, "worker", required=True)
    check_keys(doc, wk, {"entry", "p2p", "params"}, ("worker",))
    entry = expect_type(doc, wk.get("entry"), str, ("worker", "entry"))
    file_part, sep, factory = entry.partition(":")
    if not sep or not factory.isidentifier():
        raise BadInput(f"worker.entry {entry!r} is not FILE.py:FUNCTION", where=doc.where("worker", "entry"),
                       hint='for example entry = "draft_worker.py:make_worker"')
    worker = repo_file(doc, folder, file_part, ("worker", "entry"))
    p2p = get_key(doc, wk, "p2p", str, ("worker",)) or "hermetic_p2p"
    params = expect_type(doc, wk.get("params", {}), dict, ("worker", "params"))
    for k, v in params.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v < 1 << 24:
            raise BadInput(f"worker.params.{k} must be a positive number below 2^24, found {v!r:.40}",
                           where=doc.where("worker", "params", k), hint="for example hidden = 512")

    kern = _table(doc, data, "kernels", required=True)
    modules: dict[str, str] = {}
    compiled: dict[str, str] = {}
    for k, v in kern.items():
        if isinstance(v, dict):  # a compiled set: torch's ops through torch.compile
            check_keys(doc, v, {"compile"}, ("kernels", k))
            backend = get_key(doc, v, "compile", str, ("kernels", k), required=True)
            if backend not in COMPILE_BACKENDS or not NAME_RE.match(k):
                raise BadInput(f"kernels.{k}.compile = {backend!r} is not a torch.compile backend this runner knows",
                               where=doc.where("kernels", k), hint=f'compile = "{COMPILE_BACKENDS[0]}"')
            modules[k], compiled[k] = "", backend
            continue
        mod = expect_type(doc, v, str, ("kernels", k))
        if not NAME_RE.match(k) or (mod and not MODULE_RE.match(mod)):
            raise BadInput(f"kernels.{k} = {mod!r} is not a kernel set name and a module name",
                           where=doc.where("kernels", k), hint='for example stock = "exllamav3_ext"; '
                                                               'torch = "" for torch\'s own ops')
        modules[k] = mod

    cpu = _device(doc, folder, data, "cpu", modules)
    gpu = _device(doc, folder, data, "gpu", modules)
    protocol = _protocol(doc, _table(doc, data, "protocol"))
    chk = _table(doc, data, "checks")
    check_keys(doc, chk, {"depths", "batches"}, ("checks",))
    depths = tuple(_ints(doc, chk, "depths", ("checks",), 1, 16) or (4, 5))
    batches = tuple(_ints(doc, chk, "batches", ("checks",), 1, 64) or (1, 2, 3, 4))
    cells = tuple(_cell(doc, i, c) for i, c in
                  enumerate(expect_type(doc, data.get("cells", []), list, ("cells",))))
    if not cells:
        raise BadInput("the runner has no [[cells]]", where=str(path), hint="add at least one [[cells]] table")
    names = [c.name for c in cells]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise BadInput(f"cell {dup!r} is defined twice", where=doc.where("cells"), hint="give each cell its name")
    if protocol.aa_cell and protocol.aa_cell not in names:
        raise BadInput(f"protocol.aa_cell {protocol.aa_cell!r} is not a cell", where=doc.where("protocol", "aa_cell"),
                       hint=f"one of: {', '.join(names)}")
    compares = tuple(_compare(doc, i, c, names) for i, c in
                     enumerate(expect_type(doc, data.get("compare", []), list, ("compare",))))
    return Runner(path.resolve(), name, worker, factory, states, digests, params, modules, p2p, cpu, gpu,
                  protocol, cells, compares, depths, batches, doc, compiled)


def _table(doc: TomlDoc, data: dict[str, Any], key: str, *, required: bool = False) -> dict[str, Any]:
    if key not in data:
        if required:
            raise BadInput(f"the runner has no [{key}] table", where=str(doc.path), hint=f"add [{key}]")
        return {}
    return expect_type(doc, data[key], dict, (key,))


def _ints(doc: TomlDoc, table: dict[str, Any], key: str, kp: KeyPath, lo: int, hi: int) -> list[int]:
    values = expect_type(doc, table.get(key, []), list, (*kp, key))
    out = []
    for i, v in enumerate(values):
        n = expect_type(doc, v, int, (*kp, key, i))
        if not lo <= n <= hi:
            raise BadInput(f"{key}[{i}] must be {lo}-{hi}, found {n}", where=doc.where(*kp, key, i),
                           hint=f"a value from {lo} to {hi}")
        out.append(n)
    return out


def _number(doc: TomlDoc, table: dict[str, Any], key: str, kp: KeyPath, lo: float, hi: float,
            default: float) -> float:
    if key not in table:
        return default
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadInput(f"{key} must be a number, found {v!r:.40}", where=doc.where(*kp, key), hint=f"{key} = {default}")
    if not lo <= v <= hi:
        raise BadInput(f"{key} must be {lo:g}-{hi:g}, found {v}", where=doc.where(*kp, key),
                       hint=f"for example {key} = {default}")
    return float(v)


def _device(doc: TomlDoc, folder: Path, data: dict[str, Any], kind: str, modules: dict[str, str]) -> DeviceSpec:
    kp: KeyPath = (kind,)
    t = _table(doc, data, kind, required=True)
    allowed = {"realize", "kernels", "threads", "cpus", "nice", "memory", "sandbox"}
    allowed |= {"address_space"} if kind == "cpu" else {"lock_timeout", "lock_dir", "power_cap_w",
                                                          "min_free_memory", "l2_flush", "settle_seconds",
                                                          "heavy_power_fraction"}
    check_keys(doc, t, allowed, kp)
    realize = tuple(repo_file(doc, folder, p, (*kp, "realize", i))
                    for i, p in enumerate(strings(doc, t, "realize", kp)))
    kernels = tuple(strings(doc, t, "kernels", kp))
    if not kernels:
        raise BadInput(f"[{kind}] names no kernel sets", where=doc.where(*kp), hint='kernels = ["torch"]')
    for i, k in enumerate(kernels):
        if k not in modules:
            raise BadInput(f"kernel set {k!r} is not defined in [kernels]", where=doc.where(*kp, "kernels", i),
                           hint=f"one of: {', '.join(modules)}")
    threads = int(_number(doc, t, "threads", kp, 1, 1024, 1))
    cpus_text = get_key(doc, t, "cpus", str, kp)
    cpus, warnings = usable_cpus(doc, cpus_text, (*kp, "cpus")) if cpus_text else (None, ())
    nice = int(_number(doc, t, "nice", kp, 0, 19, 0))
    mem_text = get_key(doc, t, "memory", str, kp)
    memory = size_bytes(doc, mem_text, (*kp, "memory")) if mem_text else 8 << 30
    spec = DeviceSpec(kind, realize, kernels, threads, cpus, nice, memory, sandbox=sandbox_mode(doc, t, kp),
                      warnings=warnings)
    if kind == "cpu":
        as_text = get_key(doc, t, "address_space", str, kp)
        return replace(spec, address_space=size_bytes(doc, as_text, (*kp, "address_space")) if as_text else None)
    free_text = get_key(doc, t, "min_free_memory", str, kp)
    lock_dir = get_key(doc, t, "lock_dir", str, kp)
    if lock_dir is not None and not lock_dir.startswith("/"):
        raise BadInput(f"gpu.lock_dir must be an absolute path, found {lock_dir!r}", where=doc.where(*kp, "lock_dir"),
                       hint="a folder every user of the machine can write, e.g. /run/lock/hermetic-gpu")
    cap = _number(doc, t, "power_cap_w", kp, 1, 5000, 0) or None
    return replace(spec, lock_timeout=_number(doc, t, "lock_timeout", kp, 0, 7 * 86400, 3600),
                   lock_dir=lock_dir, power_cap_w=cap,
                   min_free_memory=size_bytes(doc, free_text, (*kp, "min_free_memory")) if free_text else 0,
                   l2_flush=bool(get_key(doc, t, "l2_flush", bool, kp) if "l2_flush" in t else True),
                   settle_seconds=_number(doc, t, "settle_seconds", kp, 0, 60, 0.5),
                   heavy_power_fraction=_number(doc, t, "heavy_power_fraction", kp, 0.1, 1.0, 0.8))


def _protocol(doc: TomlDoc, t: dict[str, Any]) -> Protocol:
    kp: KeyPath = ("protocol",)
    check_keys(doc, t, {"repetitions", "calls", "warmup_calls", "warmup_seconds", "threshold",
                        "target_halfwidth", "confidence", "aa_cell", "aa_max_width", "cpu_lock_timeout"}, kp)
    return Protocol(repetitions=int(_number(doc, t, "repetitions", kp, 2, REPETITIONS_MAX, 5)),
                    calls=int(_number(doc, t, "calls", kp, 1, 10000, 10)),
                    warmup_calls=int(_number(doc, t, "warmup_calls", kp, 0, 10000, 3)),
                    warmup_seconds=_number(doc, t, "warmup_seconds", kp, 0, 600, 1.0),
                    threshold=_number(doc, t, "threshold", kp, 0.0001, 0.5, 0.005),
                    target_halfwidth=_number(doc, t, "target_halfwidth", kp, 0.0001, 0.5, 0.005),
                    confidence=_number(doc, t, "confidence", kp, 0.5, 0.999, 0.95),
                    aa_cell=get_key(doc, t, "aa_cell", str, kp) or "",
                    aa_max_width=_number(doc, t, "aa_max_width", kp, 1, 100, 4.0),
                    cpu_lock_timeout=_number(doc, t, "cpu_lock_timeout", kp, 0, 7 * 86400, 600))


def _cell(doc: TomlDoc, i: int, raw: object) -> Cell:
    kp: KeyPath = ("cells", i)
    t = expect_type(doc, raw, dict, kp)
    check_keys(doc, t, {"name", "graph", "depth", "batch", "mask"}, kp)
    name = expect_type(doc, t.get("name"), str, (*kp, "name"))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise BadInput(f"cell name {name!r} is not a plain name", where=doc.where(*kp, "name"),
                       hint="letters, digits, '.', '_' and '-'")
    graph = expect_type(doc, t.get("graph"), str, (*kp, "graph"))
    mask = get_key(doc, t, "mask", str, kp) or "greedy"
    for key, value, allowed in (("graph", graph, GRAPHS), ("mask", mask, MASKS)):
        if value not in allowed:
            raise BadInput(f"{key} {value!r} is not one of {', '.join(allowed)}", where=doc.where(*kp, key),
                           hint=f"{key} = \"{allowed[0]}\"")
    depth = int(_number(doc, t, "depth", kp, 1, 16, 4))
    batch = int(_number(doc, t, "batch", kp, 1, 64, 1))
    if graph == "original" and mask != "greedy":
        raise BadInput(f"cell {name!r}: the original graph is greedy only, found mask {mask!r}",
                       where=doc.where(*kp, "mask"), hint='use graph = "switch" for sampled rows')
    return Cell(name, graph, depth, batch, mask)


def _compare(doc: TomlDoc, i: int, raw: object, cells: list[str]) -> Compare:
    kp: KeyPath = ("compare", i)
    t = expect_type(doc, raw, dict, kp)
    check_keys(doc, t, {"name", "a", "b"}, kp)
    a = expect_type(doc, t.get("a"), str, (*kp, "a"))
    b = expect_type(doc, t.get("b"), str, (*kp, "b"))
    for key, label in (("a", a), ("b", b)):
        if label.partition("/")[0] not in cells:
            raise BadInput(f"compare.{key} {label!r} names no cell", where=doc.where(*kp, key),
                           hint=f"CELL or CELL/KERNELS with CELL one of: {', '.join(cells)}")
    return Compare(get_key(doc, t, "name", str, kp) or f"{b} vs {a}", a, b)
