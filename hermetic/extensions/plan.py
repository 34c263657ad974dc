"""Compile and link commands, exactly as torch.utils.cpp_extension would write them.

Pure functions of the host's facts (hermetic.extensions.host reads torch's own flag helpers), the toolchain and
the extension: tests compare them with the build.ninja torch itself writes. Differences, all deliberate:
objects are named after their path in the source tree (torch uses the basename, so two sources with one
name collide), compilers get ``-MD`` (every header, system ones included) instead of ``-MMD``, every compiler
gets the build's prefix map as ``-ffile-prefix-map`` (``keys.PrefixMap``: what lands in an object names no
folder of this machine), and nvcc gets ``-Xcudafe --orig_src_path_name=SOURCE`` (see module_id_flags).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hermetic.extensions.host import HostFacts
from hermetic.keys import PrefixMap, unmappable
from hermetic.recipe import Extension, Variant

CUDA_SUFFIXES = (".cu", ".cuh")
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu")


@dataclass(frozen=True)
class Compile:
    source: str               # absolute path, through the variant's source link
    rel: str                  # the source's path in its tree
    object: str               # absolute path in the build folder
    cuda: bool
    argv: tuple[str, ...]     # the command, without the dependency-file flags and the prefix map
    depfile: str
    map_flags: tuple[str, ...] = ()   # what the prefix map makes of this compile (``map_flags``): not in keys
    path_bound: str | None = None     # a flag whose output keeps this machine's paths (nvcc -G): no map covers it

    def command(self) -> list[str]:
        """What runs: the compiler with -MD -MF DEPFILE inserted as torch's rules do, and the prefix map."""
        return [self.argv[0], "-MD", "-MF", self.depfile, *self.map_flags, *self.argv[1:]]


@dataclass(frozen=True)
class CudaTarget:
    """The CUDA a module is compiled for: the toolchain's home, the recipe's architectures, and whether its nvcc
    keeps its intermediate files beside the object (``map_flags``)."""
    home: Path
    archs: tuple[str, ...]
    objdir_temps: bool = False


@dataclass(frozen=True)
class ModuleSite:
    """Where one module of one variant is built: its source tree's folder (through the variant's link) and
    files, its build folder, and the prefix map that gives those folders their fixed names."""
    src_root: Path
    files: list[str]
    build_dir: Path
    pmap: PrefixMap


@dataclass(frozen=True)
class BuildPlan:
    module: str
    compiles: tuple[Compile, ...]
    link_argv: tuple[str, ...]     # objects in source order, then ldflags, -o output
    output: str
    with_cuda: bool


def select_sources(files: list[str], patterns: tuple[str, ...], exclude: tuple[str, ...]) -> list[str]:
    """Source files of the tree matching the globs (``**`` spans folders) minus the excludes, sorted."""
    inc = [glob_re(p) for p in patterns]
    exc = [glob_re(p) for p in exclude]
    return sorted(f for f in files if f.endswith(SOURCE_SUFFIXES)
                  and any(r.fullmatch(f) for r in inc) and not any(r.fullmatch(f) for r in exc))


def glob_re(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += r"(?:[^/]+/)*"
            i += 3
        elif pattern.startswith("**", i):
            out += r".*"
            i += 2
        elif pattern[i] == "*":
            out += r"[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += r"[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def arch_flags(archs: tuple[str, ...], extra_cuda_cflags: list[str]) -> list[str]:
    """torch's _get_cuda_arch_flags for an explicit TORCH_CUDA_ARCH_LIST: sorted, de-duplicated."""
    if any("arch" in f for f in extra_cuda_cflags if "TORCH_EXTENSION_NAME" not in f):
        return []  # torch leaves the architectures to the user's own flags
    flags = set()
    for arch in archs:
        version = arch.split("+")[0]
        major, minor = version.split(".")
        num = f"{major}{minor}"
        flags.add(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.add(f"-gencode=arch=compute_{num},code=compute_{num}")
    return sorted(flags)


def module_id_flags(source: str) -> list[str]:
    """nvcc's cudafe++ names a unit's module (its internal-linkage symbols, _INTERNAL_<hash>_..., and the
    fatbin's module id) after a hash of the source's *resolved* path: a store tree's, which changes with any
    change of the tree and differs between roots and variants. Given the source's canonical name (``/hermetic/
    src/<source>/<path>``), the object is a function of the command and the inputs the key covers, wherever
    the root is. (-Xcudafe splits its value at commas: a path holding one, or a space or quote, keeps nvcc's
    choice.)"""
    return [] if any(c in source for c in ", \t'\"") else ["-Xcudafe", f"--orig_src_path_name={source}"]


def prefix_map(root: Path, source: str, src_root: Path, build_dir: Path, cuda_home: Path | None,
               host: HostFacts) -> PrefixMap:
    """The fixed names of one build's folders: every variant's source and build folders get the same names,
    so variants compare (and share) objects, and so do roots at other paths; torch's and Python's headers get
    theirs, so the same torch installed elsewhere shares too (another torch never does: its identity is in
    the key)."""
    pairs = [(str(root), "/hermetic/root"), (str(src_root), f"/hermetic/src/{source}"),
             (str(build_dir), f"/hermetic/build/{build_dir.name}"), (host.python_include, "/hermetic/python")]
    if cuda_home is not None:
        pairs.append((str(cuda_home), "/hermetic/cuda"))
    if host.torch is not None:
        pairs.append((str(Path(host.torch.dir).parent), "/hermetic/site"))
    return PrefixMap(pairs)


def map_flags(pmap: PrefixMap, cuda: bool, canonical_source: str, objdir_temps: bool = False) -> list[str]:
    """The flags a prefix map adds to a compile: -ffile-prefix-map for every folder, and nvcc's module id named
    after the source's fixed name; with ``objdir_temps`` (an nvcc that has it), nvcc's intermediate files beside
    the object, named after it (``x.cuda.o.cudafe1.cpp``, not ``tmpxft_<pid>_<counter>-6_x.cudafe1.cpp``): the
    object is then the same bytes at every compile, on every machine. They follow from the map, the (canonical)
    command and the toolchain, so keys leave them out and ``verify --rebuild-sample`` derives them again from a
    build's map and the object's record."""
    return [*pmap.compiler_flags(cuda), *(module_id_flags(canonical_source) if cuda else []),
            *(["--objdir-as-tempdir"] if cuda and objdir_temps else [])]


CXX = "c++"   # the host's C++ compiler, as torch's JIT build names it (from /usr/bin: build_env's PATH)


def plan_extension(ext: Extension, variant: Variant, host: HostFacts, cuda: CudaTarget | None,
                   site: ModuleSite) -> BuildPlan:
    """The commands torch's JIT build would run for this extension and variant (``cuda.objdir_temps``: see
    ``map_flags``)."""
    torch = host.require_torch(host.executable)
    module = variant.module or ext.name
    src_root, build_dir, pmap = site.src_root, site.build_dir, site.pmap
    cuda_home, archs = (cuda.home, cuda.archs) if cuda is not None else (None, ())
    objdir_temps = cuda is not None and cuda.objdir_temps
    cxx = CXX
    rels = select_sources(site.files, ext.sources, ext.exclude)
    if not rels:
        from hermetic.errors import BadInput
        raise BadInput(f"extension {ext.name} matches no source file", hint=f"check sources = {list(ext.sources)}")
    if ext.kind == "cpp" and any(r.endswith(CUDA_SUFFIXES) for r in rels):
        from hermetic.errors import BadInput
        raise BadInput(f"extension {ext.name} is of kind cpp but its sources match CUDA files "
                       f"({next(r for r in rels if r.endswith(CUDA_SUFFIXES))})",
                       hint="exclude them, or kind = \"cuda\"")
    # CUDAExtension's rule (kind = "cuda"): CUDA's includes for every unit, C++ ones too, and cudart linked
    with_cuda = ext.kind == "cuda" or (ext.kind is None and any(r.endswith(CUDA_SUFFIXES) for r in rels))
    defines = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (*ext.defines, *variant.defines)]
    extra_cflags = [*ext.cflags, *variant.cflags, *defines]
    extra_cuda_cflags = [*ext.cuda_cflags, *variant.cuda_cflags, *defines]

    user_includes = [str(src_root / d) if d not in ("", ".") else str(src_root) for d in ext.include_dirs]
    system_includes = list(torch.include)
    if with_cuda:
        assert cuda_home is not None
        system_includes.append(str(cuda_home / "include"))
        if torch.nvidia_include:
            # cusparse.h, cublas_v2.h...: torch's headers include them; they come from the host's own nvidia
            # wheels (the libraries torch runs with), in the place torch gives CUDA_INC_PATH
            system_includes.append(torch.nvidia_include)
    system_includes.append(host.python_include)

    common = [f"-DTORCH_EXTENSION_NAME={module.rsplit('.', 1)[-1]}", "-DTORCH_API_INCLUDE_EXTENSION_H",
              *torch.common_extra, *(f"-I{i}" for i in user_includes)]
    for inc in system_includes:
        common += ["-isystem", inc]
    std = f"-std={torch.std}"
    cflags = [*common, "-fPIC", std, *extra_cflags]
    cuda_flags = [*common, *torch.common_nvcc_flags, *arch_flags(archs, extra_cuda_cflags),
                  "--compiler-options", "-fPIC", *extra_cuda_cflags]
    if not any(f.startswith("-std=") for f in cuda_flags):
        cuda_flags.append(std)

    compiles = []
    for rel in rels:
        on_gpu = rel.endswith(CUDA_SUFFIXES)
        obj = str(build_dir / "obj" / (str(PurePosixPath(rel).with_suffix("")) + (".cuda.o" if on_gpu else ".o")))
        src = str(src_root / rel)
        compiler = [str(cuda_home / "bin" / "nvcc")] if on_gpu and cuda_home else [cxx]
        argv = (*compiler, *(cuda_flags if on_gpu else cflags), "-c", src, "-o", obj)
        compiles.append(Compile(src, rel, obj, on_gpu, argv, obj + ".d",
                                tuple(map_flags(pmap, on_gpu, pmap.canonical_path(src), objdir_temps)),
                                unmappable(argv, on_gpu)))

    ldflags = ["-shared", *ext.ldflags, f"-L{torch.lib}", "-lc10"]
    if with_cuda:
        ldflags.append("-lc10_cuda")
    ldflags.append("-ltorch_cpu")
    if with_cuda:
        ldflags.append("-ltorch_cuda")
    ldflags += ["-ltorch", "-ltorch_python"]
    if with_cuda:
        assert cuda_home is not None
        ldflags += [f"-L{cuda_home / 'lib64'}", "-lcudart"]
    output = str(build_dir / f"{module}{host.ext_suffix}")
    link = (cxx, *(c.object for c in compiles), *ldflags, "-o", output)
    return BuildPlan(module, tuple(compiles), link, output, with_cuda)
