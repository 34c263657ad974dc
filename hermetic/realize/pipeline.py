"""realize: a recipe into the store, as the steps of docs/builds.md.

    0. no-op      has anything changed? (``realize.noop``; the caller asks, once per command)
    1. validate   the recipe and its variants; the store and the remote cache opened; the sandbox every
                  child of the steps below runs in (hermetic.sandbox), or why there is none
    2. qualify    the recipe's interpreter (its tags, markers and scheme; torch too for a recipe that
                  builds) and the locks, evaluated for it. Torch's facts may be a guess from its files while
                  the probe imports it (extensions.host): confirmed before anything is recorded or any error
                  reported; a refuted guess starts the realize again
    3. fetch      every locked wheel not yet in the store, unpacked once
    4. toolchain  the CUDA toolchain's tree, checked against torch
    5. sources    the source trees of every variant, patched
    6. build      every extension of every variant: certified reuse, compiles, links, certificates
    7. materialize  the environment's tree (wheels, modules, launchers for the interpreter) and its profile
    8. check      the modules imported together in a fresh interpreter, no CUDA context
    9. receipt    the gc root, the receipt, the no-op record

``realize`` reads as that list: each step is a function that takes what it needs and returns what it made
(as pypa/installer's ``_core.install``); only ``Pending`` (what a failed realize must stop) and the step clock
change as it goes. A realize whose inputs have not changed stops at step 0: it fetches nothing, writes nothing in
the store and imports neither requests nor torch (this module is not even imported then).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hermetic import fs, procs
from hermetic.audit import OutsideRootAudit
from hermetic.config import Config, Setting
from hermetic.config import load as load_config
from hermetic.errors import BadInput, HermeticError
from hermetic.extensions.toolchain import toolchain_label, toolchain_links
from hermetic.interpreter import WHERE, Interpreter, interpreter
from hermetic.locks.cache import read_lock_cached
from hermetic.locks.types import Lock
from hermetic.realize.noop import Counts, ObjectCounts, Outcome, outside_inputs, record_inputs
from hermetic.realize.receipt import write_receipt
from hermetic.recipe import Recipe, Variant, load_recipe
from hermetic.reporter import Reporter
from hermetic.root import Root, lock_dir
from hermetic.sandbox import Sandbox, choose
from hermetic.store import Store, entry_ref, split_refs
from hermetic.store.records import FileMap
from hermetic.store.roots import describe_owner, owner_in_root, owner_unknown, read_root, root_owner, write_root
from hermetic.store.trees import build_tree, merge_files, set_profile
from hermetic.wheels.scripts import launchers, with_shebangs
from hermetic.wheels.unpacked import (
    Accepts,
    Unpacked,
    WheelTally,
    fetch_and_unpack,
    missing,
    offline_error,
    plan_wheels,
)

if TYPE_CHECKING:
    from hermetic.extensions.context import BuildContext
    from hermetic.extensions.host import Qualifying
    from hermetic.extensions.importcheck import ImportCheck
    from hermetic.extensions.variants import RecipeBuild
    from hermetic.remote.layout import Sharing
    from hermetic.remote.settings import RemoteOptions


class RealizeOptions(NamedTuple):
    """What the command line asks of a realize beyond the recipe."""
    variant: str | None = None              # --variant: that variant alone, else every default one
    explain: bool = False                   # --explain: every object's decision said (the caller skips step 0)
    remote: RemoteOptions | None = None     # --remote-cache and its mode
    offline: bool = False                   # nothing fetched: what would have to be is a failed precondition
    sandbox: str | None = None              # --sandbox, which wins over HERMETIC_SANDBOX and the recipe's
    jobs: int | None = None                 # -j/--jobs, which wins over HERMETIC_JOBS, MAX_JOBS and the recipe's
    config: Config | None = None            # the hermetic.toml files (default: the recipe's, hermetic.config.load)
    dist: str | None = None                 # --dist: a build cluster (extensions.dist), else HERMETIC_DIST


def realize(root: Root, recipe_path: Path, reporter: Reporter, options: RealizeOptions) -> Outcome:
    """Steps 1-9; the caller ran step 0 (``noop.noop_check``) unless it wants every step (``--explain``)."""
    from hermetic.extensions.host import GuessWrong
    try:
        return _attempt(root, recipe_path, reporter, options, guess=True)
    except GuessWrong as e:  # nothing was recorded with the guess: the probe's answer is cached now
        reporter.warn(f"{e}: realizing again with the probe's answer")
        return _attempt(root, recipe_path, reporter, options, guess=False)


def _attempt(root: Root, recipe_path: Path, reporter: Reporter, options: RealizeOptions, *,
             guess: bool) -> Outcome:
    config = options.config or load_config(Path(recipe_path).resolve().parent)
    options = options._replace(config=config)
    clock, audit = Clock(), start_audit(root, lock_dir(config.resolve("lock_dir").value))
    job = validate(root, recipe_path, reporter, options)                                     # 1
    pending = Pending()   # what a failed realize must stop: the host's probe, the import check's interpreter
    with job.sandbox.confined():
        try:
            qualified = qualify(root, job.recipe)                                            # 2
            host = pending.qualifying = start_host(root, job, guess=guess)
            clock.lap("qualify")
            fetched = fetch(job, qualified, reporter, options.offline)                       # 3
            clock.lap("fetch")
            ctx: BuildContext | None = None
            built: RecipeBuild | None = None
            if host is not None:
                ctx = build_context(root, job, fetched, host, reporter, options.dist)        # 4
                host.confirm(wait=False)   # where the probe has answered already
                clock.lap("toolchain")
                from hermetic.extensions.variants import prepare_sources
                trees = prepare_sources(ctx, job.variants, offline=options.offline)          # 5
                host.confirm(wait=False)
                clock.lap("sources")
                pending.import_check = import_check(ctx, job.name)
                built = build(ctx, job, trees, host, pending.import_check, early=not fetched.environment,
                              explain=options.explain)                                       # 6
                clock.lap("build")
            env = materialize(root, job, qualified, fetched, built, reporter)                # 7
            clock.lap("materialize")
            check_imports(pending.import_check, built, env, reporter, clock)                 # 8
            return finish(root, job, qualified, fetched, Built(ctx, built), env, Trail(audit, clock),
                          reporter)                                                          # 9
        except HermeticError:
            pending.confirm()   # an error found with guessed facts is said only once the probe confirms them
            raise
        finally:
            pending.cancel()


# the values the steps hand on ----------------------------------------------------------------------------
class Validated(NamedTuple):
    """Step 1: the recipe, what of it is realized and where."""
    recipe: Recipe
    variants: list[Variant]
    variant: str | None                 # as asked (--variant), for the no-op record's key
    name: str                           # the realized name: recipe, or recipe.variant
    store: Store
    share: Sharing | None               # the remote cache, where one is used
    sandbox: Sandbox
    lock_folder: Path
    jobs: Setting                       # the recipe's limits.jobs, and where the number came from
    config: Config                      # the hermetic.toml files that apply (the build cluster reads them)

    @property
    def builds(self) -> bool:
        return bool(self.recipe.extensions)


class Qualified(NamedTuple):
    """Step 2: the interpreter the environment is for, and the locks evaluated for it."""
    python: Interpreter
    locks: list[Lock]
    toolchain_locks: list[Lock]         # the toolchain's lock of a recipe that builds (none or one)


class Fetched(NamedTuple):
    """Step 3: every locked wheel as an unpacked entry, and what it took."""
    environment: list[Unpacked]
    toolchain: list[Unpacked]
    tally: WheelTally


class Built(NamedTuple):
    """Steps 4-6 of a recipe that builds (both None for one that does not)."""
    ctx: BuildContext | None
    build: RecipeBuild | None


class Materialized(NamedTuple):
    """Step 7: the environment's tree and its profile."""
    files: FileMap
    refs: list[str]
    tree: str
    tree_built: bool
    profile: Path
    folder: Path                        # the tree's files in the store (pinned by this process)


class Trail(NamedTuple):
    """What watched the whole realize: the outside-root audit and the step clock."""
    audit: OutsideRootAudit
    clock: Clock


class Pending:
    """What a failed realize must stop, and a failed one confirm before it says its error: the host's probe,
    the import check's interpreter (started early, beside the compiles)."""
    __slots__ = ("qualifying", "import_check")

    def __init__(self) -> None:
        self.qualifying: Qualifying | None = None
        self.import_check: ImportCheck | None = None

    def confirm(self) -> None:
        if self.qualifying is not None:
            self.qualifying.confirm()

    def cancel(self) -> None:
        if self.import_check is not None:  # started early and not needed: a failed build
            self.import_check.cancel()
        if self.qualifying is not None:
            self.qualifying.cancel()


class Clock:
    """The receipt's ``timings``: each step's seconds since the last lap (the first since the start, validate
    included), and the total."""
    __slots__ = ("started", "last", "timings")

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.timings: dict[str, float] = {}

    def lap(self, step: str) -> float:
        now = time.monotonic()
        self.timings[step] = round(now - self.last, 4)
        self.last = now
        return self.timings[step]

    def total(self) -> None:
        self.timings["total"] = round(time.monotonic() - self.started, 4)


# the steps -------------------------------------------------------------------------------------------------
def start_audit(root: Root, lock_folder: Path) -> OutsideRootAudit:
    """What children leave outside the root (the lock folder the settings chose watched as one)."""
    audit = OutsideRootAudit(root.path, lock_folders=[lock_folder])
    audit.start()
    return audit


def read_recipe(recipe_path: Path, variant: str | None) -> tuple[Recipe, list[Variant], str]:
    """The recipe, the variants realized (``variant``, else every default one) and the realized name."""
    recipe = load_recipe(recipe_path)
    variants = chosen_variants(recipe, variant)
    if recipe.extensions:
        from hermetic.extensions.variants import check_builds  # compilers' machinery only for recipes that build
        check_builds(recipe, variants)
    return recipe, variants, recipe.name if variant is None else f"{recipe.name}.{variant}"


class Settings(NamedTuple):
    """Every setting of a realize, checked (``check_settings``)."""
    jobs: Setting
    sandbox: Setting
    lock_folder: Path


def check_settings(recipe: Recipe, config: Config, options: RealizeOptions) -> Settings:
    """Every setting a realize takes, checked before the root is touched (a bad one is exit 2 naming the option,
    variable, or file and line): jobs, the sandbox's mode, the lock folder, the remote cache's URL and mode, the
    trusted keys' files and, for a recipe that builds, the build cluster. A realize, ``--check`` and
    ``--dry-run`` call it alike (docs/config.md), so the three say the same words."""
    limits = recipe.limits
    jobs = config.resolve("jobs", options.jobs, limits.jobs if limits.jobs_set else None,
                          recipe.doc.where("limits", "jobs"))
    mode = config.resolve("sandbox", options.sandbox, limits.sandbox,
                          recipe.doc.where("limits", "sandbox") if limits.sandbox else "")
    lock_folder = lock_dir(config.resolve("lock_dir").value)
    from hermetic.remote.settings import resolve_settings
    resolve_settings(options.remote, os.environ, recipe.remote_url, recipe.remote_mode,
                     recipe.doc.where("remote") if recipe.remote_url or recipe.remote_mode else "", config)
    from hermetic.store.provenance import load_trusted
    keys = config.resolve("trusted_keys")
    load_trusted(keys.value, keys.origin)   # a missing file, a folder, a FIFO: bad input now, not at the remote
    if recipe.extensions:
        from hermetic.extensions.dist import resolve_dist
        resolve_dist(options.dist, os.environ, recipe.remote_dist, recipe.doc.where("remote", "dist"), config)
    return Settings(jobs, mode, lock_folder)


def check_owner(root: Root, recipe: Recipe, variant: str | None, name: str) -> None:
    """The root ``name`` (and its profile) is this recipe's or variant's, or nobody's yet: recipe ``vx``'s variant
    ``b`` and a recipe named ``vx.b`` would replace each other's profile (exit 2, naming the one there)."""
    owner = owner_in_root(root, name)   # BadRecord (exit 2 naming the file) for a malformed root
    mine = root_owner(recipe.name, variant)
    if owner is None and (then := owner_unknown(root, name, recipe.path)) is not None:
        raise BadInput(f"the root {name} was written by an older hermetic for the recipe {then}, which is gone or "
                       f"unreadable: whether it is {describe_owner(mine)}'s cannot be told",
                       where=recipe.doc.where(*(("recipe", "name") if variant is None else ("variants", variant))),
                       hint=f"forget that root with `hermetic gc --drop-root {name}` (its entries stay until gc), "
                            f"then realize again")
    if owner is None or owner == mine:
        return
    try:
        made_by = str(read_root(root.roots / f"{name}.json")["recipe"])
    except OSError:
        made_by = "?"
    raise BadInput(f"the root {name} is {describe_owner(owner)} ({made_by}): realizing {describe_owner(mine)} "
                   f"would replace its profile {root.profiles / name}",
                   where=recipe.doc.where(*(("recipe", "name") if variant is None else ("variants", variant))),
                   hint=f"rename this recipe or variant, or forget the other with `hermetic gc --drop-root {name}`")


def validate(root: Root, recipe_path: Path, reporter: Reporter, options: RealizeOptions) -> Validated:
    recipe, variants, name = read_recipe(recipe_path, options.variant)
    config = options.config or load_config(recipe.path.parent)
    settings = check_settings(recipe, config, options)
    check_owner(root, recipe, options.variant, name)
    root.ensure()
    limits = recipe.limits
    for warning in limits.warnings:   # CPUs of [limits] cpus this machine lacks
        reporter.warn(warning)
    jobs, mode, lock_folder = settings
    recipe = replace(recipe, limits=replace(limits, jobs=jobs.value, jobs_set=jobs.level != "default"))
    sandbox = choose(root, mode.value, mode.origin, lock_folder,
                     network=_cluster_needs_network(options, recipe, config), domain=f"recipe-{recipe.name}",
                     build=recipe.name if recipe.extensions else None)
    say_sandbox(reporter, sandbox, f"realizing {name}")
    store = Store(root.store).open()
    share = open_sharing(store, recipe, options.remote, reporter, options.offline, config)
    return Validated(recipe, variants, options.variant, name, store, share, sandbox, lock_folder, jobs, config)


def _cluster_needs_network(options: RealizeOptions, recipe: Recipe, config: Config) -> str:
    """Why the build's children keep the machine's network: a build cluster compiles (extensions/dist.py:
    sccache talks to its scheduler), as ``resolve_dist`` chooses it (one a repository chose and the user did not
    name is not used); "" where none is, and the sandbox takes the network from them (--unshare-net)."""
    if not recipe.extensions:
        return ""
    from hermetic.extensions.dist import resolve_dist
    cluster = resolve_dist(options.dist, os.environ, recipe.remote_dist, recipe.doc.where("remote", "dist"), config)
    return "" if cluster is None or cluster.withheld else "a build cluster compiles (its client talks to the " \
                                                          "scheduler)"


def qualify(root: Root, recipe: Recipe) -> Qualified:
    """The recipe's interpreter, and its locks evaluated for it (the toolchain's apart, for one that builds)."""
    python = interpreter(root, recipe.python, recipe.doc.where("recipe", "python") if recipe.python else WHERE)
    cache = root.cache("locks")
    tc_lock = recipe.toolchain_lock if recipe.extensions else None
    locks = [read_lock_cached(cache, p, python) for p in recipe.locks if p != tc_lock]
    return Qualified(python, locks, [read_lock_cached(cache, tc_lock, python)] if tc_lock is not None else [])


def start_host(root: Root, job: Validated, *, guess: bool) -> Qualifying | None:
    """The host's facts of a recipe that builds: cached, probed, or guessed while the probe runs (extensions.host)."""
    if not job.builds:
        return None
    from hermetic.extensions.host import start_qualify
    recipe = job.recipe
    return start_qualify(root, recipe.python, guess=guess,
                         where=recipe.doc.where("recipe", "python") if recipe.python else WHERE)


def fetch(job: Validated, qualified: Qualified, reporter: Reporter, offline: bool) -> Fetched:
    """Step 3: the wheels planned (what the store has, what it lacks), then the plan executed."""
    accepts = Accepts(qualified.python.tags)
    env_steps = plan_wheels(job.store, qualified.locks, accepts, "environment")
    tc_steps = plan_wheels(job.store, qualified.toolchain_locks, accepts, "toolchain")
    if offline and (lacking := missing([*env_steps, *tc_steps])):
        raise offline_error(lacking)  # every missing wheel of every lock named at once, before any work
    env, tally = fetch_and_unpack(job.store, env_steps, reporter, job.share, accepts, offline=offline)
    tc: list[Unpacked] = []
    if tc_steps:
        tc, tc_tally = fetch_and_unpack(job.store, tc_steps, reporter, job.share, accepts, offline=offline)
        tally += tc_tally
    return Fetched(env, tc, tally)


def build_context(root: Root, job: Validated, fetched: Fetched, host: Qualifying, reporter: Reporter,
                  dist: str | None = None) -> BuildContext:
    """Step 4: the toolchain prepared, and with it what every later step of the build reads."""
    from hermetic.extensions.context import BuildContext
    from hermetic.extensions.dist import resolve_dist
    from hermetic.extensions.objects import InputHasher
    from hermetic.extensions.toolchain import prepare_toolchain
    toolchain = prepare_toolchain(root, job.store, job.recipe, fetched.toolchain, host.facts, reporter)
    # each input stat'ed once while planning (extensions.graph makes the hasher live before the first compile)
    cluster = resolve_dist(dist, os.environ, job.recipe.remote_dist, job.recipe.doc.where("remote", "dist"),
                           job.config)
    if cluster is not None and cluster.withheld:
        reporter.warn(cluster.withheld)
        cluster = None
    return BuildContext(root, job.store, job.recipe, host.facts, toolchain, reporter, job.share,
                        InputHasher(root, snapshot=True), cluster)


def import_check(ctx: BuildContext, name: str) -> ImportCheck:
    from hermetic.extensions.importcheck import ImportCheck
    return ImportCheck(ctx.root, ctx.host.executable, ctx.root.profiles / name, ctx.env)


def build(ctx: BuildContext, job: Validated, trees: Any, host: Qualifying, importer: ImportCheck, *,
          early: bool, explain: bool) -> RecipeBuild:
    """Step 6. The import check's interpreter imports torch while the compiles run, where the profile holds no
    wheels that torch's import could read (``early``: they are laid out in step 7; importcheck.py)."""
    from hermetic.extensions.variants import build_variants
    if ctx.share is not None:  # objects fetched from the remote are stored under keys that name the host
        host.confirm()
    built = build_variants(ctx, job.variants, trees, explain=explain, on_compiles=importer.start if early else None,
                           confirm=host.confirm)
    built.report["qualification"] = host.record()
    return built


def materialize(root: Root, job: Validated, qualified: Qualified, fetched: Fetched, built: RecipeBuild | None,
                reporter: Reporter) -> Materialized:
    reporter.event("phase", phase="materializing")
    python = qualified.python
    exe = python.executable
    unpacked = fetched.environment
    store = job.store
    bin_files = launchers(store, [(u.entry, s) for u in unpacked for s in u.scripts], exe)
    files = merge_files([*((u.entry, with_shebangs(store, u.entry, u.files, u.shebangs, exe)
                           if u.shebangs else u.files) for u in unpacked),
                         ("the launchers for " + python.label, bin_files)])
    links = toolchain_links(job.recipe.toolchain, files) if job.recipe.toolchain and not job.builds else {}
    refs = [entry_ref(u.entry) for u in unpacked]
    if built is not None:
        files.update(built.package_files)   # the sdist's Python packages, the modules beside them (variants.py)
        files.update({m.filename: (m.digest, False) for m in built.modules})
        refs += built.refs
    tree, tree_built = build_tree(store, job.name, files, links, refs=refs)
    # the profile is only named here: `finish` points it at the tree under the name's lock, after the owner check
    # (set here, a realize refused there had already replaced another recipe's profile: attack47's re-attack B4)
    return Materialized(files, refs, tree, tree_built, root.profiles / job.name, store.entry_path(tree) / "out")


def check_imports(check: ImportCheck | None, built: RecipeBuild | None, env: Materialized, reporter: Reporter,
                  clock: Clock) -> None:
    """Step 8: the modules built, imported together from the tree this process pinned (never through the
    profile, which `gc --drop-root` may remove); its seconds in the build's schedule too."""
    if built is None:
        return
    assert check is not None and env.profile == check.profile
    reporter.event("phase", phase="checking")
    built.report["import_check"] = check.run(
        [*(m.module for m in built.modules if m.python_module), *built.package_imports], env.tree, env.folder,
        tuple(m.filename for m in built.modules if not m.python_module))
    built.report["schedule"]["import_check_s"] = clock.lap("check")


def finish(root: Root, job: Validated, qualified: Qualified, fetched: Fetched, built: Built, env: Materialized,
           trail: Trail, reporter: Reporter) -> Outcome:
    """Step 9: the gc root, the receipt (its own, even when nothing changed: the latest one in the folder may be
    another process's, which built what this one found built), the no-op record."""
    t, b = fetched.tally, built.build
    counts = Counts(t.wheels, t.fetched, t.fetched_bytes, t.unpacked, t.reused, len(env.files),
                    ObjectCounts.from_decisions(b.decisions) if b is not None else None,
                    b.linked if b is not None else None)
    report: dict[str, Any] = {"interpreter": qualified.python.summary(), **(b.report if b is not None else {})}
    if job.share is not None:
        report["remote"] = job.share.summary()
        job.share.close()
    entries = sorted({env.tree, *split_refs(env.refs)[0]})
    changed = (b is not None and b.changed) or env.tree_built or t.fetched > 0 or t.unpacked > 0
    tc = job.recipe.toolchain
    outcome = Outcome(job.name, job.recipe.path, env.profile, env.tree, entries, counts, trail.clock.timings,
                      changed=changed, python=job.recipe.python, archs=list(tc.archs) if tc else [],
                      cuda=tc.cuda if tc else None)
    reporter.event("phase", phase="receipt")
    # the owner checked again under the name's lock: another recipe of this name realized meanwhile (attack47)
    with fs.FileLock(job.store.locks / f"root-{job.name}.lock", what=f"the gc root {job.name}"):
        check_owner(root, job.recipe, job.variant, job.name)
        owner = root_owner(job.recipe.name, job.variant)
        outcome.changed |= write_root(root, job.name, job.recipe.path, entries, owner)
        # the root and the profile together: a `gc --drop-root` that ran since step 7 removed both (and the
        # toolchain's profile of a recipe that builds, since step 4)
        set_profile(root.profiles, job.name, job.store, env.tree)
        if built.ctx is not None:
            from hermetic.extensions.toolchain import point_toolchain_profile
            point_toolchain_profile(root, job.store, job.recipe, built.ctx.toolchain.id["cuda"])
    report["sandbox"] = job.sandbox.record()
    # the number the build ran with (the recipe's limits, as validate set them), and which place gave it
    report["jobs"] = {"value": job.recipe.limits.jobs, "level": job.jobs.level, "from": job.jobs.origin}
    say_refused(reporter, job.sandbox)
    say_bytecode_cleared(reporter)
    report["outside_root_audit"] = trail.audit.finish(children=children_since(trail.audit.started),
                                                      exclude=[job.lock_folder])
    trail.clock.total()   # the realize's one duration, as the command says it (writing the receipt not included)
    outcome.receipt = write_receipt(root, outcome, [*qualified.locks, *qualified.toolchain_locks],
                                    [*fetched.environment, *fetched.toolchain], report)
    # the toolchain's profile (prepare_toolchain's) is one more link a no-op must find as this realize left it
    links = [toolchain_label(job.recipe)] if job.builds else []
    objects = [p for m in (b.modules if b is not None else []) for d in m.choices if d.record is not None
               for p, _mode, _h in d.record["inputs"]]
    record_inputs(root, job.recipe.path, job.variant, job.recipe.inputs(),
                  [*host_paths(built.ctx), Path(qualified.python.executable), *outside_inputs(root, objects)],
                  outcome, links)
    return outcome


def host_paths(ctx: BuildContext | None) -> list[Path]:
    """The host's files a no-op trusts by fingerprint beside the recipe's interpreter: torch's, the compilers'."""
    if ctx is None:
        return []
    torch = ctx.host.torch
    return [Path(ctx.host.executable), *([Path(torch.version_file)] if torch else []),
            *(Path(cxx["path"]) for cxx in ctx.toolchain.compilers.values())]


# said and shared with `hermetic run` and `verify --rebuild-sample` ------------------------------------------
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
        reporter.warn(f"{r.program} said the sandbox refused it a write to {r.path} (it carried on): {r.line.strip()}",
                      path=r.path)


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


def open_sharing(store: Store, recipe: Recipe, options: RemoteOptions | None,
                 reporter: Reporter, offline: bool = False, config: Config | None = None) -> Sharing | None:
    """The remote cache of the command line, else $HERMETIC_REMOTE_CACHE, else the recipe's [remote], else a
    hermetic.toml's; none ``offline`` (its settings still checked: bad ones are bad input either way)."""
    from hermetic.urls import remote_in_environment
    config = config or Config([])
    if options is None and not (recipe.remote_url or recipe.remote_mode or remote_in_environment()
                                or config.resolve("remote.url").value):
        return None
    from hermetic.remote.settings import resolve_settings
    settings = resolve_settings(options, os.environ, recipe.remote_url, recipe.remote_mode,
                                recipe.doc.where("remote") if recipe.remote_url or recipe.remote_mode else "",
                                config)
    if settings is None:
        return None
    for note in settings.notes:
        reporter.warn(note)
    if offline:
        reporter.event("remote", f"offline: the remote cache {settings.url} is not used", offline=True)
        return None
    from hermetic.remote.bazel import open_storage
    from hermetic.remote.layout import Sharing
    reporter.event("remote", f"remote cache {settings.url} ({'read-write' if settings.writable else 'read-only'})",
                   **settings.record())
    from hermetic.store.provenance import load_trusted
    keys = config.resolve("trusted_keys")
    return Sharing(open_storage(settings, reporter), store, trusted=load_trusted(keys.value, keys.origin))
