"""One extension module of one variant: plan torch's commands and decide each object from what the object
store certifies (``plan_module``: a decision, nothing written), put the reused objects where the link expects
them (``place_reused``); the build graph (extensions/graph.py) compiles the rest of every module together; then link
(or find the module by its link key: ``plan_link``) and write the build's certificate (``finish_module``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import zstandard

from hermetic import fs
from hermetic.errors import BadRecord, WorkFailed, ran_out
from hermetic.extensions.certificate import ModuleBuild, certificate, read_certificate
from hermetic.extensions.context import BuildContext
from hermetic.extensions.job import BuiltModule, ModuleJob
from hermetic.extensions.objects import INPUT_CHANGED, NO_MATCH, Decision, ObjectCache
from hermetic.extensions.plan import Compile, ModuleSite, plan_extension
from hermetic.keys import PrefixMap
from hermetic.procs import Limits, run_limited
from hermetic.recipe import Extension, Variant, module_file
from hermetic.reporter import plural
from hermetic.store import STORE_FORMAT, Store, blob_ref, entry_name, entry_ref
from hermetic.store.records import ObjectRecord

MODULE_VERSION = 2  # 2: the link command in the key is canonical (keys.PrefixMap)


def object_cache(ctx: BuildContext, pmap: PrefixMap) -> ObjectCache:
    """The object cache of one module's build: this toolchain, host and compiler environment, its prefix map."""
    return ObjectCache(ctx.root, ctx.store, ctx.toolchain.id, ctx.env, ctx.host.identity(), pmap, ctx.hasher)


def plan_module(ctx: BuildContext, ext: Extension, variant: Variant, site: ModuleSite) -> ModuleJob:
    """Plan one module's commands and decide each object the store (or the remote) has, and why each other one
    is compiled. Nothing is written here but what the remote cache hands over (``place_reused`` puts the reused
    objects where the link expects them); what is left to compile is the job's ``todo``: the graph runs it."""
    plan = plan_extension(ext, variant, ctx.host, ctx.cuda, site)
    cache = object_cache(ctx, site.pmap)
    choices = [cache.find(c) for c in plan.compiles]
    if ctx.share is not None:  # what the store lacks, the remote cache may have: verified, then found as local
        fetched = ctx.share.fetch_objects(cache, [d.compile for d in choices if d.decision is Decision.COMPILED])
        for i, d in enumerate(choices):
            if d.compile.rel in fetched and (found := cache.find(d.compile)).decision is not Decision.COMPILED:
                found.decision = Decision.FETCHED_REMOTE
                choices[i] = found
    previous = previous_objects(ctx.store, ctx.root.cache("builds").get(_build_key(ctx, variant, ext)))
    job = ModuleJob(ext, variant, plan, site.build_dir, site.pmap, ctx.env, cache, choices, previous)
    for d in choices:  # say which key component changed, where find() only knows that none matched
        if d.decision is Decision.COMPILED and d.reason in (NO_MATCH, INPUT_CHANGED):
            d.reason = cache.explain(d.compile, job.previous.get(d.compile.rel))
    return job


def place_reused(ctx: BuildContext, job: ModuleJob) -> None:
    """Put every object the plan reuses where the link expects it, and say what the module will take."""
    started = time.monotonic()
    top = ctx.root.path / "build"
    fs.refuse_linked_folders(top, job.build_dir)
    job.build_dir.mkdir(parents=True, exist_ok=True)
    for d in job.choices:
        if d.decision is not Decision.COMPILED:
            fs.refuse_linked_folders(top, Path(d.compile.object).parent)
            job.cache.place(d)
    todo, total = len(job.todo()), len(job.plan.compiles)
    ctx.reporter.event("build", f"{job.plan.module}: {plural(total, 'objects')}, {total - todo} reused, {todo} to "
                                "compile", module=job.plan.module, variant=job.variant.name, objects=total,
                       reused=total - todo, to_compile=todo)
    job.timings["plan"] = round(job.timings.get("plan", 0.0) + time.monotonic() - started, 4)


def finish_module(ctx: BuildContext, job: ModuleJob) -> BuiltModule:
    """Every object decided: share what the remote lacks, link (or reuse the module), write the certificate."""
    started = time.monotonic()
    if ctx.share is not None:  # compiled here or reused from this store: share what the remote lacks
        ctx.share.upload_objects([d.record for d in job.choices
                                  if d.record and d.entry and d.decision is not Decision.FETCHED_REMOTE])
    built = _link_and_certify(ctx, job)
    job.timings["link"] = round(time.monotonic() - started, 4)
    return built


def _build_key(ctx: BuildContext, variant: Variant, ext: Extension) -> str:
    return f"{ctx.recipe.name}.{variant.name}.{ext.name}"


def remember_build(ctx: BuildContext, job: ModuleJob, built: BuiltModule) -> None:
    """The module's certificate as its last build, for --explain (``previous_objects``)."""
    ctx.root.cache("builds").put(_build_key(ctx, job.variant, job.ext), built.certificate_blob)


_LOCAL_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def cold_weight(c: Compile, sizes: dict[str, tuple[int, list[str]]] | None = None) -> int:
    """A compile's cost guessed without a previous compile of it: the bytes of its source, counted twice, and
    of every local header it reaches through ``#include "..."`` (found next to the including file, else in a
    -I folder), each counted once, as long as it lies in the unit's own source tree. The system's, CUDA's
    and torch's headers are common to every unit (and reached through quoted includes too, where the
    compiler finds them in their -I folders), so the project's own code a unit pulls in is what sets units
    apart: exllamav3's bindings.cpp includes every header of its extension, and a template-instantiation
    unit (a few lines naming one ``*_instances.cuh``) reaches the kernels it instantiates only through that
    header's own includes. The source itself is compiled whole, where a header's templates are instantiated
    only in part: counted twice, exllamav3's ``cpu/moe_mul1.cpp`` (191 KB of its own, the longest compile)
    starts first (docs/builds.md, "The order of a cold build").
    ``sizes`` memoizes (size, quoted includes) per file across units."""
    memo = {} if sizes is None else sizes
    dirs = [a[2:] for a in c.argv if a.startswith("-I") and len(a) > 2]
    tree = (c.source[:len(c.source) - len(c.rel)] if c.source.endswith(c.rel) else os.path.dirname(c.source))
    inside = os.path.normpath(tree) + os.sep
    total = 0
    seen: set[str] = set()
    source = os.path.normpath(c.source)
    stack = [source]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        if path not in memo:
            try:
                data = Path(path).read_bytes()
            except OSError:
                data = None
            memo[path] = (0, []) if data is None else \
                (len(data), [os.fsdecode(n) for n in dict.fromkeys(_LOCAL_INCLUDE.findall(data))])
        size, names = memo[path]
        total += 2 * size if path == source else size
        for name in names:
            for d in (os.path.dirname(path), *dirs):
                q = os.path.normpath(os.path.join(d, name))
                if os.path.isfile(q):  # the file the compiler takes; followed only inside the tree
                    if q.startswith(inside):
                        stack.append(q)
                    break
    return total


def previous_objects(store: Store, certificate_blob: object) -> dict[str, ObjectRecord]:
    """source -> object record of the previous build of this module, for --explain."""
    if not isinstance(certificate_blob, str):
        return {}
    try:
        cert = read_certificate(store, certificate_blob)
        out = {}
        for o in cert["objects"]:
            entry = o.get("entry")
            if entry and store.has_entry(entry):
                out[o["source"]] = store.object_record(entry)
        return out
    except (OSError, ValueError, KeyError, TypeError, WorkFailed, BadRecord, zstandard.ZstdError):
        return {}


@dataclass(frozen=True)
class LinkStep:
    """What a realize decides of one module's link: its key and entry (the host, the toolchain, the canonical
    link command and the objects' digests), and whether that entry is in the store (``reuse``) or is to be
    linked (``link``). ``key`` and ``entry`` are None while an object is still to compile."""
    key: str | None
    entry: str | None
    action: str


def plan_link(ctx: BuildContext, job: ModuleJob, digests: list[str] | None) -> LinkStep:
    """The link of ``job``, given its objects' digests in the plan's order (None: not all known yet)."""
    if digests is None:
        return LinkStep(None, None, "link")
    paths = {c.object for c in job.plan.compiles} | {job.plan.output}  # build-folder paths leave the key
    link_key_argv = job.pmap.canonical(["<OBJ>" if a in paths else a for a in job.plan.link_argv])
    key = fs.sha256_bytes(fs.canonical_json({"v": MODULE_VERSION, "host": ctx.host.identity(),
                                             "toolchain": ctx.toolchain.id, "link": link_key_argv,
                                             "objects": digests}))
    entry = entry_name(key, f"mod-{job.plan.module}")
    return LinkStep(key, entry, "reuse" if ctx.store.has_entry(entry) else "link")


def known_digests(job: ModuleJob) -> list[str] | None:
    """The digests of the job's objects as the plan knows them: every one reused, else None."""
    digests = [d.record["object"] for d in job.choices if d.record is not None]
    return digests if len(digests) == len(job.choices) else None


def _link_and_certify(ctx: BuildContext, job: ModuleJob) -> BuiltModule:
    store, plan, share = ctx.store, job.plan, ctx.share
    digests = [d.record["object"] if d.record else fs.sha256_file(Path(d.compile.object))[0] for d in job.choices]
    step = plan_link(ctx, job, digests)
    assert step.key is not None and step.entry is not None
    name = step.entry
    filename = module_file(plan.module, ctx.host.ext_suffix)
    linked = False
    ctx.reporter.event("phase", phase="linking")
    _drop_if_corrupt(store, name)  # a module, like an object, is re-hashed at every use
    module_from = "reused"
    with store.build_entry(name) as staging:
        if staging is not None:
            # linked elsewhere with the same key: the module and that build's certificate, verified
            shared = share.fetch_module(step.key, filename) if share is not None else None
            if shared is None:
                so_digest, producer = _link(ctx, job, digests, staging.path), None
            else:
                so_digest, producer = shared
            staging.record = {
                "format": STORE_FORMAT, "name": name, "kind": "module", "module": plan.module, "file": filename,
                "so": so_digest, "host": ctx.host.record(), "producer_certificate": producer,
                "refs": [blob_ref(so_digest), *([blob_ref(producer)] if producer else []),
                         *(entry_ref(d.entry) for d in job.choices if d.entry)]}
            linked = True
            module_from = "linked" if shared is None else "fetched-remote"
    rec = store.module_record(name)
    module: ModuleBuild = {"decision": module_from, "entry": name, "producer_certificate": rec["producer_certificate"],
                           "remote": share.record() if share is not None else None}
    raw = fs.canonical_json(certificate(ctx, job, rec["so"], module))
    cert_blob = store.put_blob_bytes(zstandard.ZstdCompressor(level=10).compress(raw))
    store.pin_blob(cert_blob)
    if share is not None and module_from != "fetched-remote":
        share.upload_module(step.key, filename, rec["so"], cert_blob)
    return BuiltModule(plan.module, filename, name, rec["so"], fs.sha256_bytes(raw), cert_blob, job.choices, linked,
                       job.ext.python_module)


def _drop_if_corrupt(store: Store, name: str) -> None:
    """Invalidate a stored module whose file no longer hashes to its record: it is linked again, and the
    blob healed in place with the new bytes (Store.put_blob_bytes), trees that hold it included."""
    digest: str | None
    try:
        digest = store.module_record(name)["so"]
    except OSError:
        return  # not built yet
    except (WorkFailed, BadRecord, KeyError):
        digest = None  # its record is damaged: link it again
    if isinstance(digest, str) and store.blob_path(digest).exists() \
            and fs.sha256_file(store.blob_path(digest))[0] == digest:
        return
    store.drop_entry(name)


def _link(ctx: BuildContext, job: ModuleJob, digests: list[str], staging: Path) -> str:
    """Link the module from the certified bytes: each object's bytes (its store blob, else the build folder's
    file) hashed right before the link against the digest the module's key and certificate name, and linked
    from a private copy in a fresh 0700 folder of the module's staging folder (``staging``, under the store,
    which the sandbox binds read-only: no compile can write there; removed before the entry is published).
    A build folder's object swapped after it was stored (by a compile, or anything else that could write
    there) never reaches the module, nor does a copy swapped between the hash and the link. The copies keep
    their file names (GNU ld takes an object whatever its path; the module's bytes do not depend on it)."""
    from hermetic.extensions.objects import object_bytes
    limits = ctx.recipe.limits
    plan = job.plan
    out_dir = Path(plan.output).parent
    with fs.scratch_dir(staging, "link-") as private:   # mkdtemp: 0700, removed with the copies
        copies: dict[str, str] = {}
        for i, (d, digest) in enumerate(zip(job.choices, digests, strict=True)):
            data = object_bytes(ctx.store, d.record) if d.record is not None else None
            if data is None and d.record is None:
                try:
                    data = Path(d.compile.object).read_bytes()
                except OSError:
                    data = None
            if data is None or fs.sha256_bytes(data) != digest:
                raise WorkFailed(f"the object {d.compile.object} changed after it was certified: not linked",
                                 where=d.compile.object, hint="realize again (`hermetic verify --repair` first if "
                                                              "the store's object is damaged)")
            copy = private / str(i) / os.path.basename(d.compile.object)
            copy.parent.mkdir()
            fs.atomic_write(copy, data, durable=False)
            copies[d.compile.object] = str(copy)
        argv = [copies.get(a, a) for a in plan.link_argv]
        rc, tail = run_limited(argv, cwd=str(out_dir), env=job.env,
                               limits=Limits(limits.cpus, limits.nice, limits.address_space),
                               on_line=lambda _line: None)
    if rc != 0:
        raise WorkFailed(f"linking {plan.module} failed:\n" + "\n".join(tail[-40:]),
                         hint=ran_out("\n".join(tail), limits.address_space) or "see the linker's message above")
    return ctx.store.put_blob_bytes(Path(plan.output).read_bytes())
