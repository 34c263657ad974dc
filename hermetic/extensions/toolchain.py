"""The CUDA toolchain assembled from the nvidia compiler wheels.

The wheels unpack to ``nvidia/cu<major>/`` with nvcc, the crt and cccl headers and a versioned
``libcudart.so.<major>``. nvcc's profile searches ``lib64`` and torch links ``-lcudart``, so the tree gets
``lib64 -> lib`` and ``lib/libcudart.so -> libcudart.so.<major>`` (toolchain-measurements.md, section 2).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hermetic import fs
from hermetic.errors import BadInput, PreconditionFailed
from hermetic.extensions.host import HostFacts
from hermetic.recipe import Recipe, Toolchain
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store, entry_ref
from hermetic.store.records import HostCompiler, ToolchainId
from hermetic.store.trees import FileMap, build_tree, merge_files, set_profile, tree_entry_name
from hermetic.wheels.unpacked import Unpacked

TOOL_TIMEOUT_S = 120.0  # a tool asked for its version answers in milliseconds


def cuda_home_rel(toolchain: Toolchain) -> str:
    return f"nvidia/cu{toolchain.cuda.split('.')[0]}"


def toolchain_links(toolchain: Toolchain, files: FileMap) -> dict[str, str]:
    home = cuda_home_rel(toolchain)
    major = toolchain.cuda.split(".")[0]
    if f"{home}/bin/nvcc" not in files:
        raise BadInput(f"the toolchain's locks provide no {home}/bin/nvcc",
                       hint=f"lock nvidia-cuda-nvcc, nvidia-nvvm, nvidia-cuda-crt, nvidia-cuda-cccl and "
                            f"nvidia-cuda-runtime of CUDA {toolchain.cuda}")
    links = {f"{home}/lib64": "lib"}
    if f"{home}/lib/libcudart.so.{major}" in files:
        links[f"{home}/lib/libcudart.so"] = f"libcudart.so.{major}"
    return links


# --- what the toolchain is, and whether it matches torch ------------------------------------------
@dataclass(frozen=True)
class ToolchainInfo:
    cuda_home: Path          # through the stable profile path, so commands do not change with the tree
    nvcc_version: str        # "13.0.88"
    cudart_version: str      # "13.0", from CUDART_VERSION in the headers
    entry: str               # the tree entry: content-addressed, so it identifies every toolchain byte

    @property
    def nvcc(self) -> Path:
        return self.cuda_home / "bin" / "nvcc"

    @property
    def release(self) -> str:
        return ".".join(self.nvcc_version.split(".")[:2])

    @property
    def objdir_temps(self) -> bool:
        """Whether this nvcc has --objdir-as-tempdir (documented from CUDA 12.4): its intermediate files then lie
        beside the object, named after it rather than after nvcc's process id, so the names that land in the
        object (its static initializer's symbol among them) are the same at every compile."""
        m = re.match(r"(\d+)\.(\d+)", self.nvcc_version)
        return m is not None and (int(m.group(1)), int(m.group(2))) >= (12, 4)  # unknown: nvcc's default


@dataclass(frozen=True)
class PreparedToolchain:
    info: ToolchainInfo
    id: ToolchainId                     # what object keys name of it: the tree and the host compilers
    compilers: dict[str, HostCompiler]
    built: bool                         # its tree was laid out now

    @classmethod
    def stored(cls, root: Root, store: Store, recipe: Recipe, entry: str) -> PreparedToolchain:
        """A toolchain whose tree is in the store already, as a plan sees it without preparing it: found through
        the store (no profile made), nvcc not asked (``objdir_temps`` off: it changes the map flags only, which
        no key holds), the host compilers as the real run records them."""
        assert recipe.toolchain is not None
        info = ToolchainInfo(store.entry_path(entry) / "out" / cuda_home_rel(recipe.toolchain), "", "", entry)
        compilers = {"c++": host_compiler(root, "c++"), "gcc": host_compiler(root, "gcc")}
        return cls(info, {"cuda": entry, "host_compilers": compilers}, compilers, False)


@dataclass(frozen=True)
class ToolchainStep:
    """What a realize decides of the toolchain: its tree's entry (None while the wheels' files are not known:
    some are still to be fetched) and whether it is in the store (``reuse``) or laid out (``assemble``)."""
    cuda: str
    entry: str | None
    action: str


def toolchain_label(recipe: Recipe) -> str:
    return f"{recipe.name}.toolchain"


def point_toolchain_profile(root: Root, store: Store, recipe: Recipe, tree: str) -> Path:
    """``profiles/<recipe>.toolchain`` pointed at the toolchain's tree (unchanged when it already is): at step 4,
    again once the build holds its lock (every compile and the link name CUDA through this profile, and a `gc
    --drop-root` of the recipe before that lock removed it; one after it waits for the lock: store.gc), and in
    the realize's finish with the recipe's own profile."""
    return set_profile(root.profiles, toolchain_label(recipe), store, tree)


def plan_toolchain(store: Store, recipe: Recipe, files: FileMap | None) -> ToolchainStep:
    """The toolchain's tree, named by the unpacked wheels' files (``files``; None when not all are known)."""
    assert recipe.toolchain is not None
    entry = None if files is None else \
        tree_entry_name(toolchain_label(recipe), files, toolchain_links(recipe.toolchain, files))
    return ToolchainStep(recipe.toolchain.cuda, entry,
                         "reuse" if entry is not None and store.has_entry(entry) else "assemble")


def prepare_toolchain(root: Root, store: Store, recipe: Recipe, unpacked: list[Unpacked], host: HostFacts,
                      reporter: Reporter) -> PreparedToolchain:
    """The toolchain's wheels as a tree with its profile; nvcc, the runtime headers and torch agree."""
    assert recipe.toolchain is not None
    reporter.event("phase", phase="toolchain")
    label = toolchain_label(recipe)
    files = merge_files((u.entry, u.files) for u in unpacked)
    tree, built = build_tree(store, label, files, toolchain_links(recipe.toolchain, files),
                             refs=[entry_ref(u.entry) for u in unpacked])
    profile = point_toolchain_profile(root, store, recipe, tree)
    info = inspect_toolchain(root, profile, recipe.toolchain, tree)
    check_compatible(info, recipe.toolchain, host.require_torch(host.executable).cuda, host.executable)
    compilers = {"c++": host_compiler(root, "c++"), "gcc": host_compiler(root, "gcc")}
    return PreparedToolchain(info, {"cuda": tree, "host_compilers": compilers}, compilers, built)


def inspect_toolchain(root: Root, profile: Path, toolchain: Toolchain, entry: str) -> ToolchainInfo:
    cuda_home = profile / cuda_home_rel(toolchain)
    nvcc_version = _cached_output(root, cuda_home / "bin" / "nvcc", ["--version"], _parse_nvcc_version)
    header = cuda_home / "include" / "cuda_runtime_api.h"
    try:
        m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text(errors="replace"))
    except OSError:
        m = None
    if m is None:
        raise BadInput(f"no CUDART_VERSION in {header}", hint="lock nvidia-cuda-runtime in the toolchain lock")
    v = int(m.group(1))
    return ToolchainInfo(cuda_home, nvcc_version, f"{v // 1000}.{(v % 1000) // 10}", entry)


def check_compatible(info: ToolchainInfo, toolchain: Toolchain, torch_cuda: str | None,
                     python: str | None = None) -> None:
    """nvcc's release, the runtime headers' CUDART_VERSION and torch.version.cuda (of the interpreter
    ``python``) must name one CUDA."""
    found = {"nvcc": info.release, "CUDART_VERSION (nvidia-cuda-runtime headers)": info.cudart_version,
             "recipe toolchain.cuda": toolchain.cuda}
    if torch_cuda is not None:
        found["torch.version.cuda"] = ".".join(torch_cuda.split(".")[:2])
    if len(set(found.values())) == 1:
        return
    want = found.get("torch.version.cuda", toolchain.cuda)
    listing = ", ".join(f"{k} {v}" + (f" (the torch of {python})" if k == "torch.version.cuda" and python else "")
                        for k, v in found.items())
    raise PreconditionFailed(
        f"the CUDA toolchain does not match: {listing} (nvcc {info.nvcc_version})",
        hint=f"pin every compiler wheel to CUDA {want}: nvidia-cuda-nvcc=={want}.*, nvidia-nvvm=={want}.*, "
             f"nvidia-cuda-crt=={want}.*, nvidia-cuda-cccl=={want}.*, nvidia-cuda-runtime=={want}.* "
             f"(manifests/cuda-13.0-toolchain.txt pins a matching CUDA 13.0 set), and toolchain.cuda = \"{want}\"")


def _parse_nvcc_version(out: str) -> str:
    m = re.search(r"release \d+\.\d+, V(\d+\.\d+\.\d+)", out)
    if not m:
        raise BadInput(f"cannot read nvcc's version from: {out[-200:]!r}", hint="the nvcc wheel is damaged")
    return m.group(1)


def host_compiler(root: Root, name: str) -> HostCompiler:
    """The C++ compiler's identity for object keys: resolved path, version, and hashes of the driver and
    of cc1plus (the driver alone does not identify the compiler)."""
    path = shutil.which(name, path="/usr/bin:/bin")
    if path is None:
        raise PreconditionFailed(f"no C++ compiler {name!r} in /usr/bin", hint="install g++ (apt-get install g++)")
    real = Path(path).resolve()
    version = _cached_output(root, real, ["-dumpfullversion"], str.strip)
    cc1plus = Path(_cached_output(root, real, ["-print-prog-name=cc1plus"], str.strip)).resolve()
    return {"path": str(real), "version": version, "sha256": _cached_hash(root, real),
            "cc1plus": str(cc1plus), "cc1plus_sha256": _cached_hash(root, cc1plus) if cc1plus.is_file() else ""}


def _cached_output(root: Root, exe: Path, args: list[str], parse: Callable[[str], str]) -> str:
    """A tool's answer, cached by the tool's stat fingerprint (running nvcc costs ~50 ms)."""
    def run() -> str:
        # like a compiler: a session of its own that dies with hermetic, and a limit (it answers in ms)
        from hermetic.procs import Limits, TimedOut, exec_failure, run_limited  # only when the answer is not cached
        root.tmp.mkdir(parents=True, exist_ok=True)
        try:
            rc, tail = run_limited([str(exe), *args], cwd=str(root.tmp), limits=Limits(), timeout=TOOL_TIMEOUT_S,
                                    env={"PATH": "/usr/bin:/bin", "HOME": str(root.home), "TMPDIR": str(root.tmp)},
                                    on_line=lambda _line: None)
        except TimedOut:
            raise PreconditionFailed(f"{exe} {' '.join(args)} did not answer within {TOOL_TIMEOUT_S:g} s",
                                     where=str(exe), hint="check the toolchain (is its file system stalled?)") \
                from None
        failure = exec_failure(rc, tail)
        if failure:
            raise PreconditionFailed(failure, where=str(exe), hint="check the toolchain")
        return parse("\n".join(tail) + "\n")
    return str(root.cache("tools").cached(f"output {args}\0{exe}", [exe], run))


def _cached_hash(root: Root, path: Path) -> str:
    return str(root.cache("tools").cached(f"sha256\0{path}", [path], lambda: fs.sha256_file(path)[0]))
