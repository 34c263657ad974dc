"""realize: qualify, fetch, materialize, toolchain, (sources, build, check), receipt.

Each step is one function below; ``realize`` reads as the list. A realize whose inputs have not changed
fetches nothing, writes nothing in the store and imports neither requests nor torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__, fs
from .errors import BadInput
from .inputs import Outcome, noop_check, record_inputs
from .lockcache import read_lock_cached
from .locktypes import Lock, LockedWheel
from .materialize import (
    Unpacked,
    build_tree,
    load_unpacked,
    merge_files,
    set_profile,
    unpacked_entry_name,
)
from .recipe import Recipe, Variant, load_recipe
from .reporter import Reporter
from .root import Root
from .store import Staging, Store
from .toolchain import toolchain_links

if TYPE_CHECKING:
    from .fetch import Fetcher
    from .remote import RemoteOptions
    from .sharing import Sharing


def realize(root: Root, recipe_path: Path, reporter: Reporter, *, variant: str | None = None,
            explain: bool = False, remote: RemoteOptions | None = None) -> Outcome:
    started = time.monotonic()
    timings: dict[str, float] = {}
    unchanged = None if explain else noop_check(root, recipe_path, variant)   # 0. anything changed?
    if unchanged is not None:
        unchanged.timings["total"] = round(time.monotonic() - started, 4)
        return unchanged
    from .audit import OutsideRootAudit
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
        from .build_recipe import build_recipe  # compilers' machinery only for recipes that build
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
        from .check import import_check
        reporter.event("phase", phase="checking")
        report["import_check"] = import_check(root, report["host"]["executable"], profile,
                                              [m.module for m in result.modules], tree, result.env)
        t = lap("check", t)
    else:
        t = lap("materialize", t)
    counts["files"] = len(files)
    if share is not None:
        report["remote"] = share.summary()
        share.remote.close()
    entries = sorted({tree, *(r[len("entry:"):] for r in refs if r.startswith("entry:"))})
    outcome = Outcome(name, recipe.path, profile, tree, entries, counts, timings,
                      changed=changed or built or counts["fetched"] > 0 or counts["unpacked"] > 0)
    reporter.event("phase", phase="receipt")
    outcome.changed |= write_root(root, name, recipe, entries)   # 9. receipt and gc root
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
    from .urls import remote_in_environment
    if options is None and not (recipe.remote_url or recipe.remote_mode or remote_in_environment()):
        return None
    from .remote import resolve_settings
    settings = resolve_settings(options, os.environ, recipe.remote_url, recipe.remote_mode,
                                recipe.doc.where("remote") if recipe.remote_url or recipe.remote_mode else "")
    if settings is None:
        return None
    from .remote import RemoteCache
    from .sharing import Sharing
    reporter.event("remote", f"remote cache {settings.url} ({'read-write' if settings.writable else 'read-only'})",
                   **settings.record())
    return Sharing(RemoteCache(settings, reporter), store)


def fetch_and_unpack(root: Root, store: Store, locks: list[Lock], reporter: Reporter,
                     counts: dict[str, int], share: Sharing | None = None) -> list[Unpacked]:
    """Each locked wheel unpacked in the store, fetching only what is missing.

    The unpacked entry's lock is held while its wheel is fetched, so concurrent realizes of one recipe
    download and unpack each wheel once; the others wait and reuse it.
    """
    wheels = _unique_wheels(locks)
    counts["wheels"] = len(wheels)
    out: list[Unpacked] = []
    fetcher: Fetcher | None = None
    for w in wheels:
        found = _existing_unpacked(store, w)
        if found is not None:
            out.append(found)
            counts["reused"] += 1
            continue
        name = unpacked_entry_name(w.hashes[0], w.name)
        with store.build_entry(name) as staging:
            if staging is not None:
                fresh: Path | None = None
                blob = next((store.blob_path(h) for h in w.hashes if store.use_blob(h)), None)
                if blob is None and share is not None and (shared := share.fetch_blob(w.hashes, w.size)):
                    blob = store.blob_path(shared)            # from the remote cache, verified
                    size = blob.stat().st_size
                    share.counts["wheels_fetched"] += 1
                    counts["fetched"] += 1
                    counts["fetched_bytes"] += size
                    reporter.event("fetched", f"fetched {w.filename or w.name} from the remote cache ({size} bytes)",
                                   wheel=w.filename or w.name, sha256=shared, bytes=size, remote=True)
                if blob is None:
                    if fetcher is None:  # requests and pip's configuration are loaded only when needed
                        fetcher = _make_fetcher(store, reporter)
                    reporter.event("phase", phase="fetching")
                    blob, filename = _fetch(store, fetcher, w, reporter, counts)
                    fresh = blob
                else:
                    filename = w.filename or _filename_from_wheel(w, blob)
                store.temproots.add(f"blob:{blob.name}")
                reporter.event("phase", phase="materializing")
                try:
                    _unpack_blob(staging, blob, blob.name, filename, w.where)
                except BadInput:
                    if blob == fresh:  # a hostile wheel fetched just now does not stay in the store
                        blob.unlink(missing_ok=True)
                    raise
                if fresh is not None and share is not None:
                    share.upload_blob(fresh.name)  # only once it unpacked whole: no hostile wheel for the team
                counts["unpacked"] += 1
                reporter.event("unpacked", f"unpacked {filename}", wheel=filename)
            else:
                counts["reused"] += 1
        out.append(load_unpacked(store, name))
    return sorted(out, key=lambda u: u.entry)


def _make_fetcher(store: Store, reporter: Reporter) -> Fetcher:
    from .fetch import Fetcher
    from .pipconfig import load_pip_config
    return Fetcher(load_pip_config(), store.tmp, reporter)


def _fetch(store: Store, fetcher: Fetcher, w: LockedWheel, reporter: Reporter,
           counts: dict[str, int]) -> tuple[Path, str]:
    got = fetcher.fetch(w)
    store.temproots.add(f"blob:{got.sha256}")
    blob = store.put_blob_file(got.path, got.sha256)
    counts["fetched"] += 1
    counts["fetched_bytes"] += got.size
    reporter.event("fetched", f"fetched {got.filename} ({got.size} bytes)", wheel=got.filename,
                   sha256=got.sha256, bytes=got.size)
    return blob, got.filename


def _unique_wheels(locks: list[Lock]) -> list[LockedWheel]:
    seen: dict[str, LockedWheel] = {}
    for lock in locks:
        for w in lock.wheels:
            if w.name in seen and set(seen[w.name].hashes) != set(w.hashes):
                raise BadInput(f"{w.name} is locked twice with different hashes",
                               where=w.where, hint=f"see also {seen[w.name].where}; keep one pin")
            seen[w.name] = w
    return [seen[k] for k in sorted(seen)]


def _existing_unpacked(store: Store, w: LockedWheel) -> Unpacked | None:
    """A wheel already unpacked under any of its locked hashes needs no fetch, not even its file."""
    for h in w.hashes:
        name = unpacked_entry_name(h, w.name)
        if store.use(name):
            return load_unpacked(store, name)
    return None


def _filename_from_wheel(w: LockedWheel, blob: Path) -> str:
    """Rebuild a stored wheel's file name from its own dist-info (the store names blobs by hash)."""
    import zipfile
    try:
        with zipfile.ZipFile(blob) as zf:
            wheel_meta = next(n for n in zf.namelist() if n.count("/") == 1
                              and n.endswith(".dist-info/WHEEL"))
            tag = next(line.split(":", 1)[1].strip() for line in zf.read(wheel_meta).decode().splitlines()
                       if line.startswith("Tag:"))
    except (zipfile.BadZipFile, StopIteration, OSError, UnicodeDecodeError):
        raise BadInput(f"the stored wheel for {w.name} has no readable WHEEL tag", where=w.where,
                       hint="run `hermetic verify --repair`") from None
    return f"{wheel_meta.split('/')[0][: -len('.dist-info')]}-{tag}.whl"


def _unpack_blob(staging: Staging, blob: Path, sha: str, filename: str, where: str) -> None:
    # installer reads the distribution's name from the file name, so give the blob its name via a link
    named = staging.path / "wheel" / filename
    named.parent.mkdir()
    os.symlink(blob, named)
    try:
        from .unpack import unpack_wheel  # installer is imported only when a wheel is unpacked
        unpack_wheel(staging, named, sha, where=where)
    finally:
        fs.remove_tree(named.parent)


def write_root(root: Root, name: str, recipe: Recipe, entries: list[str]) -> bool:
    """The gc root of a recipe (or one variant of it): rewritten only when its entries change."""
    record = {"format": 1, "name": name, "recipe": str(recipe.path),
              "profile": name, "refs": [f"entry:{e}" for e in entries]}
    path = root.roots / f"{name}.json"
    data = fs.pretty_json(record)
    if path.exists() and path.read_bytes() == data:
        return False
    fs.atomic_write(path, data)
    return True


def write_receipt(root: Root, outcome: Outcome, locks: list[Lock], unpacked: list[Unpacked],
                  report: dict[str, Any]) -> Path:
    import sys
    uname = os.uname()  # platform.platform() also reads the interpreter's binary for its libc: too slow here
    body: dict[str, Any] = {
        "format": 1, "kind": "realize", "hermetic": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": {"name": outcome.name, "path": str(outcome.recipe_path),
                   "sha256": fs.sha256_file(outcome.recipe_path)[0]},
        "locks": [{"path": str(lk.path), "sha256": lk.sha256, "format": lk.format} for lk in locks],
        "host": {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
                 "platform": f"{uname.sysname}-{uname.release}-{uname.machine}"},
        "wheels": [{"entry": u.entry, "sha256": u.wheel_sha256} for u in unpacked],
        "tree": outcome.tree, "profile": str(outcome.profile),
        "refs": [f"entry:{e}" for e in outcome.entries],
        "counts": outcome.counts, "timings": outcome.timings, **report,
    }
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    digest = fs.sha256_bytes(fs.canonical_json(body))[:12]
    path = root.receipts / f"{outcome.name}-{stamp}-{digest}.json"
    fs.atomic_write_json(path, body, pretty=True)
    return path


def _receipt_records(receipt: Path, tree: str, store: Store) -> bool:
    """Whether a receipt describes ``tree``, with its certificates still sound (a corrupt one is not reused
    as this realize's record: a new receipt names the certificate just written)."""
    try:
        body = fs.read_json(receipt)
        if body.get("tree") != tree:
            return False
        return all(fs.sha256_file(store.blob_path(m["certificate_blob"]))[0] == m["certificate_blob"]
                   for m in body.get("modules", []))
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False


def latest_receipt(root: Root, name: str) -> Path | None:
    found = sorted(root.receipts.glob(f"{name}-*.json")) if root.receipts.exists() else []
    return found[-1] if found else None
