"""realize: qualify, fetch, materialize, toolchain, (sources, build, check), receipt.

Each step is one function below; ``realize`` reads as the list. A realize whose inputs have not changed
fetches nothing, writes nothing in the store and imports neither requests nor torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic.build.toolchain import toolchain_links
from hermetic.errors import BadInput
from hermetic.locks.cache import read_lock_cached
from hermetic.realize.noop import Outcome, noop_check, record_inputs
from hermetic.realize.receipt import _receipt_records, latest_receipt, write_receipt
from hermetic.recipe import Recipe, Variant, load_recipe
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store
from hermetic.store.roots import write_root
from hermetic.store.trees import build_tree, merge_files, set_profile
from hermetic.wheels.unpacked import fetch_and_unpack

if TYPE_CHECKING:
    from hermetic.remote.layout import Sharing
    from hermetic.remote.settings import RemoteOptions


def realize(root: Root, recipe_path: Path, reporter: Reporter, *, variant: str | None = None,
            explain: bool = False, remote: RemoteOptions | None = None) -> Outcome:
    started = time.monotonic()
    timings: dict[str, float] = {}
    unchanged = None if explain else noop_check(root, recipe_path, variant)   # 0. anything changed?
    if unchanged is not None:
        unchanged.timings["total"] = round(time.monotonic() - started, 4)
        return unchanged
    from hermetic.audit import OutsideRootAudit
    audit = OutsideRootAudit(root.path)                         # what children leave outside the root
    audit.start()

    def lap(step: str, t: float) -> float:
        now = time.monotonic()
        timings[step] = round(now - t, 4)
        return now

    t = started
    recipe = load_recipe(recipe_path)                            # 1. validate
    variants = _chosen_variants(recipe, variant)
    name = recipe.name if variant is None else f"{recipe.name}.{variant}"
    root.ensure()
    store = Store(root.store).open()
    share = open_sharing(store, recipe, remote, reporter)       # the remote cache, if one is configured
    builds = bool(recipe.extensions)
    env_locks = [p for p in recipe.locks if not (builds and p == recipe.toolchain_lock)]
    locks = [read_lock_cached(root.state, p) for p in env_locks]       # 2. qualify (tags and markers)
    t = lap("qualify", t)
    counts: dict[str, int] = {"wheels": 0, "fetched": 0, "fetched_bytes": 0, "unpacked": 0, "reused": 0}
    unpacked = fetch_and_unpack(root, store, locks, reporter, counts, share)   # 3. fetch
    t = lap("fetch", t)
    files = merge_files((u.entry, u.files) for u in unpacked)    # 4. materialize
    links = toolchain_links(recipe.toolchain, files) if recipe.toolchain and not builds else {}
    refs = [f"entry:{u.entry}" for u in unpacked]
    report: dict[str, Any] = {}
    changed = False
    if builds:                                                   # 5-8. toolchain, sources, build, check
        from hermetic.build.variants import build_recipe  # compilers' machinery only for recipes that build
        result = build_recipe(root, store, recipe, variants, reporter, counts, explain, share)
        t = lap("build", t)
        files.update({m.filename: (m.digest, False) for m in result.modules})
        refs += result.refs
        report = result.report
        changed = result.changed
    reporter.event("phase", phase="materializing")
    tree, built = build_tree(store, name, files, links, refs=refs)
    profile = set_profile(root.profiles, name, store, tree)
    if builds:
        from hermetic.build.importcheck import import_check
        reporter.event("phase", phase="checking")
        report["import_check"] = import_check(root, report["host"]["executable"], profile,
                                              [m.module for m in result.modules], tree, result.env)
        t = lap("check", t)
    else:
        t = lap("materialize", t)
    counts["files"] = len(files)
    if share is not None:
        report["remote"] = share.summary()
        share.close()
    entries = sorted({tree, *(r[len("entry:"):] for r in refs if r.startswith("entry:"))})
    outcome = Outcome(name, recipe.path, profile, tree, entries, counts, timings,
                      changed=changed or built or counts["fetched"] > 0 or counts["unpacked"] > 0)
    reporter.event("phase", phase="receipt")
    outcome.changed |= write_root(root, name, recipe.path, entries)   # 9. receipt and gc root
    latest = None if outcome.changed else latest_receipt(root, name)
    if latest is None or not _receipt_records(latest, tree, store):  # also when a killed realize wrote none
        report["outside_root_audit"] = audit.finish()
        outcome.receipt = write_receipt(root, outcome, locks, unpacked, report)
    else:
        outcome.receipt = latest
    record_inputs(root, recipe.path, variant, _input_paths(recipe, report), outcome)
    lap("receipt", t)
    timings["total"] = round(time.monotonic() - started, 4)
    return outcome


def _chosen_variants(recipe: Recipe, variant: str | None) -> list[Variant]:
    if variant is None:
        return [v for v in recipe.variants if v.default]
    found = [v for v in recipe.variants if v.name == variant]
    if not found:
        raise BadInput(f"recipe {recipe.name} has no variant {variant!r}", where=str(recipe.path),
                       hint=f"variants: {', '.join(v.name for v in recipe.variants)}")
    return found


def _input_paths(recipe: Recipe, report: dict[str, Any]) -> list[Path]:
    """What a no-op trusts by fingerprint: recipe files, locks, sources, patches, interpreter, torch, compilers."""
    paths = recipe.inputs()
    host = report.get("host")
    if host:
        paths.append(Path(host["executable"]))
        if host.get("torch"):
            paths.append(Path(host["torch"]["version_file"]))
    for cxx in report.get("toolchain", {}).get("host_compilers", {}).values():
        paths.append(Path(cxx["path"]))
    return paths


def open_sharing(store: Store, recipe: Recipe, options: RemoteOptions | None,
                 reporter: Reporter) -> Sharing | None:
    """The remote cache of the command line, else $HERMETIC_REMOTE_CACHE, else the recipe's [remote]."""
    from hermetic.urls import remote_in_environment
    if options is None and not (recipe.remote_url or recipe.remote_mode or remote_in_environment()):
        return None
    from hermetic.remote.settings import resolve_settings
    settings = resolve_settings(options, os.environ, recipe.remote_url, recipe.remote_mode,
                                recipe.doc.where("remote") if recipe.remote_url or recipe.remote_mode else "")
    if settings is None:
        return None
    from hermetic.remote.bazel import BazelHttpCache
    from hermetic.remote.layout import Sharing
    reporter.event("remote", f"remote cache {settings.url} ({'read-write' if settings.writable else 'read-only'})",
                   **settings.record())
    return Sharing(BazelHttpCache(settings, reporter), store)
