"""Steps 5-7 of realize for a recipe that builds: toolchain, host, sources, then every extension of every
chosen variant, under the recipe's build lock (variants share the stable source path in turn).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hermetic import fs
from hermetic.build.extension import BuiltModule, build_env, build_extension
from hermetic.build.host import qualify
from hermetic.build.sources import link_stable, realize_source
from hermetic.build.toolchain import check_compatible, host_compiler, inspect_toolchain, toolchain_links
from hermetic.errors import BadInput
from hermetic.locks.cache import read_lock_cached
from hermetic.recipe import Recipe, Variant
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store
from hermetic.store.trees import build_tree, merge_files, set_profile

if TYPE_CHECKING:
    from hermetic.build.share import ObjectShare


@dataclass
class RecipeBuild:
    modules: list[BuiltModule]
    refs: list[str]
    report: dict[str, Any]
    env: dict[str, str]
    changed: bool = False
    explained: list[str] = field(default_factory=list)


def build_recipe(root: Root, store: Store, recipe: Recipe, variants: list[Variant], reporter: Reporter,
                 counts: dict[str, int], explain: bool, share: ObjectShare | None = None) -> RecipeBuild:
    from hermetic.wheels.unpacked import fetch_and_unpack  # the fetch step is shared with plain lock recipes

    if recipe.toolchain is None or recipe.toolchain_lock is None:
        raise BadInput("a recipe that builds extensions needs [toolchain] with cuda and lock",
                       where=str(recipe.path), hint='add [toolchain] cuda = "13.0", lock = "..."')
    reporter.event("phase", phase="toolchain")
    tc_name = f"{recipe.name}.toolchain"
    unpacked = fetch_and_unpack(root, store, [read_lock_cached(root.state, recipe.toolchain_lock)], reporter,
                                counts, share)
    tc_files = merge_files((u.entry, u.files) for u in unpacked)
    tc_tree, tc_built = build_tree(store, tc_name, tc_files, toolchain_links(recipe.toolchain, tc_files),
                                   refs=[f"entry:{u.entry}" for u in unpacked])
    tc_profile = set_profile(root.profiles, tc_name, store, tc_tree)
    facts = qualify(root, recipe.python, need_torch=True)                  # 2. the host interpreter
    tc = inspect_toolchain(root, tc_profile, recipe.toolchain, tc_tree)   # 5. compatible with torch?
    check_compatible(tc, recipe.toolchain, facts["torch"]["cuda"])
    compilers = {"c++": host_compiler(root, "c++"), "gcc": host_compiler(root, "gcc")}
    toolchain_id = {"cuda": tc_tree, "host_compilers": compilers}
    refs = [f"entry:{tc_tree}"]
    modules: list[BuiltModule] = []
    sources_report: dict[str, Any] = {}
    reporter.event("phase", phase="sources")
    with fs.FileLock(root.path / "build" / recipe.name / ".lock", what=f"the build of {recipe.name}"):
        for variant in variants:
            if variant.patches and len({e.source for e in recipe.extensions}) > 1:
                raise BadInput(f"variant {variant.name} has patches but the recipe builds from several sources",
                               where=str(recipe.path), hint="give patches to [sources.NAME].patches instead")
            trees = {}
            for src_name in sorted({e.source for e in recipe.extensions}):
                src = recipe.sources[src_name]
                tree = realize_source(root, store, src, src.patches + variant.patches, reporter, share)  # 6.
                trees[src_name] = (link_stable(root, recipe.name, src_name, store, tree), tree)
                refs.append(f"entry:{tree.entry}")
                sources_report[f"{variant.name}/{src_name}"] = {"tree": tree.entry, "files": len(tree.files)}
            for ext in recipe.extensions:                                         # 7. build
                src_root, tree = trees[ext.source]
                built = build_extension(root, store, recipe, ext, variant, facts, tc, toolchain_id, src_root,
                                        sorted(tree.files), reporter, share)
                modules.append(built)
                refs += [f"entry:{built.entry}", f"blob:{built.certificate_blob}"]
    totals: dict[str, int] = {}
    for m in modules:
        for k, v in m.counts().items():
            totals[k] = totals.get(k, 0) + v
    counts.update({f"objects_{k}": v for k, v in totals.items()})
    explained = [f"{m.module}: {d.compile.rel}: {d.decision}" + (f" ({d.reason})" if d.reason else "")
                 + (f" [waived {', '.join(d.waived)}]" if d.waived else "")
                 for m in modules for d in m.decisions]
    if explain:
        for line in explained:
            reporter.event("explain", line)
    report = {
        "host": facts,
        "toolchain": {"entry": tc_tree, "nvcc": tc.nvcc_version, "cudart": tc.cudart_version,
                      "cuda_home": str(tc.cuda_home), "archs": list(recipe.toolchain.archs),
                      "host_compilers": compilers},
        "sources": sources_report,
        "modules": [{"module": m.module, "file": m.filename, "sha256": m.digest, "entry": m.entry,
                     "certificate_sha256": m.certificate, "certificate_blob": m.certificate_blob,
                     "counts": m.counts(), "linked": m.linked} for m in modules],
    }
    changed = tc_built or any(m.linked or m.counts().get("compiled", 0) for m in modules)
    return RecipeBuild(modules, refs, report, build_env(root, tc), changed, explained)
