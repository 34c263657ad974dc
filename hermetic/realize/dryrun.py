"""``realize --dry-run``: what a realize would do, decided from the keys and the store, with nothing written
under the root (docs/builds.md, "Dry run"). The same questions as the pipeline's steps, asked without acting:

    0. no-op      the no-op record (``realize.noop``): up to date, and nothing would be done at all
    1-2           the recipe, its interpreter and its locks (caches read, never written)
    3. fetch      each locked wheel: reused (unpacked in the store), unpacked (its file is in the store), or
                  fetched, with its size: the lock's, else the index's, else the server's Content-Length
                  (response headers only); ``--offline``: the lock's, and exit 3 naming what must be fetched
    4. toolchain  its tree (named by the unpacked wheels' files): in the store, or assembled
    5. sources    each variant's source tree: in the store, or prepared (a copy made and patched in a folder
                  outside the root, so that its files can be hashed)
    6. build      each object's lookup key and inputs against the store's records (``ObjectCache.peek``, the
                  proof ``find`` makes): reused, reused from another variant, or compiled, and why; a compile
                  whose key another compile of the plan shares (another variant's copy) is predicted as the
                  build graph predicts it; each module linked, or found by its link key

What it cannot know, it says: without the toolchain's tree in the store every object is compiled (the tree is
part of every key); the remote cache is not asked (a realize with one may fetch objects this plan compiles).

The root is seen read-only (``Root.read_only``): caches are read and never written, nothing is pinned (no temp
root, no lock file), and the children it may start (the interpreter's probe, torch's qualification, a patch)
get homes and temp folders outside the root.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.build.context import BuildContext
from hermetic.build.extension import object_cache, plan_link, previous_objects
from hermetic.build.host import HostFacts, qualify
from hermetic.build.job import ModuleJob
from hermetic.build.objects import INPUT_CHANGED, NO_MATCH, Decision, InputHasher, ObjectCache
from hermetic.build.plan import Compile, plan_extension, select_sources
from hermetic.build.predict import IncludeScanner, predict
from hermetic.build.sources import SYSTEM_PATH, archive_wheel, prepare_outside, source_entry_name
from hermetic.build.toolchain import PreparedToolchain, toolchain_links
from hermetic.build.variants import check_builds
from hermetic.errors import HermeticError
from hermetic.interpreter import WHERE, interpreter
from hermetic.locks.cache import read_lock_cached
from hermetic.locks.types import Lock, LockedWheel
from hermetic.realize.noop import Counts, ObjectCounts, noop_check
from hermetic.realize.pipeline import chosen_variants
from hermetic.recipe import Recipe, load_recipe
from hermetic.reporter import Reporter, plural
from hermetic.root import Root, sweep_outside_scratch
from hermetic.store import Store
from hermetic.store.trees import merge_files, tree_entry_name
from hermetic.wheels.unpacked import (
    Unpacked,
    _Accepts,
    _filename_from_wheel,
    _unique_wheels,
    load_unpacked,
    offline_error,
    unpacked_entry_name,
    wheel_label,
)

if TYPE_CHECKING:
    from hermetic.fetch.download import Fetcher

PLAN_VERSION = 2   # 2: the counts say "objects" (1: "objects_objects"), source archives' bytes not in them


def dry_run(root: Root, recipe_path: Path, reporter: Reporter, *, variant: str | None = None,
            offline: bool = False) -> int:
    """Print the plan (stdout; with --json it is the result record) and return the exit code: 0, or 3 offline
    when something would have to be fetched."""
    for left in sweep_outside_scratch():   # a dry run killed with kill -9 left its folder outside the root
        reporter.detail("dry-run", f"removed {left}, left by a dry run that was killed")
    plan = Planner(replace(root, read_only=True), recipe_path, reporter, variant, offline).plan()
    say(plan, reporter)
    plan = {**plan, "counts": plan["counts"].to_json()}
    fields = {"recipe": plan["recipe"], "profile": plan["profile"], "tree": plan["tree"],
              "changed": not plan["up_to_date"], "counts": plan["counts"], "timings": {}, "receipt": None,
              "dry_run": True, "plan": plan}
    if offline and plan["missing"]:
        err = offline_error([(m["label"], m["where"]) for m in plan["missing"]])
        print(err.render(), file=sys.stderr)
        reporter.result("realize", False, err.exit_code, **fields, error=err.as_record())
        return err.exit_code
    reporter.result("realize", True, 0, **fields)
    return 0


class Planner:
    def __init__(self, root: Root, recipe_path: Path, reporter: Reporter, variant: str | None,
                 offline: bool) -> None:
        assert root.read_only
        self.root, self.recipe_path, self.reporter = root, recipe_path, reporter
        self.variant, self.offline = variant, offline
        self.store = Store(root.store)   # never opened: a missing store is an empty one, and stays missing
        self.fetcher: Fetcher | None = None
        self.notes: list[str] = []
        self.unpacked: dict[tuple[str, str], Unpacked] = {}   # (part, name) -> its unpacked entry, when stored

    def plan(self) -> dict[str, Any]:
        if (self.store.path / "FORMAT").exists():
            self.store.open()  # a store of another format is refused, as a realize would (opening one only reads)
        outcome = noop_check(self.root, self.recipe_path, self.variant)
        if outcome is not None:
            return {"version": PLAN_VERSION, "recipe": outcome.name, "up_to_date": True,
                    "profile": str(outcome.profile), "tree": outcome.tree, "counts": outcome.counts,
                    "fetch_bytes_unknown": 0, "wheels": [], "toolchain": None, "sources": [], "modules": [],
                    "missing": [], "notes": []}
        recipe = load_recipe(self.recipe_path)
        variants = chosen_variants(recipe, self.variant)
        name = recipe.name if self.variant is None else f"{recipe.name}.{self.variant}"
        builds = bool(recipe.extensions)
        if builds:
            check_builds(recipe)
        python = interpreter(self.root, recipe.python,
                             recipe.doc.where("recipe", "python") if recipe.python else WHERE)
        cache = self.root.cache("locks")
        tc_path = recipe.toolchain_lock if builds else None
        locks = [read_lock_cached(cache, p, python) for p in recipe.locks if p != tc_path]
        tc_locks = [read_lock_cached(cache, tc_path, python)] if tc_path is not None else []
        accepts = _Accepts(python.tags)
        wheels = self.wheels(locks, accepts, "environment") + self.wheels(tc_locks, accepts, "toolchain")
        plan: dict[str, Any] = {"version": PLAN_VERSION, "recipe": name, "up_to_date": False,
                                "profile": str(self.root.profiles / name), "tree": None, "wheels": wheels,
                                "toolchain": None, "sources": [], "modules": []}
        if builds:
            self.build(plan, recipe, variants, [w for w in wheels if w["part"] == "toolchain"])
        plan["missing"] = [{"label": w["label"], "where": w["where"]} for w in [*wheels, *plan["sources"]]
                           if w["action"] == "fetch"]
        plan["counts"] = _counts(plan)
        plan["fetch_bytes_unknown"] = sum(1 for w in [*wheels, *plan["sources"]]
                                          if w["action"] == "fetch" and w["bytes"] is None)
        plan["notes"] = self.notes
        return plan

    # 3. wheels -----------------------------------------------------------------------------------------------
    def wheels(self, locks: list[Lock], accepts: _Accepts, part: str) -> list[dict[str, Any]]:
        out = []
        for w in _unique_wheels(locks):
            item: dict[str, Any] = {"part": part, "name": w.name, "version": w.version, "label": wheel_label(w),
                                    "where": w.where, "filename": w.filename, "bytes": w.size, "url": None,
                                    "entry": None}
            found = self._unpacked(w, accepts)
            if found is not None:
                item.update(action="reuse", entry=found.entry, filename=found.filename)
                self.unpacked[(part, w.name)] = found
            elif (blob := self._blob(w, accepts)) is not None:
                item.update(action="unpack", bytes=blob.stat().st_size,
                            filename=w.filename or _filename_from_wheel(w, blob))
            else:
                item["action"] = "fetch"
                self.locate(w, item)
            out.append(item)
        return out

    def _unpacked(self, w: LockedWheel, accepts: _Accepts) -> Unpacked | None:
        for h in w.hashes:
            entry = unpacked_entry_name(h, w.name)
            if self.store.has_entry(entry):
                found = load_unpacked(self.store, entry)
                if w.filename or accepts(found.filename):
                    return found
        return None

    def _blob(self, w: LockedWheel, accepts: _Accepts) -> Path | None:
        for h in w.hashes:
            blob = self.store.blob_path(h)
            if blob.is_file() and (w.filename or accepts(_filename_from_wheel(w, blob))):
                return blob
        return None

    def locate(self, w: LockedWheel, item: dict[str, Any]) -> None:
        """Where a file to fetch comes from and its size: the lock's, else the index's (never offline)."""
        if self.offline:
            if item["bytes"] is None and w.path is not None and os.path.isfile(w.path):
                item["bytes"] = os.path.getsize(w.path)
            return
        if self.fetcher is None:
            from hermetic.fetch.download import Fetcher
            from hermetic.fetch.pipconfig import load_pip_config
            self.fetcher = Fetcher(load_pip_config(), self.root.tmp, None)
        try:
            found = self.fetcher.locate(w)
        except HermeticError as e:  # the realize would fail here: said, and the plan goes on
            item["problem"] = e.render().removeprefix("error: ")
            self.reporter.warn(f"{item['label']}: {e.what}", wheel=item["label"])
            return
        item.update(filename=found.filename, bytes=found.size, url=found.url)

    # 4-6. the build ------------------------------------------------------------------------------------------
    def build(self, plan: dict[str, Any], recipe: Recipe, variants: list[Any], tc_wheels: list[dict[str, Any]]
              ) -> None:
        assert recipe.toolchain is not None
        tc_name: str | None = None
        if tc_wheels and all(w["action"] == "reuse" for w in tc_wheels):
            files = merge_files((w["entry"], self.unpacked[("toolchain", w["name"])].files) for w in tc_wheels)
            tc_name = tree_entry_name(f"{recipe.name}.toolchain", files, toolchain_links(recipe.toolchain, files))
        in_store = tc_name is not None and self.store.has_entry(tc_name)
        plan["toolchain"] = {"cuda": recipe.toolchain.cuda, "entry": tc_name,
                             "action": "reuse" if in_store else "assemble"}
        trees = self.sources(plan, recipe, variants)
        ctx: BuildContext | None = None
        if in_store:
            assert tc_name is not None
            facts: HostFacts = qualify(self.root, recipe.python, need_torch=True,
                                       where=recipe.doc.where("recipe", "python") if recipe.python else WHERE)
            ctx = BuildContext(self.root, self.store, recipe, facts,
                               PreparedToolchain.stored(self.root, self.store, recipe, tc_name), self.reporter, None,
                               InputHasher(self.root, snapshot=True))   # read, never saved
        else:
            self.notes.append("the toolchain's tree is not in the store yet: it is part of every object's key, so "
                              "every object is compiled")
        scanner = IncludeScanner(self.root)
        pending: dict[str, tuple[Compile, ObjectCache, dict[str, Any]]] = {}
        for variant in variants:
            for ext in recipe.extensions:
                src_root, tree_files = trees[(variant.name, ext.source)]
                module = variant.module or ext.name
                mod: dict[str, Any] = {"variant": variant.name, "module": module, "objects": []}
                plan["modules"].append(mod)
                if tree_files is None:
                    mod.update(action="link", objects_unknown=True)
                    continue
                if ctx is None or src_root is None:
                    why = "the toolchain's tree is not in the store yet"
                    mod["objects"] = [{"source": rel, "decision": "compiled", "reason": why}
                                      for rel in select_sources(tree_files, ext.sources, ext.exclude)]
                    mod["action"] = "link"
                    continue
                site = ctx.site(ext, variant, src_root, tree_files)
                bplan = plan_extension(ext, variant, ctx.host, ctx.cuda, site)
                cache = object_cache(ctx, site.pmap)
                previous = previous_objects(self.store, self.root.cache("builds").get(
                    f"{recipe.name}.{variant.name}.{ext.name}"))
                digests: list[str] = []
                for c in bplan.compiles:
                    d = cache.peek(c)
                    obj: dict[str, Any] = {"source": c.rel, "decision": str(d.decision), "reason": d.reason}
                    if d.decision is Decision.COMPILED:
                        if d.reason in (NO_MATCH, INPUT_CHANGED):
                            obj["reason"] = cache.explain(c, previous.get(c.rel))
                        key = cache.lookup(c)
                        if key in pending:
                            leader, leader_cache, leader_obj = pending[key]
                            last = previous.get(c.rel)
                            guess = predict(scanner, c, cache, leader, leader_cache,
                                            [str(i[0]) for i in last["inputs"]] if last else ())
                            if guess.wait:
                                obj.update(decision=str(Decision.REUSED_VARIANT), predicted=True,
                                           reason=f"predicted: the object of {leader_obj['module']}: "
                                                  f"{leader.rel}, compiled first in this realize")
                            else:
                                obj["reason"] += f" (and not {leader_obj['module']}'s: {guess.reason})"
                        else:
                            pending[key] = (c, cache, mod)
                    elif d.record is not None:
                        digests.append(d.record["object"])
                    mod["objects"].append(obj)
                if len(digests) == len(bplan.compiles):
                    job = ModuleJob(ext, variant, bplan, site.build_dir, site.pmap, ctx.env, cache, [], {})
                    step = plan_link(ctx, job, digests)
                    mod.update(action=step.action, entry=step.entry)
                else:
                    mod["action"] = "link"

    def sources(self, plan: dict[str, Any], recipe: Recipe, variants: list[Any]
                ) -> dict[tuple[str, str], tuple[Path | None, list[str] | None]]:
        """(variant, source) -> (the folder its files are read from, its files), as realize would lay them out;
        (None, None) when its archive must be fetched first."""
        out: dict[tuple[str, str], tuple[Path | None, list[str] | None]] = {}
        names = sorted({e.source for e in recipe.extensions})
        env = self.root.child_env({"PATH": SYSTEM_PATH, "LC_ALL": "C"})   # homes outside the root
        for variant in variants:
            for n in names:
                src = recipe.sources[n]
                patches = src.patches + variant.patches
                entry = source_entry_name(src, patches)
                item: dict[str, Any] = {"variant": variant.name, "source": n, "entry": entry, "label": n,
                                        "where": src.where, "patches": len(patches), "bytes": None}
                if self.store.has_entry(entry):
                    files = sorted(self.store.tree_record(entry)["files"])
                    item.update(action="reuse", files=len(files))
                    out[(variant.name, n)] = (self.store.entry_path(entry) / "out", files)
                else:
                    folder = self.root.tmp / "sources" / entry
                    if prepare_outside(self.store, src, patches, folder, env):
                        files = sorted(_walk(folder))
                        item.update(action="prepare", files=len(files))
                        out[(variant.name, n)] = (folder, files)
                    else:
                        wheel = archive_wheel(src)
                        item.update(action="fetch", label=wheel_label(wheel), files=None)
                        self.locate(wheel, item)
                        out[(variant.name, n)] = (None, None)
                        self.notes.append(f"source {n}: its archive is not in the store yet, so its objects are "
                                          "not counted")
                plan["sources"].append(item)
        return out


def _walk(folder: Path) -> list[str]:
    return [os.path.relpath(os.path.join(d, f), folder) for d, _dirs, files in os.walk(folder) for f in files]


def _counts(plan: dict[str, Any]) -> Counts:
    """The counts the realize's result would have: of wheels (a source archive's bytes are its line's own, as
    a realize counts none), and for a recipe that builds, of objects by decision and of modules linked."""
    wheels = plan["wheels"]
    fetch = [w for w in wheels if w["action"] == "fetch"]
    objects = None
    if plan["modules"]:
        tally: dict[str, int] = {}
        for o in (o for m in plan["modules"] for o in m["objects"]):
            tally[o["decision"]] = tally.get(o["decision"], 0) + 1
        objects = ObjectCounts.from_decisions(tally)
    return Counts(len(wheels), len(fetch), sum(w["bytes"] or 0 for w in fetch),
                  sum(1 for w in wheels if w["action"] in ("fetch", "unpack")),
                  sum(1 for w in wheels if w["action"] == "reuse"), objects=objects,
                  modules_linked=sum(1 for m in plan["modules"] if m["action"] == "link") if objects else None)


# what it says ------------------------------------------------------------------------------------------------
def say(plan: dict[str, Any], reporter: Reporter) -> None:
    """The plan as data (stdout): a line per wheel and source to fetch, unpack or prepare, a line per module, a
    line per object with -v, and the totals."""
    c: Counts = plan["counts"]
    if plan["up_to_date"]:
        objects = f"; {plural(c.objects.total, 'objects')} reused" if c.objects is not None else ""
        reporter.data("plan", f"dry run: {plan['recipe']} is up to date: nothing would be fetched, unpacked or "
                              f"compiled ({plural(c.wheels, 'wheels')} reused{objects}); nothing written")
        return
    lines = [f"dry run: realize {plan['recipe']} -> {plan['profile']} (nothing written)"]
    for w in plan["wheels"]:
        if w["action"] == "reuse" and not reporter.verbose:
            continue
        size = f"  {_size(w['bytes'])}" if w["action"] != "reuse" else ""
        lines.append(f"  {w['action']:<8} {w['label']}{size}  ({w['where']})"
                     + (f"\n           {w['url']}" if reporter.verbose and w.get("url") else "")
                     + (f"\n           problem: {w['problem']}" if w.get("problem") else ""))
    tc = plan["toolchain"]
    if tc is not None:
        lines.append(f"  {tc['action']:<8} the CUDA {tc['cuda']} toolchain's tree")
    for s in plan["sources"]:
        what = plural(s["files"], "files") if s["files"] is not None else "its archive fetched first"
        size = f", {_size(s['bytes'])}" if s["action"] == "fetch" else ""
        patched = f", {plural(s['patches'], 'patches')}" if s["patches"] else ""
        lines.append(f"  {s['action']:<8} source {s['source']} of variant {s['variant']} ({what}{patched}{size})")
    for m in plan["modules"]:
        objs = m["objects"]
        counted = {k: sum(1 for o in objs if o["decision"] == k) for k in ("compiled", "reused", "reused-variant")}
        what = "objects not known until its source is fetched" if m.get("objects_unknown") else \
            (f"{plural(len(objs), 'objects')}: {counted['compiled']} compiled, {counted['reused']} reused, "
             f"{counted['reused-variant']} reused across variants")
        lines.append(f"  {m['action']:<8} module {m['module']} of variant {m['variant']} ({what})")
        if reporter.verbose:
            lines += [f"             {o['decision']}: {o['source']}" + (f" ({o['reason']})" if o["reason"] else "")
                      for o in objs]
    lines += [f"  note: {n}" for n in plan["notes"]]
    unknown = plan["fetch_bytes_unknown"]
    total = f"fetch {plural(c.fetched, 'wheels')} ({_size(c.fetched_bytes)}" + \
        (f", and {unknown} of unknown size)" if unknown else ")")
    o = c.objects
    objects = (f"; compile {plural(o.compiled + o.uncacheable, 'objects')}, reuse {o.reused}, reuse "
               f"{o.reused_variant} across variants; link {plural(c.modules_linked or 0, 'modules')}"
               if o is not None else "")
    lines.append(f"would {total}, unpack {c.unpacked}, reuse {c.reused}{objects}")
    reporter.data("plan", "\n".join(lines))


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"
