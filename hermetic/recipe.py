"""Recipes: what to realize. Validated strictly; every error names the file, line and key.

A recipe names locks (an environment of wheels), optionally a CUDA toolchain, sources, build limits, the
extensions to build from the sources and their variants. docs/recipes.md documents every key.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic.errors import BadInput
from hermetic.tomlutil import (
    KeyPath,
    TomlDoc,
    check_keys,
    cpu_list,
    expect_type,
    get_key,
    inside_repo,
    load_toml,
    repo_file,
    sandbox_mode,
    size_bytes,
    strings,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# an extension's module: a plain name, or a module inside a package (``torch_scatter._scatter_cuda``)
DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,7}\Z")
KINDS = ("cuda", "cpp")   # as torch's CUDAExtension and CppExtension
EXTENSION_KEYS = {"source", "sources", "exclude", "include_dirs", "cflags", "cuda_cflags", "ldflags", "defines",
                  "kind", "python_module"}   # what an extension and a [shared.NAME] table may say
DEFINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
ARCH_RE = re.compile(r"^\d+\.\d+[af]?(\+PTX)?\Z")
DEFAULT_ARCHS = ("9.0",)  # Hopper (H100/H200), the GPUs this project measures on; override per recipe


@dataclass(frozen=True)
class Toolchain:
    cuda: str                      # MAJOR.MINOR the toolchain must be
    archs: tuple[str, ...] = DEFAULT_ARCHS


@dataclass(frozen=True)
class Source:
    name: str
    path: Path | None = None       # a folder of the repository
    wheel: str | None = None       # "name==version" from the configured indexes, pinned by sha256
    url: str | None = None         # or an explicit URL / file of a wheel or sdist
    sha256: str | None = None
    subdir: str = ""               # the part of the archive that is the source tree
    patches: tuple[Path, ...] = ()
    where: str = ""


@dataclass(frozen=True)
class Limits:
    jobs: int
    cpus: tuple[int, ...] | None = None    # CPU affinity of the compilers
    nice: int = 0
    address_space: int | None = None       # RLIMIT_AS of every compiler process, bytes
    sandbox: str | None = None             # auto, required or off (hermetic.sandbox); None: not set here
    warnings: tuple[str, ...] = ()         # what realize says of these limits (CPUs of cpus this machine lacks)
    jobs_set: bool = False                 # jobs said, not defaulted (else the CPU count; a cluster adds its)


@dataclass(frozen=True)
class Extension:
    name: str                      # the module name (TORCH_EXTENSION_NAME)
    source: str                    # which [sources.NAME] tree
    sources: tuple[str, ...]       # glob patterns relative to the source tree
    exclude: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    defines: tuple[tuple[str, str | None], ...] = ()   # None: -DNAME (``NAME = true``)
    kind: str | None = None        # "cuda": every unit gets CUDA's includes, the link cudart (CUDAExtension);
    #                                "cpp": no CUDA; None: CUDA where a unit is a .cu file
    python_module: bool = True     # False: a torch operator library (TORCH_LIBRARY, no PyInit_), loaded with
    #                                torch.ops.load_library
    shared: str | None = None      # the [shared.NAME] table it takes its defaults from


@dataclass(frozen=True)
class Package:
    """The sdist's Python packages, installed beside the built modules (as pip lays a wheel out)."""
    source: str                    # which [sources.NAME] tree
    packages: tuple[str, ...]      # dotted names: each package's folder's .py files (and ``data``)
    package_dir: str = ""          # the folder of the tree the packages are in
    data: tuple[str, ...] = ()     # glob patterns inside each package folder: more files to install


def module_file(module: str, suffix: str) -> str:
    """Where a module's file lies in the environment: ``pkg._ext`` -> ``pkg/_ext`` + the suffix."""
    return module.replace(".", "/") + suffix


@dataclass(frozen=True)
class Variant:
    name: str
    module: str | None = None      # rename the (single) extension's module
    patches: tuple[Path, ...] = ()
    defines: tuple[tuple[str, str | None], ...] = ()   # None: -DNAME (``NAME = true``)
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    default: bool = True           # realized without --variant


@dataclass(frozen=True)
class Recipe:
    path: Path
    name: str
    locks: tuple[Path, ...]
    toolchain: Toolchain | None
    doc: TomlDoc
    python: str | None = None
    toolchain_lock: Path | None = None
    sources: dict[str, Source] = field(default_factory=dict)
    limits: Limits = field(default_factory=lambda: Limits(jobs=os.cpu_count() or 1))
    extensions: tuple[Extension, ...] = ()
    variants: tuple[Variant, ...] = ()
    remote_url: str | None = None  # [remote] url: a team's cache (hermetic.remote.settings), no credentials
    remote_mode: str | None = None
    remote_dist: str | None = None # [remote] dist: a build cluster's scheduler (extensions.dist), no token
    package: Package | None = None

    @property
    def folder(self) -> Path:
        return self.path.parent

    def inputs(self) -> list[Path]:
        """Every file the recipe reads (for the no-op's fingerprints), folder sources walked."""
        paths = [*self.locks, *(p for s in self.sources.values() for p in s.patches),
                 *(p for v in self.variants for p in v.patches)]
        for src in self.sources.values():
            if src.path is not None:
                paths.append(src.path)
                for dirpath, dirnames, files in os.walk(src.path):
                    dirnames.sort()
                    paths += [Path(dirpath) / d for d in dirnames] + [Path(dirpath) / f for f in sorted(files)]
        return paths


def load_recipe(path: Path) -> Recipe:
    doc = load_toml(path)
    data = doc.data
    check_keys(doc, data, {"recipe", "toolchain", "sources", "limits", "extensions", "variants", "remote",
                           "shared", "package"}, ())
    if "recipe" not in data:
        raise BadInput("the recipe has no [recipe] table", where=str(path),
                       hint="start the file with [recipe] and name = \"...\"")
    rec = expect_type(doc, data["recipe"], dict, ("recipe",))
    check_keys(doc, rec, {"name", "locks", "python"}, ("recipe",))
    name = expect_type(doc, rec.get("name"), str, ("recipe", "name"))
    if not NAME_RE.match(name):
        raise BadInput(f"recipe name {name!r} is not a plain name", where=doc.where("recipe", "name"),
                       hint="use letters, digits, '.', '_' and '-' (at most 64)")
    if name.endswith(".toolchain"):   # NAME.toolchain is the profile of recipe NAME's toolchain
        raise BadInput(f"recipe name {name!r} ends in '.toolchain', the name of another recipe's toolchain "
                       "profile", where=doc.where("recipe", "name"), hint="choose another name")
    python = get_key(doc, rec, "python", str, ("recipe",))
    locks = tuple(repo_file(doc, path.parent, v, ("recipe", "locks", i))
                  for i, v in enumerate(expect_type(doc, rec.get("locks", []), list, ("recipe", "locks"))))
    toolchain, toolchain_lock = _toolchain(doc, path.parent, data)
    if toolchain_lock is not None:
        locks += (toolchain_lock,)
    sources = {k: _source(doc, path.parent, k, v) for k, v in
               expect_type(doc, data.get("sources", {}), dict, ("sources",)).items()}
    limits = _limits(doc, data.get("limits", {}))
    shared = _shared(doc, data.get("shared", {}))
    exts = tuple(_extension(doc, i, e, sources, shared) for i, e in
                 enumerate(expect_type(doc, data.get("extensions", []), list, ("extensions",))))
    if exts and toolchain is None and any(_has_cuda(e) for e in exts):
        raise BadInput("the recipe builds CUDA sources but has no [toolchain]", where=doc.where("extensions"),
                       hint='add [toolchain] with cuda = "13.0" and the toolchain lock')
    variants = tuple(_variant(doc, path.parent, k, v, exts) for k, v in
                     expect_type(doc, data.get("variants", {}), dict, ("variants",)).items())
    _distinct_modules(doc, exts, variants)
    if not locks and not exts:
        raise BadInput("the recipe names no lock and builds nothing", where=doc.where("recipe"),
                       hint='add locks = ["../manifests/NAME.txt"] under [recipe], or [[extensions]]')
    remote_url, remote_mode, remote_dist = _remote(doc, data.get("remote", {}))
    built = {v.module or e.name for v in variants or (Variant("default"),) for e in exts}
    package = _package(doc, data["package"], sources, exts, built) if "package" in data else None
    return Recipe(path.resolve(), name, locks, toolchain, doc, python, toolchain_lock, sources, limits, exts,
                  variants or (Variant("default"),), remote_url, remote_mode, remote_dist, package)


def _shared(doc: TomlDoc, raw: object) -> dict[str, dict[str, Any]]:
    """[shared.NAME]: settings several extensions take (``shared = "NAME"``); an extension's own key replaces
    the shared one."""
    out = {}
    for name, table in expect_type(doc, raw, dict, ("shared",)).items():
        t = expect_type(doc, table, dict, ("shared", name))
        check_keys(doc, t, EXTENSION_KEYS, ("shared", name))
        out[name] = t
    return out


def _package(doc: TomlDoc, raw: object, sources: dict[str, Source], exts: tuple[Extension, ...],
             built: set[str]) -> Package:
    kp: KeyPath = ("package",)
    t = expect_type(doc, raw, dict, kp)
    check_keys(doc, t, {"source", "packages", "package_dir", "data"}, kp)
    source = expect_type(doc, t.get("source"), str, (*kp, "source"))
    if source not in sources:
        raise BadInput(f"package names source {source!r}, which is not defined", where=doc.where(*kp, "source"),
                       hint=f"use one of {', '.join(sorted(sources)) or '(none)'}")
    packages = tuple(strings(doc, t, "packages", kp))
    if not packages:
        raise BadInput("package.packages names no package", where=doc.where(*kp),
                       hint='packages = ["NAME", "NAME.sub"]: the dotted names setup.py\'s packages lists')
    for i, p in enumerate(packages):
        if not DOTTED_RE.match(p):
            raise BadInput(f"package {p!r} is not a dotted Python name", where=doc.where(*kp, "packages", i),
                           hint="for example torch_scatter or torch_scatter.composite")
        top = p.split(".")[0]
        if top in sys.stdlib_module_names or top == "torch":
            # the environment is on PYTHONPATH, before the standard library: pip's site-packages would not shadow
            # it, this would (in every `hermetic env` process); torch is the host's, the recipe builds against it
            raise BadInput(f"package {p} would shadow {'the standard library' if top != 'torch' else 'torch'}'s "
                           f"{top} in the environment", where=doc.where(*kp, "packages", i),
                           hint=f"leave {p} out of packages")
        # a package named as a built module (or inside one) is a folder Python's importer prefers to the built
        # file: ``import pkg._ext`` would run the sdist's Python, never the certified module
        shadowed = sorted(m for m in built if p == m or p.startswith(m + "."))
        if shadowed:
            raise BadInput(f"package {p} has the dotted name of the built module {shadowed[0]}: Python would import "
                           f"the package's folder, never the module hermetic builds",
                           where=doc.where(*kp, "packages", i),
                           hint=f"leave {p} out of packages (a prebuilt or pure-Python stand-in for the module?)")
    package_dir = get_key(doc, t, "package_dir", str, kp) or ""
    if package_dir.startswith("/"):   # checked before the strip below made it relative
        raise BadInput(f"package_dir {package_dir!r} leaves the source tree", where=doc.where(*kp, "package_dir"),
                       hint="relative to the source tree (data: to each package's folder)")
    package_dir = package_dir.strip("/")
    data = tuple(strings(doc, t, "data", kp))
    for key, values in (("package_dir", [package_dir]), ("data", list(data))):
        for j, v in enumerate(values):
            if v.startswith("/") or ".." in v.split("/"):
                raise BadInput(f"{key} {v!r} leaves the source tree",
                               where=doc.where(*kp, key, *([j] if key == "data" else [])),
                               hint="relative to the source tree (data: to each package's folder)")
    owned = {e.name.rsplit(".", 1)[0] for e in exts if "." in e.name}
    missing = sorted(owned - set(packages))
    if missing:
        raise BadInput(f"extensions live in package {missing[0]}, which package.packages does not list",
                       where=doc.where(*kp, "packages"), hint=f"add {missing[0]!r} to packages")
    return Package(source, packages, package_dir, data)


def _remote(doc: TomlDoc, raw: object) -> tuple[str | None, str | None, str | None]:
    """[remote] url, mode and dist. Credentials never go in a recipe: they come with the environment."""
    kp: KeyPath = ("remote",)
    table = expect_type(doc, raw, dict, kp)
    check_keys(doc, table, {"url", "mode", "dist"}, kp)
    url = get_key(doc, table, "url", str, kp)
    mode = get_key(doc, table, "mode", str, kp)
    dist = get_key(doc, table, "dist", str, kp)
    if dist is not None and dist != "off" and not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+/?$", dist):
        raise BadInput(f"remote.dist {dist!r} is not a scheduler URL (http://HOST:PORT, no path or credentials)",
                       where=doc.where(*kp, "dist"), hint="the token goes in HERMETIC_DIST_TOKEN, never in a recipe")
    if url is not None:
        from hermetic.urls import split_credentials
        _base, auth = split_credentials(url, doc.where(*kp, "url"))
        if auth is not None:
            raise BadInput("remote.url carries credentials; a recipe is shared, credentials are not",
                           where=doc.where(*kp, "url"), hint="put the user:password@ URL in HERMETIC_REMOTE_CACHE, "
                                                            "or a token in HERMETIC_REMOTE_CACHE_TOKEN")
    if mode is not None and mode not in ("off", "ro", "rw"):
        raise BadInput(f"remote.mode {mode!r} is not one of off, ro, rw", where=doc.where(*kp, "mode"),
                       hint="ro reads the cache; rw also writes it (trusted builders only)")
    return url, mode, dist


def _toolchain(doc: TomlDoc, folder: Path, data: dict[str, Any]) -> tuple[Toolchain | None, Path | None]:
    if "toolchain" not in data:
        return None, None
    tc = expect_type(doc, data["toolchain"], dict, ("toolchain",))
    check_keys(doc, tc, {"cuda", "lock", "archs"}, ("toolchain",))
    cuda = expect_type(doc, tc.get("cuda"), str, ("toolchain", "cuda"))
    if not re.fullmatch(r"\d+\.\d+", cuda):
        raise BadInput(f"toolchain.cuda must be MAJOR.MINOR, found {cuda!r}",
                       where=doc.where("toolchain", "cuda"), hint='for example cuda = "13.0"')
    archs = tuple(strings(doc, tc, "archs", ("toolchain",))) or DEFAULT_ARCHS
    for i, a in enumerate(archs):
        if not ARCH_RE.match(a):
            raise BadInput(f"architecture {a!r} is not of the form MAJOR.MINOR[+PTX]",
                           where=doc.where("toolchain", "archs", i), hint='for example archs = ["9.0"]')
    lock = repo_file(doc, folder, tc["lock"], ("toolchain", "lock")) if "lock" in tc else None
    return Toolchain(cuda, archs), lock


def _source(doc: TomlDoc, folder: Path, name: str, raw: object) -> Source:
    kp: KeyPath = ("sources", name)
    table = expect_type(doc, raw, dict, kp)
    check_keys(doc, table, {"path", "wheel", "url", "sha256", "subdir", "patches"}, kp)
    kinds = [k for k in ("path", "wheel", "url") if k in table]
    if len(kinds) != 1:
        raise BadInput(f"source {name!r} needs exactly one of path, wheel or url (found {kinds or 'none'})",
                       where=doc.where(*kp), hint="path = a folder of the repository; wheel = \"name==version\" "
                                                  "with sha256; or url with sha256")
    sha = get_key(doc, table, "sha256", str, kp)
    if kinds[0] != "path" and (sha is None or not re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise BadInput(f"source {name!r} must be pinned by sha256 (64 lowercase hex digits)",
                       where=doc.where(*kp, "sha256"), hint="add sha256 = \"...\" (sha256sum of the file)")
    src_path = None
    if "path" in table:
        src_path = inside_repo(doc, folder, expect_type(doc, table["path"], str, (*kp, "path")), (*kp, "path"))
        if not src_path.is_dir():
            raise BadInput(f"source folder {src_path} does not exist", where=doc.where(*kp, "path"),
                           hint="paths are relative to the recipe's folder")
    wheel = get_key(doc, table, "wheel", str, kp)
    if wheel is not None and not re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", wheel):
        raise BadInput(f"wheel {wheel!r} is not NAME==VERSION", where=doc.where(*kp, "wheel"),
                       hint='for example wheel = "exllamav3==1.6.5"')
    subdir = get_key(doc, table, "subdir", str, kp) or ""
    if subdir.startswith("/") or ".." in subdir.split("/"):
        raise BadInput(f"subdir {subdir!r} leaves the archive", where=doc.where(*kp, "subdir"),
                       hint="a relative folder inside the archive")
    patches = tuple(repo_file(doc, folder, p, (*kp, "patches", i))
                    for i, p in enumerate(strings(doc, table, "patches", kp)))
    return Source(name, src_path, wheel, get_key(doc, table, "url", str, kp), sha, subdir.strip("/"), patches,
                  doc.where(*kp))


def _limits(doc: TomlDoc, raw: object) -> Limits:
    kp: KeyPath = ("limits",)
    table = expect_type(doc, raw, dict, kp)
    check_keys(doc, table, {"jobs", "cpus", "nice", "address_space", "sandbox"}, kp)
    given = get_key(doc, table, "jobs", int, kp)
    jobs = (os.cpu_count() or 1) if given is None else given
    if not 1 <= jobs <= 1024:
        raise BadInput(f"limits.jobs must be 1-1024, found {jobs}", where=doc.where(*kp, "jobs"),
                       hint="the number of compilers running at once")
    nice = get_key(doc, table, "nice", int, kp) or 0
    if not 0 <= nice <= 19:
        raise BadInput(f"limits.nice must be 0-19, found {nice}", where=doc.where(*kp, "nice"),
                       hint="0 is normal priority, 19 the lowest")
    cpus = None
    warnings: tuple[str, ...] = ()
    if "cpus" in table:
        cpus, warnings = usable_cpus(doc, expect_type(doc, table["cpus"], str, (*kp, "cpus")), (*kp, "cpus"))
    space = None
    if "address_space" in table:
        space = size_bytes(doc, expect_type(doc, table["address_space"], str, (*kp, "address_space")),
                       (*kp, "address_space"))
    return Limits(jobs, cpus, nice, space, sandbox_mode(doc, table, kp), warnings, given is not None)


def usable_cpus(doc: TomlDoc, text: str, kp: KeyPath) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The CPUs of a ``cpus`` list (``cpu_list``: one rule for recipes and runners, docs/recipes.md) this machine
    lets this process run on, and what to warn: a list naming none of them is exit 2 (every child could only
    fail); one naming some it lacks runs on the others, and the warning names those missing."""
    cpus = cpu_list(doc, text, kp)
    have = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    usable = tuple(c for c in cpus if c in set(have))
    if not usable:
        ranges = _ranges(have)
        raise BadInput(f"cpus {text!r} names no CPU this machine lets hermetic use (it may use CPU {ranges})",
                       where=doc.where(*kp), hint=f'name CPUs among {ranges}, for example cpus = "{ranges}"')
    missing = [c for c in cpus if c not in set(have)]
    if not missing:
        return usable, ()
    return usable, (f"{doc.where(*kp)}: cpus {text!r} names CPU {_ranges(missing)}, which this machine does not let "
                    f"hermetic use (it may use CPU {_ranges(have)}): the children run on CPU {_ranges(list(usable))}",)


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2,5"``."""
    spans: list[list[int]] = []
    for c in cpus:
        if spans and spans[-1][1] == c - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def _extension(doc: TomlDoc, i: int, raw: object, sources: dict[str, Source],
               shared: dict[str, dict[str, Any]]) -> Extension:
    kp: KeyPath = ("extensions", i)
    own = expect_type(doc, raw, dict, kp)
    check_keys(doc, own, {"name", "shared", *EXTENSION_KEYS}, kp)
    name = expect_type(doc, own.get("name"), str, (*kp, "name"))
    if not DOTTED_RE.match(name):
        raise BadInput(f"extension name {name!r} is not a Python module name", where=doc.where(*kp, "name"),
                       hint="letters, digits and _, or a module inside a package (pkg._ext); its last part "
                            "becomes TORCH_EXTENSION_NAME")
    group = get_key(doc, own, "shared", str, kp)
    base: dict[str, Any] = {}
    if group is not None:
        if group not in shared:
            raise BadInput(f"extension {name} takes shared settings {group!r}, which are not defined",
                           where=doc.where(*kp, "shared"), hint=f"define [shared.{group}] or use one of "
                                                                f"{', '.join(sorted(shared)) or '(none)'}")
        base = shared[group]
    t = {**base, **own}

    def at(key: str) -> KeyPath:  # where a key was written: the extension, else its shared table
        return kp if key in own or group is None else ("shared", group)

    def listed(key: str) -> tuple[str, ...]:
        return tuple(strings(doc, t, key, at(key)))

    source = expect_type(doc, t.get("source"), str, (*at("source"), "source"))
    if source not in sources:
        raise BadInput(f"extension {name} names source {source!r}, which is not defined",
                       where=doc.where(*at("source"), "source"), hint=f"define [sources.{source}] or use one of "
                                                                      f"{', '.join(sorted(sources)) or '(none)'}")
    globs = listed("sources") or ("**/*.cpp", "**/*.cu")
    for key in ("sources", "exclude", "include_dirs"):
        for j, g in enumerate(listed(key)):
            if g.startswith("/") or ".." in g.split("/"):
                raise BadInput(f"{key} entry {g!r} leaves the source tree", where=doc.where(*at(key), key, j),
                               hint="patterns and folders are relative to the source tree")
    kind = get_key(doc, t, "kind", str, at("kind"))
    if kind is not None and kind not in KINDS:
        raise BadInput(f"extension kind {kind!r} is not one of {', '.join(KINDS)}",
                       where=doc.where(*at("kind"), "kind"),
                       hint="cuda: as CUDAExtension (CUDA's includes for every unit, cudart linked); cpp: no CUDA")
    if kind == "cpp" and any(g.endswith(".cu") for g in globs):
        raise BadInput(f"extension {name} is of kind cpp but names CUDA sources", where=doc.where(*at("kind"), "kind"),
                       hint='kind = "cuda", or leave .cu files out of sources')
    python_module = get_key(doc, t, "python_module", bool, at("python_module"))
    return Extension(name, source, globs, listed("exclude"), listed("include_dirs"), listed("cflags"),
                     listed("cuda_cflags"), listed("ldflags"), _defines(doc, t, at("defines")), kind,
                     True if python_module is None else python_module, group)


def _variant(doc: TomlDoc, folder: Path, name: str, raw: object, exts: tuple[Extension, ...]) -> Variant:
    kp: KeyPath = ("variants", name)
    t = expect_type(doc, raw, dict, kp)
    check_keys(doc, t, {"module", "patches", "defines", "cflags", "cuda_cflags", "default"}, kp)
    if not NAME_RE.match(name):
        raise BadInput(f"variant name {name!r} is not a plain name", where=doc.where(*kp),
                       hint="letters, digits, '.', '_' and '-'")
    if name == "toolchain" or name.endswith(".toolchain"):   # NAME.toolchain is a recipe's toolchain profile
        raise BadInput(f"variant name {name!r} makes the name of a recipe's toolchain profile", where=doc.where(*kp),
                       hint="choose another name")
    module = get_key(doc, t, "module", str, kp)
    if module is not None:
        if len(exts) != 1:
            raise BadInput("variants.module renames the recipe's one extension; this recipe has "
                           f"{len(exts)}", where=doc.where(*kp, "module"), hint="remove module")
        if not DOTTED_RE.match(module):
            raise BadInput(f"module {module!r} is not a Python module name", where=doc.where(*kp, "module"),
                           hint="letters, digits and _, or pkg._ext")
    patches = tuple(repo_file(doc, folder, p, (*kp, "patches", i))
                    for i, p in enumerate(strings(doc, t, "patches", kp)))
    default = get_key(doc, t, "default", bool, kp)
    return Variant(name, module, patches, _defines(doc, t, kp), tuple(strings(doc, t, "cflags", kp)),
                   tuple(strings(doc, t, "cuda_cflags", kp)), True if default is None else default)


def _distinct_modules(doc: TomlDoc, exts: tuple[Extension, ...], variants: tuple[Variant, ...]) -> None:
    seen: dict[str, str] = {}
    # variants realized together (the default ones) must build distinct modules; others realize alone
    for v in [v for v in variants if v.default] or [Variant("default")]:
        for e in exts:
            mod = v.module or e.name
            if mod in seen:
                raise BadInput(f"variants {seen[mod]} and {v.name} both build module {mod}",
                               where=doc.where("variants", v.name),
                               hint="give each variant its own module name so both import side by side")
            seen[mod] = v.name


def _defines(doc: TomlDoc, t: dict[str, Any], kp: KeyPath) -> tuple[tuple[str, str | None], ...]:
    """``NAME = "VALUE"`` (-DNAME=VALUE), or ``NAME = true`` (-DNAME, as setuptools writes a None value)."""
    table = expect_type(doc, t.get("defines", {}), dict, (*kp, "defines"))
    out: list[tuple[str, str | None]] = []
    for k, v in table.items():
        if not DEFINE_RE.match(k):
            raise BadInput(f"define {k!r} is not an identifier", where=doc.where(*kp, "defines", k),
                           hint="a C identifier")
        if v is True:
            out.append((k, None))
            continue
        if isinstance(v, bool):
            raise BadInput(f"define {k} = false defines nothing", where=doc.where(*kp, "defines", k),
                           hint="leave it out, or write true (-DNAME) or a string (-DNAME=VALUE)")
        out.append((k, str(expect_type(doc, v, str, (*kp, "defines", k)))))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def _has_cuda(e: Extension) -> bool:
    return e.kind == "cuda" or (e.kind is None and any(g.endswith((".cu", "*")) for g in e.sources))
