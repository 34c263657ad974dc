"""Recipes: what to realize. Validated strictly; every error names the file, line and key.

A recipe names locks (an environment of wheels), optionally a CUDA toolchain, sources, build limits, the
extensions to build from the sources and their variants. docs/recipes.md documents every key.
"""

from __future__ import annotations

import os
import re
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

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
DEFINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARCH_RE = re.compile(r"^\d+\.\d+[af]?(\+PTX)?$")
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
    defines: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Variant:
    name: str
    module: str | None = None      # rename the (single) extension's module
    patches: tuple[Path, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
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
    check_keys(doc, data, {"recipe", "toolchain", "sources", "limits", "extensions", "variants", "remote"}, ())
    if "recipe" not in data:
        raise BadInput("the recipe has no [recipe] table", where=str(path),
                       hint="start the file with [recipe] and name = \"...\"")
    rec = expect_type(doc, data["recipe"], dict, ("recipe",))
    check_keys(doc, rec, {"name", "locks", "python"}, ("recipe",))
    name = expect_type(doc, rec.get("name"), str, ("recipe", "name"))
    if not NAME_RE.match(name):
        raise BadInput(f"recipe name {name!r} is not a plain name", where=doc.where("recipe", "name"),
                       hint="use letters, digits, '.', '_' and '-' (at most 64)")
    python = get_key(doc, rec, "python", str, ("recipe",))
    locks = tuple(repo_file(doc, path.parent, v, ("recipe", "locks", i))
                  for i, v in enumerate(expect_type(doc, rec.get("locks", []), list, ("recipe", "locks"))))
    toolchain, toolchain_lock = _toolchain(doc, path.parent, data)
    if toolchain_lock is not None:
        locks += (toolchain_lock,)
    sources = {k: _source(doc, path.parent, k, v) for k, v in
               expect_type(doc, data.get("sources", {}), dict, ("sources",)).items()}
    limits = _limits(doc, data.get("limits", {}))
    exts = tuple(_extension(doc, i, e, sources) for i, e in
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
    return Recipe(path.resolve(), name, locks, toolchain, doc, python, toolchain_lock, sources, limits, exts,
                  variants or (Variant("default"),), remote_url, remote_mode, remote_dist)


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


def _extension(doc: TomlDoc, i: int, raw: object, sources: dict[str, Source]) -> Extension:
    kp: KeyPath = ("extensions", i)
    t = expect_type(doc, raw, dict, kp)
    check_keys(doc, t, {"name", "source", "sources", "exclude", "include_dirs", "cflags", "cuda_cflags",
                        "ldflags", "defines"}, kp)
    name = expect_type(doc, t.get("name"), str, (*kp, "name"))
    if not MODULE_RE.match(name):
        raise BadInput(f"extension name {name!r} is not a Python module name", where=doc.where(*kp, "name"),
                       hint="letters, digits and _; it becomes TORCH_EXTENSION_NAME")
    source = expect_type(doc, t.get("source"), str, (*kp, "source"))
    if source not in sources:
        raise BadInput(f"extension {name} names source {source!r}, which is not defined",
                       where=doc.where(*kp, "source"), hint=f"define [sources.{source}] or use one of "
                                                            f"{', '.join(sorted(sources)) or '(none)'}")
    globs = tuple(strings(doc, t, "sources", kp)) or ("**/*.cpp", "**/*.cu")
    for key in ("sources", "exclude", "include_dirs"):
        for j, g in enumerate(strings(doc, t, key, kp)):
            if g.startswith("/") or ".." in g.split("/"):
                raise BadInput(f"{key} entry {g!r} leaves the source tree", where=doc.where(*kp, key, j),
                               hint="patterns and folders are relative to the source tree")
    return Extension(name, source, globs, tuple(strings(doc, t, "exclude", kp)),
                     tuple(strings(doc, t, "include_dirs", kp)), tuple(strings(doc, t, "cflags", kp)),
                     tuple(strings(doc, t, "cuda_cflags", kp)), tuple(strings(doc, t, "ldflags", kp)),
                     _defines(doc, t, kp))


def _variant(doc: TomlDoc, folder: Path, name: str, raw: object, exts: tuple[Extension, ...]) -> Variant:
    kp: KeyPath = ("variants", name)
    t = expect_type(doc, raw, dict, kp)
    check_keys(doc, t, {"module", "patches", "defines", "cflags", "cuda_cflags", "default"}, kp)
    if not NAME_RE.match(name):
        raise BadInput(f"variant name {name!r} is not a plain name", where=doc.where(*kp),
                       hint="letters, digits, '.', '_' and '-'")
    module = get_key(doc, t, "module", str, kp)
    if module is not None:
        if len(exts) != 1:
            raise BadInput("variants.module renames the recipe's one extension; this recipe has "
                           f"{len(exts)}", where=doc.where(*kp, "module"), hint="remove module")
        if not MODULE_RE.match(module):
            raise BadInput(f"module {module!r} is not a Python module name", where=doc.where(*kp, "module"),
                           hint="letters, digits and _")
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


def _defines(doc: TomlDoc, t: dict[str, Any], kp: KeyPath) -> tuple[tuple[str, str], ...]:
    table = expect_type(doc, t.get("defines", {}), dict, (*kp, "defines"))
    out = []
    for k, v in table.items():
        if not DEFINE_RE.match(k):
            raise BadInput(f"define {k!r} is not an identifier", where=doc.where(*kp, "defines", k),
                           hint="a C identifier")
        out.append((k, str(expect_type(doc, v, str, (*kp, "defines", k)))))
    return tuple(sorted(out))


def _has_cuda(e: Extension) -> bool:
    return any(g.endswith((".cu", "*")) for g in e.sources)
