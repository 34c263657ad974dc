"""A realize's plan: every decision it would make now, by the functions it makes them with, asked through a
read-only view of the root and the store (as uv's planner makes a plan its installer executes). What the steps
decide, they decide here and in the realize alike:

    0. no-op      the no-op record (``realize.noop``): up to date, and nothing would be done at all
    1-2           the recipe, its interpreter and its locks (``pipeline.read_recipe``, ``pipeline.qualify``)
    3. fetch      each locked wheel (``wheels.unpacked.plan_wheels``): reuse, unpack, or fetch with its size
                  (``locate``: the lock's, else the index's, else the server's Content-Length; offline, the
                  lock's)
    4. toolchain  its tree (``extensions.toolchain.plan_toolchain``): in the store, or assembled
    5. sources    each variant's source tree (``extensions.sources.plan_sources``): in the store, prepared (a copy
                  made and patched outside the root, so that its files can be hashed: ``preview_source``), or
                  its archive fetched first
    6. build      each object (``extensions.extension.plan_module``: the proof ``find`` makes) and link
                  (``plan_link``); a compile that shares its key with one planned before it as the build graph
                  predicts it (``extensions.variants.plan_modules``)

What it cannot know, it says (``notes``): without the toolchain's tree in the store every object is compiled
(the tree is part of every key); the remote cache is not asked (a realize with one may fetch objects this plan
compiles). The root is seen read-only (``Root.read_only``): caches are read and never written, nothing is pinned,
and the children it may start (the interpreter's probe, torch's qualification, a patch) get homes and temp
folders outside the root. Room for issue 38 (``realize --check``): ``locate=False`` asks no index, and
``Plan.needs_work`` says whether a realize would change anything.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hermetic.config import load as load_config
from hermetic.interpreter import WHERE
from hermetic.realize.noop import Counts, ObjectCounts, noop_check
from hermetic.realize.pipeline import RealizeOptions, check_owner, check_settings, qualify, read_recipe
from hermetic.recipe import Recipe, Variant
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store
from hermetic.store.trees import merge_files
from hermetic.wheels.unpacked import Accepts, WheelStep, locate, plan_fetcher, plan_wheels, wheel_label

if TYPE_CHECKING:
    from hermetic.extensions.toolchain import ToolchainStep
    from hermetic.extensions.variants import ModuleStep

PLAN_VERSION = 2   # 2: the counts say "objects" (1: "objects_objects"), source archives' bytes not in them


class SourcePlan(NamedTuple):
    """One source of one variant as a plan sees it: its step, its files where they can be known, and for one
    whose archive is fetched first where it comes from."""
    variant: str
    source: str
    entry: str
    action: str
    patches: int
    files: int | None
    label: str
    where: str
    bytes: int | None = None
    url: str | None = None
    problem: str | None = None

    def record(self) -> dict[str, Any]:
        out = {"variant": self.variant, "source": self.source, "entry": self.entry, "label": self.label,
               "where": self.where, "patches": self.patches, "bytes": self.bytes, "action": self.action,
               "files": self.files, "url": self.url}
        if self.problem is not None:
            out["problem"] = self.problem
        return out


class Plan(NamedTuple):
    recipe: str                         # the realized name (recipe, or recipe.variant)
    profile: Path
    up_to_date: bool
    tree: str | None
    counts: Counts
    wheels: list[WheelStep]
    toolchain: ToolchainStep | None
    sources: list[SourcePlan]
    modules: list[ModuleStep]
    notes: list[str]

    def missing(self) -> list[tuple[str, str]]:
        """(label, where) of every file a realize would fetch: wheels and source archives."""
        return [(w.label, w.wheel.where) for w in self.wheels if w.action == "fetch"] + \
            [(s.label, s.where) for s in self.sources if s.action == "fetch"]

    def fetch_bytes_unknown(self) -> int:
        return sum(1 for w in self.wheels if w.action == "fetch" and w.bytes is None) + \
            sum(1 for s in self.sources if s.action == "fetch" and s.bytes is None)

    def needs_work(self) -> bool:
        """Whether a realize would fetch, unpack, prepare, compile, link or lay out anything."""
        return not self.up_to_date

    def record(self) -> dict[str, Any]:
        """The plan as JSON (the dry run's result record holds it)."""
        tc = self.toolchain
        return {"version": PLAN_VERSION, "recipe": self.recipe, "up_to_date": self.up_to_date,
                "profile": str(self.profile), "tree": self.tree, "counts": self.counts.to_json(),
                "fetch_bytes_unknown": self.fetch_bytes_unknown(), "wheels": [w.record() for w in self.wheels],
                "toolchain": {"cuda": tc.cuda, "entry": tc.entry, "action": tc.action} if tc else None,
                "sources": [s.record() for s in self.sources],
                "modules": [_module_record(m) for m in self.modules],
                "missing": [{"label": label, "where": where} for label, where in self.missing()],
                "notes": self.notes}


def _module_record(m: ModuleStep) -> dict[str, Any]:
    out: dict[str, Any] = {"variant": m.variant, "module": m.module, "action": m.link.action,
                           "objects": [o.record() for o in m.objects or ()]}
    if m.objects is None:
        out["objects_unknown"] = True
    if m.link.entry is not None:
        out["entry"] = m.link.entry
    return out


def plan_realize(root: Root, recipe_path: Path, reporter: Reporter, options: RealizeOptions, *,
                 locate_files: bool = True) -> Plan:
    """Every decision of a realize of ``recipe_path``, with nothing written under the root. ``locate_files``:
    ask the indexes where a file to fetch comes from and its size (never ``offline``)."""
    root = replace(root, read_only=True)
    store = Store(root.store, read_only=True).open()   # a store of another format is refused, as a realize would
    outcome = noop_check(root, recipe_path, options.variant)
    if outcome is not None:   # as the no-op realize: it reads no setting, none of which changes what it makes
        return Plan(outcome.name, outcome.profile, True, outcome.tree, outcome.counts, [], None, [], [], [])
    # what a realize checks before its work, in its order and with its words (docs/config.md): the hermetic.toml
    # files, the recipe, every setting, then the root (read-only here: what Root.ensure would refuse)
    config = options.config or load_config(Path(recipe_path).resolve().parent)
    recipe, variants, name = read_recipe(recipe_path, options.variant)
    check_settings(recipe, config, options)
    check_owner(root, recipe, options.variant, name)   # another recipe's root of that name: exit 2, as realize
    check_root(root)
    qualified = qualify(root, recipe)
    accepts = Accepts(qualified.python.tags)
    wheels = [*plan_wheels(store, qualified.locks, accepts, "environment"),
              *plan_wheels(store, qualified.toolchain_locks, accepts, "toolchain")]
    fetcher = plan_fetcher(root.tmp, accepts) if locate_files and not options.offline else None
    wheels = [locate(w, fetcher, reporter) if w.action == "fetch" else w for w in wheels]
    notes: list[str] = []
    toolchain: ToolchainStep | None = None
    sources: list[SourcePlan] = []
    modules: list[ModuleStep] = []
    if recipe.extensions:
        toolchain, sources, modules = _plan_build(root, store, recipe, variants, wheels, reporter, fetcher, notes)
    tally: dict[str, int] = {}
    for m in modules:
        for decision, n in m.decisions().items():
            tally[decision] = tally.get(decision, 0) + n
    fetch = [w for w in wheels if w.action == "fetch"]
    counts = Counts(len(wheels), len(fetch), sum(w.bytes or 0 for w in fetch),
                    sum(1 for w in wheels if w.action in ("fetch", "unpack")),
                    sum(1 for w in wheels if w.action == "reuse"),
                    objects=ObjectCounts.from_decisions(tally) if modules else None,
                    modules_linked=sum(1 for m in modules if m.link.action == "link") if modules else None)
    return Plan(name, root.profiles / name, False, None, counts, wheels, toolchain, sources, modules, notes)


def check_root(root: Root) -> None:
    """What ``Root.ensure`` refuses, said without writing (its words): a folder of other files and no marker (a
    mistyped --root), a root of a later format, a root's own folder that is no folder. A missing or empty folder
    is fine: a realize would make the root there."""
    from hermetic.root import ROOT_FORMAT, ROOT_MARKER, refuse_folders
    found = root.marker_format()
    if found is None:
        try:
            others = sorted(n for n in os.listdir(root.path)
                            if not (n.startswith(f".{ROOT_MARKER}.") and n.endswith(".tmp")))
        except FileNotFoundError:
            return
        if others:
            raise root.unmarked_error(others)
    if found is not None and found > ROOT_FORMAT:
        raise root.too_new_error(found)
    refuse_folders(root.folder_problems())


def _plan_build(root: Root, store: Store, recipe: Recipe, variants: list[Variant], wheels: list[WheelStep],
                reporter: Reporter, fetcher: Any, notes: list[str]
                ) -> tuple[ToolchainStep, list[SourcePlan], list[ModuleStep]]:
    """Steps 4-6 of a recipe that builds."""
    from hermetic.extensions.context import BuildContext
    from hermetic.extensions.host import qualify as qualify_host
    from hermetic.extensions.objects import InputHasher
    from hermetic.extensions.sources import archive_wheel, plan_sources, preview_source
    from hermetic.extensions.toolchain import PreparedToolchain, plan_toolchain
    from hermetic.extensions.variants import plan_modules
    tc_wheels = [w for w in wheels if w.part == "toolchain"]
    files = merge_files((w.found.entry, w.found.files) for w in tc_wheels if w.found is not None) \
        if tc_wheels and all(w.found is not None for w in tc_wheels) else None
    toolchain = plan_toolchain(store, recipe, files)
    sources: list[SourcePlan] = []
    trees: dict[tuple[str, str], tuple[Path | None, list[str] | None]] = {}
    for step in plan_sources(store, recipe, variants):
        src = step.source
        folder, tree_files = preview_source(root, store, step)
        plan = SourcePlan(step.variant, src.name, step.entry, step.action, len(step.patches),
                          len(tree_files) if tree_files is not None else None, src.name, src.where)
        if step.action == "fetch":
            archive = archive_wheel(src)
            located = locate(WheelStep("source", archive, "fetch", bytes=archive.size), fetcher, reporter)
            plan = plan._replace(label=wheel_label(archive), bytes=located.bytes, url=located.url,
                                 problem=located.problem)
            notes.append(f"source {src.name}: its archive is not in the store yet, so its objects are not counted")
        elif tree_files is None:   # gone since plan_sources looked: fetched first after all
            plan = plan._replace(action="fetch")
        sources.append(plan)
        trees[(step.variant, src.name)] = (folder, tree_files)
    ctx = None
    if toolchain.action == "reuse":
        assert toolchain.entry is not None
        host = qualify_host(root, recipe.python, need_torch=True,
                            where=recipe.doc.where("recipe", "python") if recipe.python else WHERE)
        ctx = BuildContext(root, store, recipe, host, PreparedToolchain.stored(root, store, recipe, toolchain.entry),
                           reporter, None, InputHasher(root, snapshot=True))
    else:
        notes.append("the toolchain's tree is not in the store yet: it is part of every object's key, so every "
                     "object is compiled")
    return toolchain, sources, plan_modules(ctx, recipe, variants, trees)
