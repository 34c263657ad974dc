"""One extension module of one variant: plan torch's commands and reuse what the object store certifies
(``plan_module``); the build graph (build/graph.py) compiles the rest of every module together; then link
and write the build's certificate (``finish_module``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zstandard

from hermetic import fs
from hermetic.build.certificate import ModuleBuild, certificate, read_certificate
from hermetic.build.host import host_identity, host_record
from hermetic.build.objects import INPUT_CHANGED, NO_MATCH, Decision, InputHasher, ObjectCache, ObjectChoice
from hermetic.build.plan import BuildPlan, Compile, plan_extension, prefix_map
from hermetic.build.toolchain import ToolchainInfo
from hermetic.errors import BadRecord, WorkFailed, ran_out
from hermetic.keys import KEY_ENV, PrefixMap
from hermetic.procs import Limits, run_limited
from hermetic.recipe import Extension, Recipe, Variant
from hermetic.reporter import Reporter, plural
from hermetic.root import Root
from hermetic.store import STORE_FORMAT, Store, blob_ref, entry_name, entry_ref
from hermetic.store.records import CompileCost, ObjectRecord, Producer, ToolchainId

if TYPE_CHECKING:
    from hermetic.build.share import ObjectShare

MODULE_VERSION = 2  # 2: the link command in the key is canonical (keys.PrefixMap)
# Passed through to compilers (and part of every object key); everything else of the caller's environment
# that could steer a compiler is dropped: no system CUDA, no CC/CXX, no LD_LIBRARY_PATH.
PASSED_ENV = tuple(k for k in KEY_ENV if k != "PATH")


@dataclass
class BuiltModule:
    module: str
    filename: str                  # module file name in the environment: NAME + the interpreter's suffix
    entry: str                     # the module's store entry
    digest: str                    # sha256 of the module file
    certificate: str               # sha256 of the certificate's uncompressed bytes
    certificate_blob: str          # blob holding the zstd-compressed certificate
    choices: list[ObjectChoice] = field(default_factory=list)
    linked: bool = False

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {"objects": len(self.choices)}
        for d in self.choices:
            c[d.decision] = c.get(d.decision, 0) + 1
        return c


def build_env(root: Root, tc: ToolchainInfo | None) -> dict[str, str]:
    env = root.child_env({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    env["PATH"] = (f"{tc.cuda_home / 'bin'}:" if tc else "") + "/usr/bin:/bin"
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU is visible to a build
    if tc is not None:
        env["CUDA_HOME"] = env["CUDA_PATH"] = str(tc.cuda_home)
    return env


@dataclass
class ModuleJob:
    """One extension of one variant from its plan to its link: the commands, the object cache that proves each
    reuse, and what became of every object so far (``choices``, in the plan's order)."""
    ext: Extension
    variant: Variant
    plan: BuildPlan
    build_dir: Path
    pmap: PrefixMap
    env: dict[str, str]
    cache: ObjectCache
    choices: list[ObjectChoice]
    previous: dict[str, ObjectRecord]     # source -> the object record of this module's last build
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.variant.name}/{self.plan.module}"

    def todo(self) -> list[int]:
        return [i for i, d in enumerate(self.choices) if d.decision is Decision.COMPILED]

    def record(self, i: int, producer: Producer, cost: CompileCost | None) -> ObjectChoice:
        """After object ``i`` compiled: store it with its inputs and what it took."""
        recorded = self.cache.record(self.choices[i].compile, producer, cost)
        recorded.reason = self.choices[i].reason
        self.choices[i] = recorded
        return recorded


def plan_module(root: Root, store: Store, recipe: Recipe, ext: Extension, variant: Variant,
                facts: dict[str, Any], tc: ToolchainInfo | None, toolchain_id: ToolchainId,
                src_root: Path, tree_files: list[str], reporter: Reporter, hasher: InputHasher,
                share: ObjectShare | None = None) -> ModuleJob:
    """Plan one module's commands and decide each object the store (or the remote) has: placed where the link
    expects it. What is left to compile is the job's ``todo``: the build graph runs it."""
    started = time.monotonic()
    build_dir = root.path / "build" / recipe.name / variant.name / ext.name
    build_dir.mkdir(parents=True, exist_ok=True)
    archs = recipe.toolchain.archs if recipe.toolchain else ()
    cuda_home = tc.cuda_home if tc else None
    pmap = prefix_map(root.path, ext.source, src_root, build_dir, cuda_home, facts)
    plan = plan_extension(ext, variant, facts, cuda_home, archs, src_root, tree_files, build_dir, pmap,
                          objdir_temps=bool(tc and tc.objdir_temps))
    env = build_env(root, tc)
    cache = ObjectCache(root, store, toolchain_id, env, host_identity(facts), pmap, hasher)
    choices = [cache.find(c) for c in plan.compiles]
    if share is not None:  # what the store lacks, the remote cache may have: verified, then found as local
        fetched = share.fetch_objects(cache, [d.compile for d in choices if d.decision is Decision.COMPILED])
        for i, d in enumerate(choices):
            if d.compile.rel in fetched and (found := cache.find(d.compile)).decision is not Decision.COMPILED:
                found.decision = Decision.FETCHED_REMOTE
                choices[i] = found
    job = ModuleJob(ext, variant, plan, build_dir, pmap, env, cache, choices,
                    previous_objects(store, root.cache("builds").get(f"{recipe.name}.{variant.name}.{ext.name}")))
    for d in choices:  # say which key component changed, where find() only knows that none matched
        if d.decision is Decision.COMPILED and d.reason in (NO_MATCH, INPUT_CHANGED):
            d.reason = cache.explain(d.compile, job.previous.get(d.compile.rel))
    for d in choices:
        if d.decision is not Decision.COMPILED:
            cache.place(d)
    todo = len(job.todo())
    reporter.event("build", f"{plan.module}: {plural(len(plan.compiles), 'objects')}, {len(plan.compiles) - todo} "
                            f"reused, {todo} to compile", module=plan.module, variant=variant.name,
                   objects=len(plan.compiles), reused=len(plan.compiles) - todo, to_compile=todo)
    job.timings["plan"] = round(time.monotonic() - started, 4)
    return job


def finish_module(root: Root, store: Store, recipe: Recipe, job: ModuleJob, facts: dict[str, Any],
                  toolchain_id: ToolchainId, reporter: Reporter, share: ObjectShare | None = None) -> BuiltModule:
    """Every object decided: share what the remote lacks, link (or reuse the module), write the certificate."""
    started = time.monotonic()
    if share is not None:  # compiled here or reused from this store: share what the remote lacks
        share.upload_objects([d.record for d in job.choices
                              if d.record and d.entry and d.decision is not Decision.FETCHED_REMOTE])
    built = _link_and_certify(root, store, recipe, job.variant, job.plan, facts, job.choices, job.env,
                              toolchain_id, job.pmap, reporter, share)
    job.timings["link"] = round(time.monotonic() - started, 4)
    return built


def remember_build(root: Root, recipe: Recipe, job: ModuleJob, built: BuiltModule) -> None:
    """The module's certificate as its last build, for --explain (``previous_objects``)."""
    root.cache("builds").put(f"{recipe.name}.{job.variant.name}.{job.ext.name}", built.certificate_blob)


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


def module_key(plan: BuildPlan, facts: dict[str, Any], toolchain_id: ToolchainId, pmap: PrefixMap,
               digests: list[str]) -> tuple[str, str]:
    """(the link's key, the module's entry name): the host, the toolchain, the canonical link command and the
    objects' digests, in the plan's order."""
    paths = {c.object for c in plan.compiles} | {plan.output}  # build-folder paths leave the key
    link_key_argv = pmap.canonical(["<OBJ>" if a in paths else a for a in plan.link_argv])
    key = fs.sha256_bytes(fs.canonical_json({"v": MODULE_VERSION, "host": host_identity(facts),
                                             "toolchain": toolchain_id, "link": link_key_argv,
                                             "objects": digests}))
    return key, entry_name(key, f"mod-{plan.module}")


def _link_and_certify(root: Root, store: Store, recipe: Recipe, variant: Variant, plan: BuildPlan,
                      facts: dict[str, Any], choices: list[ObjectChoice], env: dict[str, str],
                      toolchain_id: ToolchainId, pmap: PrefixMap, reporter: Reporter,
                      share: ObjectShare | None) -> BuiltModule:
    digests = [d.record["object"] if d.record else fs.sha256_file(Path(d.compile.object))[0] for d in choices]
    key, name = module_key(plan, facts, toolchain_id, pmap, digests)
    filename = plan.module + facts["ext_suffix"]
    linked = False
    reporter.event("phase", phase="linking")
    _drop_if_corrupt(store, name)  # a module, like an object, is re-hashed at every use
    module_from = "reused"
    with store.build_entry(name) as staging:
        if staging is not None:
            # linked elsewhere with the same key: the module and that build's certificate, verified
            shared = share.fetch_module(key, filename) if share is not None else None
            if shared is None:
                so_digest, producer = _link(store, recipe, plan, env), None
            else:
                so_digest, producer = shared
            staging.record = {
                "format": STORE_FORMAT, "name": name, "kind": "module", "module": plan.module, "file": filename,
                "so": so_digest, "host": host_record(facts), "producer_certificate": producer,
                "refs": [blob_ref(so_digest), *([blob_ref(producer)] if producer else []),
                         *(entry_ref(d.entry) for d in choices if d.entry)]}
            linked = True
            module_from = "linked" if shared is None else "fetched-remote"
    rec = store.module_record(name)
    module: ModuleBuild = {"decision": module_from, "entry": name, "producer_certificate": rec["producer_certificate"],
                           "remote": share.record() if share is not None else None}
    cert = certificate(recipe, variant, plan, facts, toolchain_id, choices, rec["so"], module, pmap)
    raw = fs.canonical_json(cert)
    cert_blob = store.put_blob_bytes(zstandard.ZstdCompressor(level=10).compress(raw))
    store.pin_blob(cert_blob)
    if share is not None and module_from != "fetched-remote":
        share.upload_module(key, filename, rec["so"], cert_blob)
    return BuiltModule(plan.module, filename, name, rec["so"], fs.sha256_bytes(raw), cert_blob, choices, linked)


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


def _link(store: Store, recipe: Recipe, plan: BuildPlan, env: dict[str, str]) -> str:
    limits = Limits(recipe.limits.cpus, recipe.limits.nice, recipe.limits.address_space)
    rc, tail = run_limited(list(plan.link_argv), cwd=str(Path(plan.output).parent), env=env,
                           limits=limits, on_line=lambda _line: None)
    if rc != 0:
        raise WorkFailed(f"linking {plan.module} failed:\n" + "\n".join(tail[-40:]),
                         hint=ran_out("\n".join(tail), recipe.limits.address_space) or "see the linker's message above")
    return store.put_blob_bytes(Path(plan.output).read_bytes())
