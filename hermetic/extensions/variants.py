"""Steps 5-6 of realize for a recipe that builds, once its toolchain is prepared (``extensions.toolchain``) and its
``BuildContext`` made: the source trees of every chosen variant (``prepare_sources``), then every extension of
every variant (``build_variants``), under the recipe's build lock. Each variant reads its sources through a
folder of its own; the prefix map gives them one name, so variants (and other roots) compare and share objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hermetic import fs
from hermetic.errors import BadInput
from hermetic.extensions.context import BuildContext
from hermetic.extensions.extension import (
    LinkStep,
    finish_module,
    known_digests,
    place_reused,
    plan_link,
    plan_module,
    remember_build,
)
from hermetic.extensions.graph import Graph, group_and_predict, plan_units
from hermetic.extensions.job import BuiltModule, ModuleJob
from hermetic.extensions.objects import Decision, ObjectChoice
from hermetic.extensions.plan import glob_re, select_sources
from hermetic.extensions.sources import SourceTree, link_variant_source, plan_sources, realize_source
from hermetic.extensions.toolchain import point_toolchain_profile
from hermetic.recipe import Package, Recipe, Variant
from hermetic.reporter import Reporter, plural
from hermetic.store import blob_ref, entry_ref
from hermetic.store.records import FileMap


@dataclass
class RecipeBuild:
    modules: list[BuiltModule]
    refs: list[str]
    report: dict[str, Any]
    changed: bool = False
    explained: list[str] = field(default_factory=list)
    package_files: FileMap = field(default_factory=dict)   # [package]: the sdist's files, placed as pip would
    package_imports: list[str] = field(default_factory=list)   # its top-level packages, imported by the check

    @property
    def decisions(self) -> dict[str, int]:
        """How many objects of every module ended in each decision (``Decision``'s names): realize's counts."""
        out: dict[str, int] = {}
        for m in self.modules:
            for d in m.choices:
                out[d.decision] = out.get(d.decision, 0) + 1
        return out

    @property
    def linked(self) -> int:
        """How many modules were linked now (not found by their link key)."""
        return sum(1 for m in self.modules if m.linked)


class PlannedObject(NamedTuple):
    """What a plan says of one object: its source, the decision (``Decision``'s name) and why; ``predicted``
    where it waits for another variant's compile, as the build graph predicts it."""
    source: str
    decision: str
    reason: str
    predicted: bool = False

    def record(self) -> dict[str, object]:
        out: dict[str, object] = {"source": self.source, "decision": self.decision, "reason": self.reason}
        if self.predicted:
            out["predicted"] = True
        return out


class ModuleStep(NamedTuple):
    """What a plan says of one module of one variant: its objects (None while its source's archive is not in
    the store: not known) and its link."""
    variant: str
    module: str
    objects: list[PlannedObject] | None
    link: LinkStep

    def decisions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.objects or ():
            out[o.decision] = out.get(o.decision, 0) + 1
        return out


NO_TOOLCHAIN = "the toolchain's tree is not in the store yet"


def plan_modules(ctx: BuildContext | None, recipe: Recipe, variants: list[Variant],
                 trees: Mapping[tuple[str, str], tuple[Path | None, list[str] | None]]) -> list[ModuleStep]:
    """Every module of every variant as a realize would decide it now: each object by ``plan_module`` (the
    proof ``find`` makes: through a read-only store, nothing pinned), a compile that shares its lookup key with
    one planned before it (another variant's copy) as the build graph predicts it, each link by ``plan_link``.
    ``trees``: (variant, source) -> (the folder its files are read from, its files; None, None while its
    archive is not in the store). Without ``ctx`` (the toolchain's tree is not in the store, and it is part of
    every object's key) every object is compiled."""
    out: list[ModuleStep] = []
    jobs: list[tuple[int, ModuleJob]] = []
    for variant in variants:
        for ext in recipe.extensions:
            src_root, files = trees[(variant.name, ext.source)]
            module = variant.module or ext.name
            if files is None:
                out.append(ModuleStep(variant.name, module, None, LinkStep(None, None, "link")))
            elif ctx is None or src_root is None:
                out.append(ModuleStep(variant.name, module,
                                      [PlannedObject(rel, str(Decision.COMPILED), NO_TOOLCHAIN)
                                       for rel in select_sources(files, ext.sources, ext.exclude)],
                                      LinkStep(None, None, "link")))
            else:
                jobs.append((len(out), plan_module(ctx, ext, variant, ctx.site(ext, variant, src_root, files))))
                out.append(ModuleStep(variant.name, module, [], LinkStep(None, None, "link")))
    if ctx is None or not jobs:
        return out
    units = plan_units([job for _i, job in jobs])
    group_and_predict(ctx.root, units)
    waits = {(id(u.job), u.index): u for u in units if u.waits}
    for i, job in jobs:
        objects = []
        for k, d in enumerate(job.choices):
            u = waits.get((id(job), k))
            if u is None or u.leader is None:
                objects.append(PlannedObject(d.compile.rel, str(d.decision), d.reason))
            else:
                objects.append(PlannedObject(d.compile.rel, str(Decision.REUSED_VARIANT),
                                             f"predicted: the object of {u.leader.job.plan.module}: "
                                             f"{u.leader.compile.rel}, compiled first in this realize", True))
        out[i] = out[i]._replace(objects=objects, link=plan_link(ctx, job, known_digests(job)))
    return out


def check_builds(recipe: Recipe, variants: list[Variant]) -> None:
    """What a recipe that builds must say, checked before any work (a realize and its plan alike)."""
    if recipe.toolchain is None or recipe.toolchain_lock is None:
        raise BadInput("a recipe that builds extensions needs [toolchain] with cuda and lock",
                       where=str(recipe.path), hint='add [toolchain] cuda = "13.0", lock = "..."')
    if len({e.source for e in recipe.extensions}) > 1:
        for variant in variants:
            if variant.patches:
                raise BadInput(f"variant {variant.name} has patches but the recipe builds from several sources",
                               where=str(recipe.path), hint="give patches to [sources.NAME].patches instead")


def prepare_sources(ctx: BuildContext, variants: list[Variant], *, offline: bool = False
                    ) -> dict[str, dict[str, SourceTree]]:
    """variant -> source name -> its tree, with the source's and the variant's patches applied: the plan
    (``plan_sources``) executed."""
    ctx.reporter.event("phase", phase="sources")
    out: dict[str, dict[str, SourceTree]] = {}
    for step in plan_sources(ctx.store, ctx.recipe, variants):
        out.setdefault(step.variant, {})[step.source.name] = realize_source(
            ctx.root, ctx.store, step.source, step.patches, ctx.reporter, ctx.share, offline=offline,
            origin=step.origin)
    return out


def build_variants(ctx: BuildContext, variants: list[Variant], sources: dict[str, dict[str, SourceTree]], *,
                   explain: bool, on_compiles: Callable[[], None] | None = None,
                   confirm: Callable[[], object] | None = None) -> RecipeBuild:
    """Every extension of every variant: certified reuse, one build graph for all their compiles
    (extensions/graph.py), links and certificates. ``on_compiles`` is called once, before the graph's work,
    where anything is to compile; ``confirm`` before anything is recorded (the host's facts may be a guess
    still being probed: extensions.host)."""
    root, store, recipe, reporter, tc = ctx.root, ctx.store, ctx.recipe, ctx.reporter, ctx.toolchain
    assert recipe.toolchain is not None
    refs = [entry_ref(tc.id["cuda"])]
    modules: list[BuiltModule] = []
    sources_report: dict[str, Any] = {}
    jobs: list[ModuleJob] = []
    fs.refuse_linked_folders(root.path / "build", root.path / "build" / recipe.name)
    with fs.FileLock(root.build_lock(recipe.name), what=f"the build of {recipe.name}"):
        point_toolchain_profile(root, store, recipe, tc.id["cuda"])   # a `gc --drop-root` before this lock
        for variant in variants:
            trees = {}
            for src_name, tree in sources[variant.name].items():
                trees[src_name] = (link_variant_source(root, recipe.name, variant.name, src_name, store, tree),
                                   tree)
                refs.append(entry_ref(tree.entry))
                sources_report[f"{variant.name}/{src_name}"] = {"tree": tree.entry, "files": len(tree.files)}
            for ext in recipe.extensions:
                src_root, tree = trees[ext.source]
                started = time.monotonic()
                job = plan_module(ctx, ext, variant, ctx.site(ext, variant, src_root, sorted(tree.files)))
                job.timings["plan"] = round(time.monotonic() - started, 4)
                place_reused(ctx, job)
                jobs.append(job)
        ctx.hasher.save()
        schedule = Graph(root, recipe, jobs, reporter, on_compiles, confirm, ctx.dist).run()
        if confirm is not None:
            confirm()
        for job, built in zip(jobs, _finish(ctx, jobs), strict=True):
            remember_build(ctx, job, built)
            modules.append(built)
            refs += [entry_ref(built.entry), blob_ref(built.certificate_blob)]
    per_variant: dict[str, Any] = schedule.setdefault("variants", {})
    for job in jobs:  # the receipt's per-variant phases: plan (reuse decided), compile (from the graph), link
        v = per_variant.setdefault(job.variant.name, {"compiled": 0, "first_start_s": None, "last_end_s": None})
        v["plan_s"] = round(v.get("plan_s", 0.0) + job.timings.get("plan", 0.0), 4)
        v["link_s"] = round(v.get("link_s", 0.0) + job.timings.get("link", 0.0), 4)
    explained = [(m.module, explain_line(m.module, d)) for m in modules for d in m.choices]
    for module, line in explained:
        if explain:  # asked for: data, on stdout
            reporter.data("explain", line)
        else:        # -v: a line per object on stderr
            reporter.detail("object", line, module=module)
    _say_schedule(reporter, schedule)
    info = tc.info
    report = {
        "host": ctx.host.to_json(),
        "toolchain": {"entry": tc.id["cuda"], "nvcc": info.nvcc_version, "cudart": info.cudart_version,
                      "cuda_home": str(info.cuda_home), "archs": list(recipe.toolchain.archs),
                      "host_compilers": tc.compilers},
        "sources": sources_report,
        "modules": [{"module": m.module, "variant": j.variant.name, "file": m.filename, "sha256": m.digest,
                     "entry": m.entry, "certificate_sha256": m.certificate, "certificate_blob": m.certificate_blob,
                     "counts": m.counts(), "linked": m.linked, "timings": j.timings}
                    for m, j in zip(modules, jobs, strict=True)],
        "schedule": schedule,
    }
    changed = tc.built or any(m.linked or m.counts().get("compiled", 0) for m in modules)
    package: FileMap = {}
    if recipe.package is not None:
        package = package_files(recipe.package, sources[variants[0].name][recipe.package.source].files,
                                {m.filename for m in modules})
        report["package"] = {"source": recipe.package.source, "packages": list(recipe.package.packages),
                             "files": {p: d for p, (d, _x) in sorted(package.items())}}
    return RecipeBuild(modules, refs, report, changed, [line for _m, line in explained], package,
                       sorted({p.split(".")[0] for p in recipe.package.packages}) if recipe.package else [])


def package_files(package: Package, tree: FileMap, modules: set[str]) -> FileMap:
    """The files of a [package] as pip installs them from the sdist: each listed package's folder's .py files
    and ``data`` patterns (not its subfolders: those are packages of their own), at the package's dotted path;
    the built modules are placed beside them by their dotted names (recipe.module_file)."""
    base = f"{package.package_dir}/" if package.package_dir else ""
    out: FileMap = {}
    for name in package.packages:
        folder = base + name.replace(".", "/") + "/"
        data = [glob_re(folder + g) for g in package.data]
        mine = {rel: v for rel, v in tree.items() if rel.startswith(folder) and "/" not in rel[len(folder):]
                and (rel.endswith(".py") or any(r.fullmatch(rel) for r in data))}
        if not any(rel.endswith("/__init__.py") for rel in mine):
            raise BadInput(f"package {name} has no {folder}__init__.py in source {package.source}",
                           hint="package.packages names folders of the source tree (package_dir: the folder "
                                "they are in; the sdist's top folder is stripped)")
        for rel, v in mine.items():
            out[rel[len(base):]] = v
    clash = sorted(set(out) & modules)
    if clash:
        raise BadInput(f"the package's file {clash[0]} is also a built module",
                       hint="leave the built file out of the package (a prebuilt copy in the sdist?)")
    return out


def _finish(ctx: BuildContext, jobs: list[ModuleJob]) -> list[BuiltModule]:
    """Every module linked and certified, side by side (each link is a compiler process of its own; the store
    takes entries from several threads), except with a remote cache, whose client is used from one thread.
    The first failure is raised once every link has ended."""
    if len(jobs) == 1 or ctx.share is not None:
        return [finish_module(ctx, job) for job in jobs]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(len(jobs), ctx.recipe.limits.jobs), thread_name_prefix="link") as pool:
        futures = [pool.submit(finish_module, ctx, job) for job in jobs]
    return [f.result() for f in futures]


def explain_line(module: str, d: ObjectChoice) -> str:
    """What --explain says of one object: the decision, why, what was waived, what it waited for."""
    return (f"{module}: {d.compile.rel}: {d.decision}" + (f" ({d.reason})" if d.reason else "")
            + (f" [waived {', '.join(d.waived)}]" if d.waived else "")
            + (f" [waited for {d.waited_for}]" if d.waited_for else "")
            + (f" [bound to this root by {d.compile.path_bound}: it keeps the root's path in the object, so "
               "its key holds the root and only this root shares it]" if d.compile.path_bound else ""))


def _say_schedule(reporter: Reporter, s: dict[str, Any]) -> None:
    if not s.get("compiles"):
        return
    crit = s["critical_path"]
    busy = f", jobs {s['busy']:.0%} busy" if s.get("busy") is not None else ""
    busy += f" (CPU {s['cpu_busy']:.0%})" if s.get("cpu_busy") is not None else ""
    reporter.event("build", f"compiled {plural(s['compiles'], 'objects')} in {s['compile_span_s']:.1f} s on "
                            f"{plural(s['jobs'], 'jobs')}{busy}; longest: {crit['unit']} {crit['seconds']:.1f} s"
                   + (f"; {s['waited']} waited for another variant's object" if s.get("waited") else "")
                   + (f", {s['mispredicted']} of them compiled after all" if s.get("mispredicted") else ""),
                   schedule=s)
