"""One function per CLI command: parse nothing, print through the reporter, return the exit code; ``COMMANDS``
maps each command's name to its function. The pipelines are imported inside the functions, so a command
pays only for what it runs (a no-op realize imports neither the build nor requests)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hermetic.errors import BadInput, PreconditionFailed
from hermetic.reporter import Reporter, plural, process_seconds
from hermetic.root import Root
from hermetic.store import Store, list_names
from hermetic.urls import remote_in_environment

if TYPE_CHECKING:
    from hermetic.config import Config
    from hermetic.realize.pipeline import RealizeOptions
    from hermetic.remote.settings import RemoteOptions


def _remote(args: argparse.Namespace) -> RemoteOptions | None:
    """The command line's remote cache options, checked now (bad input even when nothing else changed);
    None when neither the command line nor the environment names one (a recipe's [remote] still may)."""
    if args.remote_cache is None and args.remote_cache_mode is None and not remote_in_environment():
        return None
    from hermetic.remote.settings import RemoteOptions, resolve_settings
    options = RemoteOptions(args.remote_cache, args.remote_cache_mode)
    resolve_settings(options, os.environ)
    return options


def cmd_realize(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    remote = _remote(args)
    if args.dry_run and args.check:
        raise BadInput("--dry-run and --check exclude each other", where="the command line",
                       hint="--dry-run prints the plan and exits 0; --check exits 4 when there is work to do")
    if args.dist is not None or os.environ.get("HERMETIC_DIST"):  # bad input now, before any work
        from hermetic.extensions.dist import resolve_dist
        resolve_dist(args.dist, os.environ, None)
    if args.check:   # the common answer first, as cheaply as a no-op realize: nothing to do, nothing imported
        from dataclasses import replace

        from hermetic.realize.noop import noop_check
        done = noop_check(replace(root, read_only=True), args.recipe, args.variant)
        if done is not None:
            reporter.data("check", f"check: {done.name} is up to date")
            reporter.result("realize", True, 0, recipe=done.name, profile=str(done.profile), tree=done.tree,
                            changed=False, check=True, counts=done.counts.to_json())
            return 0
    if args.dry_run or args.check:
        from hermetic.realize.dryrun import check, dry_run
        from hermetic.realize.pipeline import RealizeOptions
        return (check if args.check else dry_run)(root, args.recipe, reporter,
                                                  RealizeOptions(args.variant, False, remote, args.offline,
                                                                 args.sandbox, args.jobs, dist=args.dist))
    from hermetic.realize.noop import noop_check
    outcome = None if args.explain else noop_check(root, args.recipe, args.variant)
    if outcome is None:  # only now pay for importing the pipeline
        from hermetic.realize.pipeline import RealizeOptions, realize
        outcome = realize(root, args.recipe, reporter,
                          RealizeOptions(args.variant, args.explain, remote, args.offline, args.sandbox, args.jobs,
                                         dist=args.dist))
        reporter.debug("timings", "; ".join(f"{step} {s:.3f} s" for step, s in outcome.timings.items()),
                       timings=outcome.timings)
    else:
        reporter.detail("noop", f"{outcome.name}: no input changed since its last realize (recorded fingerprints "
                                "and hashes): nothing fetched, compiled or written")
    verb = "realized" if outcome.changed else "up to date:"
    # one duration: the receipt's total for a realize that ran its steps; a no-op's, this command's own
    seconds = outcome.timings.get("total", process_seconds())
    reporter.event("done", f"{verb} {outcome.name} -> {outcome.profile} ({outcome.counts.say()}"
                           + (f"; {seconds:.1f} s)" if seconds is not None else ")"))
    reporter.result("realize", True, 0, recipe=outcome.name, profile=str(outcome.profile),
                    tree=outcome.tree, changed=outcome.changed, counts=outcome.counts.to_json(),
                    timings=outcome.timings,
                    receipt=str(outcome.receipt) if outcome.receipt else None)
    return 0


# a root's name is a recipe's (and a variant's) name: the characters of an entry's name, never a path
_ROOT_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
ROOT_NAME_MAX = 200


def check_root_name(name: str, where: str) -> None:
    """A root name given on the command line (``gc --drop-root NAME``): letters, digits, '.', '_' and '-', not
    '.' or '..'; anything else (a path, above all) is bad input (exit 2), so that it never names a file
    outside roots/ and profiles/."""
    if not name or len(name) > ROOT_NAME_MAX or not set(name) <= _ROOT_NAME_CHARS or name in (".", ".."):
        raise BadInput(f"{name!r} is not a root's name", where=where,
                       hint="a root is named by its recipe (and variant: NAME.VARIANT): letters, digits, '.', '_' "
                            "and '-'; `hermetic show` lists the roots")


def cmd_gc(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    from hermetic.store import gc
    for name in args.drop_root:
        check_root_name(name, "--drop-root")
    if args.all:
        if args.dry_run:
            gc.check_remove_all(root)
            reporter.event("gc", f"would remove the whole scratch root {root.path}")
            reporter.result("gc", True, 0, all=True, dry_run=True, root=str(root.path))
            return 0
        from hermetic.sandbox import live_once_homes
        if live := live_once_homes(root):   # a `recipe new` holds no temp root: its home says it lives
            raise PreconditionFailed(f"another hermetic command is running in this scratch root (its home {live[0]})",
                                     where=str(root.path), hint="wait for it to finish, then retry")
        freed = gc.remove_all(root)
        reporter.event("gc", f"removed {root.path} ({freed} bytes freed)")
        reporter.result("gc", True, 0, all=True, freed_bytes=freed)
        return 0
    p, freed = gc.collect(root, dry_run=args.dry_run, dropped=set(args.drop_root),
                          on_wait=lambda what: reporter.event("gc", f"waiting for {what} to end (a realize of it "
                                                                    f"is compiling; its toolchain's profile is "
                                                                    f"dropped after it)"))
    if not args.dry_run:
        from hermetic.root import sweep_outside_scratch
        for left in sweep_outside_scratch():   # a dry run killed with kill -9 left its folder outside the root
            reporter.event("gc", f"removed {left}, left by a dry run that was killed", removed=str(left))
        from hermetic.sandbox import sweep_once_homes
        for left in sweep_once_homes(root):   # a sandboxed command killed with kill -9 left its fresh home
            reporter.event("gc", f"removed {left}, the home of a command that was killed", removed=str(left))
    verb = "would delete" if args.dry_run else "deleted"
    for name in p.dead_entries:  # the listing: stdout
        reporter.data("gc-entry", f"{verb} entry {name}", entry=name)
    for name, why in sorted(p.damaged.items()):
        reporter.warn(f"{why}: what it references cannot be known, so gc deleted no blob"
                      + (f" and kept {len(p.kept_unprovable)} unreached entries it may name" if p.kept_unprovable
                         else "") + "; run `hermetic verify --repair`, then gc again", entry=name)
    reporter.event("gc", f"{verb} {len(p.dead_entries)} entries and {len(p.dead_blobs)} blobs; "
                         f"{freed} bytes {'would be ' if args.dry_run else ''}freed; "
                         f"{len(p.live_entries)} entries live")
    reporter.result("gc", True, 0, dry_run=args.dry_run, dead_entries=p.dead_entries,
                    dead_blobs=len(p.dead_blobs), freed_bytes=freed, live_entries=len(p.live_entries),
                    damaged=sorted(p.damaged), kept_unprovable=p.kept_unprovable,
                    blobs_unprovable=p.blobs_unprovable, dropped=p.dropped)
    return 0


def cmd_verify(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    from hermetic.store import layout_problems
    from hermetic.store.verify import repair, verify
    store = Store(root.store)
    if not store.exists() and not layout_problems(root, store):
        reporter.event("verify", f"no store at {root.store}: nothing to verify")
        reporter.result("verify", True, 0, blobs=0, entries=0, problems=[])
        return 0
    root.refuse_unmarked("verify --repair" if args.repair else "verify")   # never a folder of someone's files
    if store.exists():
        store.open(check=False)   # a folder of the store's own that is no folder is what verify reports
    report = verify(store, root)
    for p in report.warnings:
        reporter.warn(p.what, path=p.name)
    for p in report.problems:
        reporter.event("problem", f"{p.kind} {p.name}: {p.what}", kind=p.kind, name=p.name, what=p.what)
    left: list[str] = []
    if report.problems and args.repair:
        done = repair(store, root, report)
        if done.healed:   # a folder made again: what its pass saw in it, or through a link there, is gone
            more = repair(store, root, verify(store, root))
            done.removed += more.removed
            done.in_use += more.in_use
            done.changed += more.changed
        left = done.in_use + done.changed
        for item in done.in_use:
            reporter.warn(f"{item}: in use by another hermetic process: not removed", item=item)
        for item in done.changed:
            reporter.warn(f"{item}: changed since verify looked at it (written again meanwhile): not removed",
                          item=item)
        reporter.event("repair", (f"made {plural(len(done.healed), 'folders')} of hermetic's own again; "
                                  if done.healed else "")
                       + f"removed {len(done.removed)} corrupt items; realizing the roots again")
        from hermetic.realize.pipeline import RealizeOptions
        _realize_roots(root, reporter, RealizeOptions(remote=_remote(args), offline=args.offline,
                                                      sandbox=args.sandbox, jobs=args.jobs))
        report = verify(store, root)
    rebuilt = []
    if args.rebuild_sample > 0:
        from hermetic.config import load
        from hermetic.extensions.rebuild import rebuild_sample
        from hermetic.realize.pipeline import say_refused, say_sandbox
        from hermetic.root import lock_dir
        from hermetic.sandbox import choose
        config = load()
        mode = config.resolve("sandbox", args.sandbox)
        sandbox = choose(root, mode.value, mode.origin, lock_dir(config.resolve("lock_dir").value),
                         build="")   # the recorded commands write where they wrote (a depfile in build/)
        say_sandbox(reporter, sandbox, "the rebuilt sample")
        with sandbox.confined():
            rebuilt = rebuild_sample(root, store, args.rebuild_sample)
        say_refused(reporter, sandbox)
        for r in rebuilt:
            reporter.event("rebuild", f"{r.outcome}: {r.source} ({r.entry})" + (f": {r.detail}" if r.detail else ""),
                           entry=r.entry, source=r.source, outcome=r.outcome, detail=r.detail)
    mismatches = [r for r in rebuilt if r.outcome == "mismatch"]
    ok = not report.problems and not mismatches
    reporter.event("verify", f"{report.blobs} blobs ({report.bytes} bytes), {report.entries} entries: "
                             + ("all valid" if not report.problems else f"{len(report.problems)} problems")
                             + (f"; rebuilt {len(rebuilt)} objects: {len(mismatches)} mismatches" if rebuilt else ""))
    reporter.result("verify", ok, 0 if ok else 1, blobs=report.blobs, entries=report.entries,
                    problems=[p.__dict__ for p in report.problems], not_removed=left,
                    strays=[p.name for p in report.warnings], rebuilt=[r.__dict__ for r in rebuilt])
    return 0 if ok else 1


def _realize_roots(root: Root, reporter: Reporter, options: RealizeOptions) -> None:
    from hermetic.errors import BadRecord
    from hermetic.realize.pipeline import realize
    from hermetic.store.roots import read_root, root_files
    for p in root_files(root.roots):
        try:
            record = read_root(p)
        except (FileNotFoundError, BadRecord):
            continue  # dropped meanwhile, or a bad root repair could not remove: verify says so again
        recipe = Path(record["recipe"])
        if "imported_from" in record:   # the exporter's path: no realize here wrote it, nobody vouches for it
            reporter.warn(f"root {p.stem} came from an archive ({record['imported_from']}): its recipe path "
                          f"{recipe} is the exporter's, so repair does not realize it; realize its recipe yourself "
                          f"(hermetic realize RECIPE), which makes the root this machine's", root=p.stem,
                          archive=record["imported_from"])
        elif recipe.is_file():
            realize(root, recipe, reporter, options)
        else:
            reporter.warn(f"root {p.stem}: its recipe {recipe} is gone; cannot rebuild it")


def cmd_show(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    """What the root holds, read without a lock and with lstat only: what vanishes while it is read is skipped,
    a bad record or a stray is said and counted, never fatal (docs/layout.md, "A bad record")."""
    from hermetic.store import layout_problems
    store = Store(root.store)
    info: dict[str, object] = {"root": str(root.path), "store": store.exists()}
    folders = layout_problems(root, store, readable=True)
    for path, what in folders:
        reporter.warn(f"{path} is {what} where hermetic's own folder belongs: run `hermetic verify --repair`",
                      path=str(path))
    info["bad_folders"] = [str(p) for p, _w in folders]
    if store.exists():
        from hermetic.errors import BadRecord
        from hermetic.store.roots import read_receipt, read_root, root_files
        entries, entry_strays = store.scan_entries()
        blobs, blob_strays = store.scan_blobs()
        size = sum(st.st_size for _d, _x, _p, st in blobs)
        bad: list[str] = []
        roots = []
        for p in root_files(root.roots):
            try:
                read_root(p)
                roots.append(p.stem)
            except FileNotFoundError:
                continue
            except BadRecord as e:
                reporter.warn(e.render()[len("error: "):], path=str(p))
                bad.append(str(p))
        receipts = []
        for p in root_files(root.receipts):
            try:
                read_receipt(p)
                receipts.append(p)
            except FileNotFoundError:
                continue
            except BadRecord as e:
                reporter.warn(e.render()[len("error: "):], path=str(p))
                bad.append(str(p))
        receipts = receipts[-5:]
        profiles = {}
        for name in list_names(root.profiles):
            link = root.profiles / name
            try:
                profiles[name] = os.readlink(link)
            except FileNotFoundError:
                continue
            except OSError:  # not a link: a bad profile
                reporter.warn(f"{link}: the profile is not a link to an entry; run `hermetic verify --repair`",
                              path=str(link))
                bad.append(str(link))
        strays = [str(s.path) for s in (*entry_strays, *blob_strays)]
        info.update(entries=len(entries), blobs=len(blobs), blob_bytes=size, roots=roots,
                    profiles=profiles, last_receipts=[str(r) for r in receipts], strays=strays, bad_records=bad)
        # the listing is data: stdout (`hermetic show | cat`)
        reporter.data("show", f"scratch root {root.path}\n  {len(entries)} entries, {len(blobs)} blobs "
                              f"({size / 1e6:.1f} MB)" + (f", {len(strays)} strays" if strays else "")
                              + f"\n  roots: {', '.join(roots) or '-'}"
                              + "".join(f"\n  profile {k} -> {v}" for k, v in profiles.items())
                              + "".join(f"\n  receipt {r.name}" for r in receipts)
                              + (f"\n  bad records: {len(bad)} (hermetic verify --repair)" if bad else "")
                              + (f"\n  folders that are no folder: {len(folders)} (hermetic verify --repair)"
                                 if folders else ""))
    else:
        reporter.data("show", f"scratch root {root.path}: no store yet")
    reporter.result("show", True, 0, **info)
    return 0


def cmd_env(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    from hermetic.realize.env import realized_env
    from hermetic.store import inherit_pins
    cmd = list(args.cmd)
    env, exported = realized_env(root, args.recipe, pinned=bool(cmd))
    if cmd:
        sys.stdout.flush()
        # the command runs in this process: its temp root's lock goes with it, so gc spares the trees it
        # uses until it exits (docs/layout.md, "Who holds what")
        inherit_pins()
        try:
            os.execvpe(cmd[0], cmd, env)
        except OSError as e:
            raise BadInput(f"cannot run {cmd[0]}: {e.strerror}", where="hermetic env",
                           hint="the command is looked up on the realized PATH") from None
    if reporter.json_mode:
        for k, v in exported.items():
            reporter.event("env", "", name=k, value=v)
    else:  # shell syntax on stdout: eval "$(hermetic env RECIPE)"
        for k, v in exported.items():
            print(f"export {k}={_shell_quote(v)}")
    reporter.result("env", True, 0, env=exported)
    return 0


def _shell_quote(v: str) -> str:
    import shlex
    return shlex.quote(v)


def cmd_export(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    from hermetic.store.archive import export_closure
    if os.path.isdir(args.archive):   # said now, by the name the user gave (not the temp file's beside it)
        raise BadInput(f"the output {args.archive} is a folder: export writes one archive file",
                       where=str(args.archive), hint=f"name a file, e.g. {Path(args.archive) / 'closure.tar.zst'}")
    stats = export_closure(root, args.archive, names=args.name, reporter=reporter, level=args.level,
                           sign=args.sign)
    reporter.event("export", f"wrote {args.archive}: {stats['entries']} entries, {stats['blobs']} blobs, "
                             f"{stats['bytes']} bytes -> {stats['archive_bytes']} compressed"
                             + (f"; signed by {stats['signed_by']}" if stats["signed_by"] else ""))
    reporter.result("export", True, 0, archive=str(args.archive), **stats)
    return 0


def cmd_import(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    from hermetic.config import load
    from hermetic.extensions.host import qualify
    from hermetic.store.archive import import_closure
    from hermetic.store.provenance import load_trusted
    keys = load().resolve("trusted_keys")
    stats = import_closure(root, args.archive, reporter=reporter,
                           host=lambda: qualify(root, None, need_torch=False).record(),
                           trust_unsigned=args.trust_unsigned, trusted=load_trusted(keys.value, keys.origin))
    left = stats["left_out"]
    if left:
        why = (f"signed by {stats['signed_by']}, a key HERMETIC_TRUSTED_KEYS does not name" if stats["signed_by"]
               else "signed by no key")
        reporter.warn(f"{args.archive.name} is {why}: left out {len(left)} records that cannot be re-derived "
                      f"(objects, modules, unpacked wheels, source trees: {', '.join(left[:3])}"
                      f"{', ...' if len(left) > 3 else ''}); realize builds or fetches them. Trust its signer's "
                      "public key (HERMETIC_TRUSTED_KEYS) or pass --trust-unsigned to take them")
    elif stats["trust_unsigned"]:
        reporter.warn(f"{args.archive.name}: records no trusted key vouches for were taken (--trust-unsigned, "
                      "recorded in the import's receipt)")
    reporter.event("import", f"imported {stats['entries']} entries and {stats['blobs']} blobs "
                             f"({stats['new_blobs']} new) from {args.archive}"
                             + (f"; vouched for by {stats['vouched_by']}" if stats["vouched_by"] else ""))
    reporter.result("import", True, 0, archive=str(args.archive), **stats)
    return 0


def cmd_run(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    from hermetic.run.pipeline import RunOptions, run
    out = run(root, args.runner, reporter,
              RunOptions(args.device, args.gpu, args.peer, args.repetitions, args.power_cap, args.lock_timeout,
                         args.states, args.record_digests, _remote(args), args.offline, args.sandbox, args.jobs))
    body = out.summary
    if out.exit_code:
        reporter.event("run-failed", f"run {out.name} FAILED: {body.get('reason') or 'a check failed'}; "
                                     f"results in {out.run_dir}, receipt {out.receipt}")
    else:
        reporter.event("done", f"run {out.name}: checks passed; report {out.run_dir / 'report.md'}; "
                               f"receipt {out.receipt}")
    reporter.result("run", out.exit_code == 0, out.exit_code, runner=out.name, run_dir=str(out.run_dir),
                    receipt=str(out.receipt), status=body.get("status"), checks=body.get("checks"),
                    flags=body.get("flags"), summary=body.get("summary"))
    return out.exit_code


def cmd_key(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    """``key generate PATH``: a new key pair (the secret key at PATH, 0600; the public one at PATH.pub)."""
    from hermetic.store.provenance import generate
    secret, public = generate(args.path, args.name)
    reporter.event("key", f"wrote the secret key {secret} (keep it to the signer) and the public key {public} "
                          "(name it in HERMETIC_TRUSTED_KEYS where archives and cache entries it signs are trusted)")
    reporter.result("key", True, 0, secret=str(secret), public=str(public))
    return 0


def cmd_config(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    """Each setting, its value and where it came from (as ``pip config debug``): the files looked at first, then
    a line per setting. Reads and writes nothing of the root."""
    from hermetic.config import SETTINGS, load
    from hermetic.urls import redact
    files: dict[str, tuple[object, str]] = {}
    start = None
    if args.recipe is not None and _is_runner(args.recipe):
        from hermetic.run.spec import load_runner
        runner = load_runner(args.recipe)
        start = args.recipe.resolve().parent
        for kind in ("gpu", "cpu"):   # a GPU run's settings first: the lock folder is a GPU run's alone
            spec = runner.device(kind)
            if kind == "gpu" and spec.lock_dir:
                files["lock_dir"] = (spec.lock_dir, runner.doc.where("gpu", "lock_dir"))
            if spec.sandbox and "sandbox" not in files:
                files["sandbox"] = (spec.sandbox, runner.doc.where(kind, "sandbox"))
    elif args.recipe is not None:
        from hermetic.recipe import load_recipe
        recipe = load_recipe(args.recipe)
        start = recipe.path.parent
        lim, doc = recipe.limits, recipe.doc
        if lim.jobs_set:
            files["jobs"] = (lim.jobs, doc.where("limits", "jobs"))
        if lim.sandbox:
            files["sandbox"] = (lim.sandbox, doc.where("limits", "sandbox"))
        if recipe.remote_url:
            files["remote.url"] = (recipe.remote_url, doc.where("remote", "url"))
        if recipe.remote_mode:
            files["remote.mode"] = (recipe.remote_mode, doc.where("remote", "mode"))
        if recipe.remote_dist:
            files["dist"] = (recipe.remote_dist, doc.where("remote", "dist"))
    config = load(start)
    _check_shown(args, config, files)
    table = config.table({"jobs": args.jobs, "sandbox": args.sandbox, "remote.url": args.remote_cache,
                          "remote.mode": args.remote_cache_mode, "dist": args.dist}, files)
    config.check_machines_lock_dir(next(s for s in table if s.key == "lock_dir"))
    lines = [f"{layer.level} {layer.path}" + ("" if layer.found else " (not found)") for layer in config.layers]
    width = max(len(k) for k in SETTINGS)
    for s in table:
        value = "-" if s.value is None else redact(s.value) if s.key == "remote.url" else s.value
        origin = f"default: {SETTINGS[s.key].default_text}" if s.level == "default" else f"{s.level}: {s.origin}"
        lines.append(f"{s.key:<{width}}  {value}  ({origin})")
        reporter.event("setting", "", **{**s.record(), "value": value if s.value is not None else None})
    if not reporter.json_mode:
        reporter.data("config", "\n".join(lines))
    reporter.result("config", True, 0, files=[{"level": layer.level, "path": str(layer.path), "found": layer.found}
                                              for layer in config.layers],
                    settings={s.key: {"value": s.value if s.key != "remote.url" or s.value is None
                                      else redact(s.value), "level": s.level, "origin": s.origin} for s in table})
    return 0


def _check_shown(args: argparse.Namespace, config: Config, files: dict[str, tuple[object, str]]) -> None:
    """What `hermetic config` shows, checked as a realize checks it (bad input: exit 2 naming the file, line and
    key): the remote cache's URL and mode (hermetic.remote.settings) and the trusted keys' files."""
    from hermetic.remote.settings import RemoteOptions, resolve_settings
    from hermetic.store.provenance import load_trusted
    url, url_where = files.get("remote.url", (None, ""))
    mode, mode_where = files.get("remote.mode", (None, ""))
    resolve_settings(RemoteOptions(args.remote_cache, args.remote_cache_mode), os.environ,
                     str(url) if url else None, str(mode) if mode else None, str(url_where or mode_where), config)
    keys = config.resolve("trusted_keys")
    load_trusted(keys.value, keys.origin)


def _is_runner(path: Path) -> bool:
    """Whether a file `hermetic config` is given is a runner (a [runner] table) rather than a recipe."""
    from hermetic.tomlutil import load_toml
    return isinstance(load_toml(path).data.get("runner"), dict)


def cmd_recipe(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    """``recipe new SDIST_OR_FOLDER``: a recipe derived from the package's setup.py (extensions/derive.py),
    which runs inside the sandbox, in a scratch folder under the root."""
    from hermetic.config import load
    from hermetic.extensions.derive import NewRecipe, derive, parse_env
    from hermetic.root import lock_dir
    from hermetic.sandbox import choose
    if args.output is not None and os.path.lexists(args.output):
        raise BadInput(f"{args.output} exists", where="hermetic recipe new", hint="name a new file, or remove it")
    request = NewRecipe(args.source, parse_env(args.env), args.name, args.url, args.cuda, args.python, args.gpu,
                        args.lock, float(args.timeout))
    root.ensure()
    config = load(args.source.resolve().parent)
    mode = config.resolve("sandbox", args.sandbox)
    sandbox = choose(root, mode.value, mode.origin, lock_dir(config.resolve("lock_dir").value),
                     unix_sockets=False)   # no network, no unix socket (an ssh-agent's) for a stranger's setup.py
    if not sandbox.used and sandbox.mode != "off":  # a stranger's setup.py runs only confined, unless told
        from hermetic.errors import PreconditionFailed
        raise PreconditionFailed(f"no sandbox for the package's setup.py: {sandbox.why_not}",
                                 where="hermetic recipe new", hint="install bubblewrap (bwrap), or run it without "
                                                                   "a sandbox, your decision: --sandbox off")
    with sandbox.confined():
        text = derive(root, request, reporter)
    if args.output is None:
        sys.stdout.write(text + "\n")
    else:
        from hermetic import fs
        fs.atomic_write(args.output, (text + "\n").encode())
        reporter.event("recipe", f"wrote {args.output}")
    reporter.result("recipe", True, 0, output=str(args.output) if args.output else None)
    return 0


def cmd_completion(root: Root, args: argparse.Namespace, reporter: Reporter) -> int:
    """The shell completion script, generated from the parser by shtab (imported by this command alone); it
    reads and writes nothing of the root."""
    import shtab

    from hermetic.cli.parser import build_parser
    script: str = shtab.complete(build_parser(), shell=args.shell)
    sys.stdout.write(script if script.endswith("\n") else script + "\n")
    return 0


COMMANDS: dict[str, Callable[[Root, argparse.Namespace, Reporter], int]] = {
    "realize": cmd_realize, "gc": cmd_gc, "verify": cmd_verify, "show": cmd_show, "env": cmd_env,
    "export": cmd_export, "import": cmd_import, "run": cmd_run, "completion": cmd_completion, "key": cmd_key,
    "config": cmd_config,
    "recipe": cmd_recipe,
}
