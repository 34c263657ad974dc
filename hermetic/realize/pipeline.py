"""realize: a recipe into the store, as the steps of docs/builds.md.

    0. no-op      has anything changed? (``realize.noop``; the caller asks, once per command)
    1. validate   the recipe and its variants; the store and the remote cache opened; the sandbox every
                  child of the steps below runs in (hermetic.sandbox), or why there is none
    2. qualify    the recipe's interpreter (its tags, markers and scheme; torch too for a recipe that
                  builds) and the locks, evaluated for it. Torch's facts may be a guess from its files while
                  the probe imports it (build.host): confirmed before anything is recorded or any error
                  reported; a refuted guess starts the realize again
    3. fetch      every locked wheel not yet in the store, unpacked once
    4. toolchain  the CUDA toolchain's tree, checked against torch
    5. sources    the source trees of every variant, patched
    6. build      every extension of every variant: certified reuse, compiles, links, certificates
    7. materialize  the environment's tree (wheels, modules, launchers for the interpreter) and its profile
    8. check      the modules imported together in a fresh interpreter, no CUDA context
    9. receipt    the gc root, the receipt, the no-op record

A realize whose inputs have not changed stops at step 0: it fetches nothing, writes nothing in the store
and imports neither requests nor torch (this module is not even imported then).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermetic import procs
from hermetic.audit import OutsideRootAudit
from hermetic.build.toolchain import toolchain_links
from hermetic.errors import BadInput, HermeticError
from hermetic.interpreter import WHERE, Interpreter, interpreter
from hermetic.locks.cache import read_lock_cached
from hermetic.locks.types import Lock
from hermetic.realize.noop import Outcome, record_inputs
from hermetic.realize.receipt import write_receipt
from hermetic.recipe import Recipe, Variant, load_recipe
from hermetic.reporter import Reporter
from hermetic.root import Root, lock_dir
from hermetic.sandbox import Sandbox, choose, resolve_mode
from hermetic.store import Store, entry_ref, split_refs
from hermetic.store.records import FileMap
from hermetic.store.roots import write_root
from hermetic.store.trees import build_tree, merge_files, set_profile
from hermetic.wheels.scripts import launchers, with_shebangs
from hermetic.wheels.unpacked import Unpacked, fetch_and_unpack, offline_error, offline_missing

if TYPE_CHECKING:
    from hermetic.build.host import Qualifying
    from hermetic.build.importcheck import ImportCheck
    from hermetic.build.sources import SourceTree
    from hermetic.build.variants import PreparedToolchain, RecipeBuild
    from hermetic.remote.layout import Sharing
    from hermetic.remote.settings import RemoteOptions


def realize(root: Root, recipe_path: Path, reporter: Reporter, *, variant: str | None = None,
            explain: bool = False, remote: RemoteOptions | None = None, offline: bool = False,
            sandbox: str | None = None) -> Outcome:
    """Steps 1-9; the caller ran step 0 (``noop.noop_check``) unless it wants every step (``--explain``).
    ``offline``: nothing is fetched (no index, no remote cache); what would have to be is a failed precondition.
    ``sandbox``: the command line's mode (``--sandbox``), which wins over HERMETIC_SANDBOX and the recipe's."""
    from hermetic.build.host import GuessWrong
    try:
        return _attempt(root, recipe_path, reporter, variant, explain, remote, offline, sandbox, guess=True)
    except GuessWrong as e:  # nothing was recorded with the guess: the probe's answer is cached now
        reporter.warn(f"{e}: realizing again with the probe's answer")
        return _attempt(root, recipe_path, reporter, variant, explain, remote, offline, sandbox, guess=False)


def _attempt(root: Root, recipe_path: Path, reporter: Reporter, variant: str | None, explain: bool,
             remote: RemoteOptions | None, offline: bool, sandbox: str | None, *, guess: bool) -> Outcome:
    r = Realization(root, recipe_path, reporter, variant, explain, remote, offline)
    r.guess = guess
    r.validate(sandbox)     # 1
    with r.sandbox.confined():
        try:
            r.qualify()         # 2
            r.fetch()           # 3
            r.toolchain()       # 4
            r.sources()         # 5
            r.build()           # 6
            r.materialize()     # 7
            r.check()           # 8
            return r.receipt()  # 9
        except HermeticError:
            # an error found with guessed facts is only reported once the probe has confirmed them
            if r.qualifying is not None:
                r.qualifying.confirm()
            raise
        finally:
            if r.import_check is not None:  # started early and not needed: a failed build
                r.import_check.cancel()
            if r.qualifying is not None:
                r.qualifying.cancel()


def say_sandbox(reporter: Reporter, sandbox: Sandbox, what: str) -> None:
    """One line where the children run without a sandbox although it was not turned off."""
    if not sandbox.used and sandbox.mode != "off":
        reporter.event("sandbox", f"no sandbox for {what}: {sandbox.why_not}; the outside-root audit judges what "
                                  f"appears outside the root instead", used=False, why_not=sandbox.why_not)


def say_bytecode_cleared(reporter: Reporter) -> None:
    """The children's bytecode caches found damaged (a .pyc cut short by a full disk) and cleared meanwhile."""
    while procs.BYTECODE_CLEARED:
        folder = procs.BYTECODE_CLEARED.pop(0)
        reporter.warn(f"the children's bytecode cache {folder} was damaged (a .pyc cut short, as a full disk "
                      "leaves one: 'marshal data too short'): cleared, and the child ran again", path=folder)


def say_refused(reporter: Reporter, sandbox: Sandbox) -> None:
    """The writes the sandbox refused to children that carried on (one that failed is an error)."""
    for r in sandbox.confinement.refused if sandbox.confinement is not None else []:
        reporter.warn(f"the sandbox refused {r.program} a write to {r.path} (it carried on): {r.line.strip()}",
                      path=r.path)


class Realization:
    """The state one realize carries from step to step."""

    def __init__(self, root: Root, recipe_path: Path, reporter: Reporter, variant: str | None, explain: bool,
                 remote: RemoteOptions | None, offline: bool = False) -> None:
        self.root, self.recipe_path, self.reporter = root, recipe_path, reporter
        self.variant, self.explain, self.remote_options, self.offline = variant, explain, remote, offline
        self.started = self.lap_started = time.monotonic()
        self.timings: dict[str, float] = {}
        self.counts: dict[str, int] = {"wheels": 0, "fetched": 0, "fetched_bytes": 0, "unpacked": 0, "reused": 0}
        self.report: dict[str, Any] = {}
        self.audit = OutsideRootAudit(root.path)   # what children leave outside the root
        self.audit.start()
        self.share: Sharing | None = None
        self.facts: dict[str, Any] | None = None
        self.qualifying: Qualifying | None = None   # the host's facts, possibly still being probed
        self.guess = True
        self.python: Interpreter | None = None
        self.locks: list[Lock] = []
        self.toolchain_lock: Lock | None = None
        self.unpacked: list[Unpacked] = []
        self.toolchain_unpacked: list[Unpacked] = []
        self.tc: PreparedToolchain | None = None
        self.trees: dict[str, dict[str, SourceTree]] = {}
        self.built: RecipeBuild | None = None
        self.import_check: ImportCheck | None = None
        self.files: FileMap = {}
        self.refs: list[str] = []
        self.tree = ""
        self.tree_built = False
        self.profile = root.profiles

    def lap(self, step: str) -> None:
        now = time.monotonic()
        self.timings[step] = round(now - self.lap_started, 4)
        self.lap_started = now

    @property
    def builds(self) -> bool:
        return bool(self.recipe.extensions)

    def validate(self, sandbox: str | None = None) -> None:
        self.recipe = load_recipe(self.recipe_path)
        self.variants = chosen_variants(self.recipe, self.variant)
        self.name = self.recipe.name if self.variant is None else f"{self.recipe.name}.{self.variant}"
        self.root.ensure()
        limits = self.recipe.limits
        for warning in limits.warnings:   # CPUs of [limits] cpus this machine lacks
            self.reporter.warn(warning)
        mode, set_by = resolve_mode(sandbox, limits.sandbox,
                                    self.recipe.doc.where("limits", "sandbox") if limits.sandbox else "")
        self.lock_folder = lock_dir(None)
        self.sandbox = choose(self.root, mode, set_by, self.lock_folder)
        say_sandbox(self.reporter, self.sandbox, f"realizing {self.name}")
        self.store = Store(self.root.store).open()
        self.share = open_sharing(self.store, self.recipe, self.remote_options, self.reporter, self.offline)
        if self.builds:
            from hermetic.build.variants import check_builds  # compilers' machinery only for recipes that build
            check_builds(self.recipe)

    def qualify(self) -> None:
        self.python = interpreter(self.root, self.recipe.python, self.recipe.doc.where("recipe", "python")
                                  if self.recipe.python else WHERE)
        self.report["interpreter"] = self.python.summary()
        cache = self.root.cache("locks")
        tc_lock = self.recipe.toolchain_lock if self.builds else None
        self.locks = [read_lock_cached(cache, p, self.python) for p in self.recipe.locks if p != tc_lock]
        if tc_lock is not None:
            self.toolchain_lock = read_lock_cached(cache, tc_lock, self.python)
        if self.builds:
            from hermetic.build.host import start_qualify
            self.qualifying = start_qualify(self.root, self.recipe.python, guess=self.guess,
                                            where=self.recipe.doc.where("recipe", "python") if self.recipe.python
                                            else WHERE)
            self.facts = self.qualifying.facts
        self.lap("qualify")

    def confirm_facts(self, *, wait: bool = True) -> None:
        """The host's facts, confirmed by the probe (``wait``), or where it has answered already."""
        if self.qualifying is not None and (wait or self.qualifying.done()):
            self.qualifying.confirm()

    def fetch(self) -> None:
        assert self.python is not None
        tags = self.python.tags
        if self.offline and (missing := [*offline_missing(self.store, self.locks, tags),
                                         *offline_missing(self.store, self.toolchain_locks(), tags)]):
            raise offline_error(missing)  # every missing wheel of every lock named at once, before any work
        self.unpacked = fetch_and_unpack(self.root, self.store, self.locks, self.reporter, self.counts, self.share,
                                         tags, offline=self.offline)
        if self.toolchain_lock is not None:
            self.toolchain_unpacked = fetch_and_unpack(self.root, self.store, [self.toolchain_lock], self.reporter,
                                                       self.counts, self.share, tags, offline=self.offline)
        self.lap("fetch")

    def toolchain(self) -> None:
        if not self.builds:
            return
        from hermetic.build.variants import prepare_toolchain
        assert self.facts is not None
        self.tc = prepare_toolchain(self.root, self.store, self.recipe, self.toolchain_unpacked, self.facts,
                                    self.reporter)
        self.confirm_facts(wait=False)
        self.lap("toolchain")

    def sources(self) -> None:
        if not self.builds:
            return
        from hermetic.build.variants import prepare_sources
        self.trees = prepare_sources(self.root, self.store, self.recipe, self.variants, self.reporter, self.share,
                                     offline=self.offline)
        self.confirm_facts(wait=False)
        self.lap("sources")

    def build(self) -> None:
        if not self.builds:
            return
        from hermetic.build.extension import build_env
        from hermetic.build.importcheck import ImportCheck
        from hermetic.build.variants import build_variants
        assert self.facts is not None and self.tc is not None
        if self.share is not None:  # objects fetched from the remote are stored under keys that name the host
            self.confirm_facts()
        # the check's interpreter imports torch while the compiles run, where the profile holds no wheels that
        # torch's import could read (they are laid out in step 7): importcheck.py
        self.import_check = ImportCheck(self.root, self.facts["executable"], self.root.profiles / self.name,
                                        build_env(self.root, self.tc.info))
        self.built = build_variants(self.root, self.store, self.recipe, self.variants, self.facts, self.tc,
                                    self.trees, self.reporter, self.counts, self.explain, self.share,
                                    on_compiles=None if self.unpacked else self.import_check.start,
                                    confirm=self.confirm_facts)
        self.report.update(self.built.report)
        if self.qualifying is not None:
            self.report["qualification"] = self.qualifying.record()
        self.lap("build")

    def materialize(self) -> None:
        self.reporter.event("phase", phase="materializing")
        assert self.python is not None
        exe = self.python.executable
        bin_files = launchers(self.store, [(u.entry, s) for u in self.unpacked for s in u.scripts], exe)
        self.files = merge_files([*((u.entry, with_shebangs(self.store, u.entry, u.files, u.shebangs, exe)
                                     if u.shebangs else u.files) for u in self.unpacked),
                                  ("the launchers for " + self.python.label, bin_files)])
        links = toolchain_links(self.recipe.toolchain, self.files) if self.recipe.toolchain and not self.builds \
            else {}
        self.refs = [entry_ref(u.entry) for u in self.unpacked]
        if self.built is not None:
            self.files.update({m.filename: (m.digest, False) for m in self.built.modules})
            self.refs += self.built.refs
        self.tree, self.tree_built = build_tree(self.store, self.name, self.files, links, refs=self.refs)
        self.profile = set_profile(self.root.profiles, self.name, self.store, self.tree)
        self.lap("materialize")

    def check(self) -> None:
        if self.built is None:
            return
        assert self.import_check is not None and self.profile == self.import_check.profile
        self.reporter.event("phase", phase="checking")
        # from the tree this process pinned, never through the profile gc --drop-root may remove
        self.report["import_check"] = self.import_check.run([m.module for m in self.built.modules], self.tree,
                                                            self.store.entry_path(self.tree) / "out")
        self.lap("check")
        self.report["schedule"]["import_check_s"] = self.timings["check"]

    def receipt(self) -> Outcome:
        self.counts["files"] = len(self.files)
        if self.share is not None:
            self.report["remote"] = self.share.summary()
            self.share.close()
        entries = sorted({self.tree, *split_refs(self.refs)[0]})
        changed = (self.built is not None and self.built.changed) or self.tree_built \
            or self.counts["fetched"] > 0 or self.counts["unpacked"] > 0
        tc = self.recipe.toolchain
        outcome = Outcome(self.name, self.recipe.path, self.profile, self.tree, entries, self.counts, self.timings,
                          changed=changed, python=self.recipe.python, archs=list(tc.archs) if tc else [],
                          cuda=tc.cuda if tc else None)
        self.reporter.event("phase", phase="receipt")
        outcome.changed |= write_root(self.root, self.name, self.recipe.path, entries)
        # the root and the profile together: a `gc --drop-root` that ran since step 7 removed both
        set_profile(self.root.profiles, self.name, self.store, self.tree)
        # its own receipt, even when it changed nothing: the latest one in the folder may be another
        # process's, which built what this one found built (a no-op returns the receipt its record names)
        self.report["sandbox"] = self.sandbox.record()
        say_refused(self.reporter, self.sandbox)
        say_bytecode_cleared(self.reporter)
        self.report["outside_root_audit"] = self.audit.finish(children=children_since(self.audit.started),
                                                              exclude=[self.lock_folder])
        # the realize's one duration, in its receipt as the command says it (writing the receipt not included)
        self.timings["total"] = round(time.monotonic() - self.started, 4)
        outcome.receipt = write_receipt(self.root, outcome, [*self.locks, *self.toolchain_locks()],
                                        [*self.unpacked, *self.toolchain_unpacked], self.report)
        host = [*_host_paths(self.report), *([Path(self.python.executable)] if self.python else [])]
        record_inputs(self.root, self.recipe.path, self.variant, self.recipe.inputs(), host, outcome)
        return outcome

    def toolchain_locks(self) -> list[Lock]:
        return [self.toolchain_lock] if self.toolchain_lock is not None else []


def children_since(started: float) -> list[tuple[float, float, str, bool]]:
    """Every child hermetic ran since ``started`` (for the audit): when, what, and whether in the sandbox."""
    return [(c.start, c.end, c.program, c.confined) for c in procs.SPANS if c.end >= started]


def chosen_variants(recipe: Recipe, variant: str | None) -> list[Variant]:
    if variant is None:
        return [v for v in recipe.variants if v.default]
    found = [v for v in recipe.variants if v.name == variant]
    if not found:
        raise BadInput(f"recipe {recipe.name} has no variant {variant!r}", where=str(recipe.path),
                       hint=f"variants: {', '.join(v.name for v in recipe.variants)}")
    return found


def _host_paths(report: dict[str, Any]) -> list[Path]:
    """The host's files a no-op trusts by fingerprint: the recipe's interpreter, torch, the compilers."""
    paths = []
    host = report.get("host")
    if host:
        paths.append(Path(host["executable"]))
        if host.get("torch"):
            paths.append(Path(host["torch"]["version_file"]))
    for cxx in report.get("toolchain", {}).get("host_compilers", {}).values():
        paths.append(Path(cxx["path"]))
    return paths


def open_sharing(store: Store, recipe: Recipe, options: RemoteOptions | None,
                 reporter: Reporter, offline: bool = False) -> Sharing | None:
    """The remote cache of the command line, else $HERMETIC_REMOTE_CACHE, else the recipe's [remote]; none
    ``offline`` (its settings still checked: bad ones are bad input either way)."""
    from hermetic.urls import remote_in_environment
    if options is None and not (recipe.remote_url or recipe.remote_mode or remote_in_environment()):
        return None
    from hermetic.remote.settings import resolve_settings
    settings = resolve_settings(options, os.environ, recipe.remote_url, recipe.remote_mode,
                                recipe.doc.where("remote") if recipe.remote_url or recipe.remote_mode else "")
    if settings is None:
        return None
    if offline:
        reporter.event("remote", f"offline: the remote cache {settings.url} is not used", offline=True)
        return None
    from hermetic.remote.bazel import BazelHttpCache
    from hermetic.remote.layout import Sharing
    reporter.event("remote", f"remote cache {settings.url} ({'read-write' if settings.writable else 'read-only'})",
                   **settings.record())
    return Sharing(BazelHttpCache(settings, reporter), store)
