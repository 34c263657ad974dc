"""GPU facts and run preconditions, read through NVML and never changed.

``GpuFacts`` is the small interface the precondition logic sees: NVML fills it on a GPU machine
(``nvml_facts``), recorded JSON fills it in tests (``GpuFacts.from_json``). hermetic reads power limits,
clocks and processes; it never sets power, clocks, persistence or application clocks.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuFacts:
    index: int
    uuid: str
    name: str
    arch: str                        # compute capability, "9.0"
    power_limit_w: float             # enforced power limit
    default_power_limit_w: float
    memory_total: int
    memory_free: int
    driver: str                      # "580.159.04"
    cuda_driver: str                 # the CUDA version the driver supports, "13.0"
    processes: tuple[dict[str, int], ...] = ()   # compute processes: pid, used_memory
    state: dict[str, Any] = field(default_factory=dict)  # persistence, compute mode, clocks, ... (recorded)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["processes"] = [dict(p) for p in self.processes]
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> GpuFacts:
        return GpuFacts(index=int(d["index"]), uuid=str(d["uuid"]), name=str(d["name"]), arch=str(d["arch"]),
                        power_limit_w=float(d["power_limit_w"]),
                        default_power_limit_w=float(d.get("default_power_limit_w", d["power_limit_w"])),
                        memory_total=int(d["memory_total"]), memory_free=int(d["memory_free"]),
                        driver=str(d["driver"]), cuda_driver=str(d["cuda_driver"]),
                        processes=tuple({"pid": int(p["pid"]), "used_memory": int(p.get("used_memory", 0))}
                                        for p in d.get("processes", ())),
                        state=dict(d.get("state", {})))


@dataclass(frozen=True)
class Failure:
    key: str          # the runner key or fact that failed
    found: str
    expected: str
    hint: str


def check_preconditions(facts: GpuFacts, *, power_cap_w: float | None, min_free_memory: int,
                        archs: tuple[str, ...], toolchain_cuda: str | None,
                        own_pids: frozenset[int] = frozenset()) -> list[Failure]:
    """Everything that must hold before a GPU run starts; an empty list means go."""
    out: list[Failure] = []
    if power_cap_w is not None and abs(facts.power_limit_w - power_cap_w) > 0.5:
        out.append(Failure("gpu.power_cap_w", f"{facts.power_limit_w:g} W", f"{power_cap_w:g} W",
                           "the card's enforced power limit differs from the runner's expectation; hermetic never "
                           "changes it: run where the cap holds, or set the expectation (--power-cap W)"))
    others = [p for p in facts.processes if p["pid"] not in own_pids]
    if others:
        pids = ", ".join(str(p["pid"]) for p in others)
        out.append(Failure("gpu.processes", f"{len(others)} other compute process(es): pid {pids}", "none",
                           "another process is using this GPU; wait until it ends or pick another GPU (--gpu N)"))
    if facts.memory_free < min_free_memory:
        out.append(Failure("gpu.min_free_memory", f"{facts.memory_free / 2**30:.1f} GiB free",
                           f"at least {min_free_memory / 2**30:.1f} GiB", "free GPU memory or lower min_free_memory"))
    if archs and not _arch_built(facts.arch, archs):
        out.append(Failure("gpu.arch", f"compute capability {facts.arch}", f"one of {', '.join(archs)}",
                           f"the modules were built for {', '.join(archs)}: add {facts.arch} to the recipe's "
                           "toolchain.archs and realize again"))
    if toolchain_cuda and _version(facts.cuda_driver) < _version(toolchain_cuda):
        out.append(Failure("gpu.driver", f"driver {facts.driver} (CUDA {facts.cuda_driver})",
                           f"a driver for CUDA {toolchain_cuda} or newer",
                           "update the NVIDIA driver, or use a toolchain the driver supports"))
    return out


def _version(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in v.split(".")[:2])
    except ValueError:
        return (0,)


def _arch_built(arch: str, archs: tuple[str, ...]) -> bool:
    for a in archs:
        base = a.replace("+PTX", "").rstrip("af")
        if base == arch:
            return True
        if a.endswith("+PTX") and _version(base) <= _version(arch):
            return True  # PTX is JIT-compiled for newer GPUs
    return False


# NVML ------------------------------------------------------------------------------------------------------
class NvmlUnavailable(Exception):
    pass


def nvml() -> Any:
    """pynvml, initialized; NvmlUnavailable where there is no library, driver or GPU."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from e
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            raise NvmlUnavailable("NVML sees no GPU")
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML: {e}") from e
    return pynvml


def gpu_count() -> int:
    try:
        return int(nvml().nvmlDeviceGetCount())
    except NvmlUnavailable:
        return 0


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_facts(index: int) -> GpuFacts:
    nv = nvml()
    h = nv.nvmlDeviceGetHandleByIndex(index)
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    cuda = nv.nvmlSystemGetCudaDriverVersion_v2()
    procs = tuple({"pid": int(p.pid), "used_memory": int(p.usedGpuMemory or 0)}
                  for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
    state: dict[str, Any] = {}
    for key, fn in (("persistence_mode", lambda: nv.nvmlDeviceGetPersistenceMode(h)),
                    ("compute_mode", lambda: nv.nvmlDeviceGetComputeMode(h)),
                    ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                    ("sm_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                    ("mem_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                    ("app_sm_clock_mhz", lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM)),
                    ("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                    ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000),
                    ("clock_event_reasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
                    ("ecc_mode", lambda: nv.nvmlDeviceGetEccMode(h)[0]),
                    ("mig_mode", lambda: nv.nvmlDeviceGetMigMode(h)[0]),
                    ("pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                    ("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h))):
        try:
            state[key] = fn()
        except (nv.NVMLError, AttributeError):
            state[key] = None
    return GpuFacts(index=index, uuid=_text(nv.nvmlDeviceGetUUID(h)), name=_text(nv.nvmlDeviceGetName(h)),
                    arch=f"{major}.{minor}", power_limit_w=nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                    default_power_limit_w=nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000,
                    memory_total=int(mem.total), memory_free=int(mem.free),
                    driver=_text(nv.nvmlSystemGetDriverVersion()),
                    cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}", processes=procs, state=state)


def own_process_tree() -> frozenset[int]:
    """This process and its children: their GPU contexts are ours, not another tenant's."""
    try:
        import psutil
        me = psutil.Process(os.getpid())
        return frozenset([me.pid, *(c.pid for c in me.children(recursive=True))])
    except Exception:
        return frozenset([os.getpid()])


# the link between a pair's two cards -----------------------------------------------------------------------
# NVML's topology levels (nvmlGpuTopologyLevel_t), by the words the receipt uses
TOPOLOGY = {0: "internal", 10: "single PCIe switch", 20: "multiple PCIe switches", 30: "PCIe host bridge",
            40: "same CPU (NUMA node)", 50: "across CPUs (SMP interconnect)"}


def link_word(link: dict[str, Any]) -> str:
    """The link's kind in a pair's device class: ``nvlink``, ``pcie`` or ``cpu``."""
    return str(link.get("kind", "cpu"))


def nvml_link(a: int, b: int) -> dict[str, Any]:
    """The link between GPUs ``a`` and ``b`` as NVML sees it: the NVLinks of ``a`` whose remote end is ``b``'s
    PCI bus (``{"kind": "nvlink", "links": N}``), else the PCIe path's common ancestor (``{"kind": "pcie",
    "topology": ...}``). Read only; a fact NVML cannot give is None, never guessed."""
    nv = nvml()
    ha, hb = nv.nvmlDeviceGetHandleByIndex(a), nv.nvmlDeviceGetHandleByIndex(b)
    bus_b = _text(nv.nvmlDeviceGetPciInfo(hb).busId).lower()
    links = direct = 0
    version = None
    for n in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nv.nvmlDeviceGetNvLinkState(ha, n) != nv.NVML_FEATURE_ENABLED:
                continue
            remote = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo_v2(ha, n).busId).lower()
            version = version or nv.nvmlDeviceGetNvLinkVersion(ha, n)
        except (nv.NVMLError, AttributeError):
            continue
        # an NVSwitch system's links end on a switch, not on b: they count as links of the fabric both share
        links += 1
        direct += remote.lstrip("0") == bus_b.lstrip("0")
    try:
        level = int(nv.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
        topology: str | None = TOPOLOGY.get(level, f"level {level}")
    except (nv.NVMLError, AttributeError):
        topology = None
    if links:
        return {"kind": "nvlink", "links": links, "direct_to_peer": direct, "nvlink_version": version,
                "topology": topology}
    return {"kind": "pcie", "links": 0, "topology": topology}
