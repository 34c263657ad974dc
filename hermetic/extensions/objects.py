"""Certified object reuse: compiled objects in the store, found by input hash, every reuse proven.

An *object entry* records one compile: the lookup key (toolchain, command without defines and output,
the environment variables that change compiler output), the defines, and every input the compiler read
(its full -MD dependency list, system headers included) with the hash of its content: raw bytes under debug
or line-info flags, else the bytes with comments removed and every line kept. The store's index lists the
entries compiled under a lookup key; a compile reuses one when every recorded input still hashes the
same and, where the defines differ (another variant), no differing identifier occurs in any input or in
the rest of the command. Inputs using __DATE__, __TIME__ or __TIMESTAMP__ are never recorded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadRecord, WorkFailed
from hermetic.extensions.plan import Compile
from hermetic.keys import (
    TEMPORAL,
    PrefixMap,
    differing_defines,
    identifier_re,
    is_debug,
    key_env,
    lookup_key,
    object_key,
    parse_depfile,
    split_defines,
    strip_comments,
)
from hermetic.root import Root
from hermetic.store import STORE_FORMAT, Store, blob_ref, entry_name
from hermetic.store.records import (
    CompileCost,
    HostIdentity,
    InputHash,
    ObjectRecord,
    Packed,
    Producer,
    ToolchainId,
)

RAW, STRIPPED = "raw", "stripped"
# An object is stored zstd-compressed (``record["packed"]``) when that saves at least a quarter of its bytes:
# host objects shrink about 4x; objects whose device code nvcc already compressed barely shrink and stay raw.
PACK_LEVEL, PACK_RATIO = 3, 0.75
# find() knows only that no stored object matched; --explain then names the component that changed
NO_MATCH = "no object compiled with this command and toolchain"
INPUT_CHANGED = "an input changed since the stored objects were compiled"


class Decision(StrEnum):
    """What became of one object of a build (certificates and counts spell them so)."""
    COMPILED = "compiled"
    REUSED = "reused"                       # an object of this very command and defines
    REUSED_VARIANT = "reused-variant"       # another variant's, its differing defines waived
    FETCHED_REMOTE = "fetched-remote"       # from the remote cache, checked as a local one
    UNCACHEABLE = "compiled-uncacheable"    # compiled, and not stored (time macros, a vanished input)

    @property
    def compiled(self) -> bool:
        return self in (Decision.COMPILED, Decision.UNCACHEABLE)


def object_bytes(store: Store, rec: ObjectRecord) -> bytes | None:
    """An object record's bytes (unpacked if it is stored compressed); None unless they hash to the record."""
    import zstandard
    packed = rec.get("packed")
    try:
        if packed:
            data = store.blob_path(packed["blob"]).read_bytes()
            if fs.sha256_bytes(data) != packed["blob"]:  # the blob itself first: zstd ignores trailing bytes
                return None
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=int(rec["size"]))
        else:
            data = store.blob_path(rec["object"]).read_bytes()
    except (OSError, zstandard.ZstdError, KeyError, TypeError, ValueError):
        return None
    return data if fs.sha256_bytes(data) == rec["object"] else None


def stored_blob(rec: ObjectRecord) -> str:
    """The blob an object record keeps its bytes in: the compressed one, else the object's own."""
    packed = rec.get("packed")
    return packed["blob"] if packed else rec["object"]


class InputHasher:
    """Content hashes of input files (raw, comment-stripped, and whether time macros occur), trusted while each
    file's stat fingerprint is unchanged: root's ``hashes`` cache."""

    def __init__(self, root: Root, *, snapshot: bool = False) -> None:
        self.table = fs.FingerprintTable(root.cache_dir("hashes") / "inputs.json", read_only=root.read_only)
        self.rehashed = 0
        # ``snapshot``: while a realize plans, each file is stat'ed once, however many object records name it
        # (each of exllamav3's 388 names about 2,000 files, most of them torch's headers: docs/builds.md, "A
        # fresh checkout"). Off from the first compile on: an object's record must hash its inputs as they
        # are once it is compiled (``live``).
        self.snapshot: dict[tuple[str, bool], list[Any] | None] | None = {} if snapshot else None

    def live(self) -> None:
        """From now on every hash checks the file's fingerprint again (compiles are about to change files)."""
        self.snapshot = None

    def _fact(self, path: str, *, stripped: bool) -> list[Any] | None:
        """[sha256 of the bytes, sha256 of the stripped bytes or None, temporal or None]; None if it is gone."""
        if self.snapshot is None:
            return self._read(path, stripped=stripped)
        key = (path, stripped)
        if key not in self.snapshot:
            self.snapshot[key] = self._read(path, stripped=stripped)
        return self.snapshot[key]

    def _read(self, path: str, *, stripped: bool) -> list[Any] | None:
        fp, fact = self.table.get(path)
        if fp is None:
            return None
        if fact is None:
            try:
                data = Path(path).read_bytes()
            except OSError:
                return None
            fact = [fs.sha256_bytes(data), None, None]
            self.table.put(path, fp, fact)
            self.rehashed += 1
        if stripped and fact[1] is None:
            text = strip_comments(Path(path).read_bytes())
            fact[1:] = [fs.sha256_bytes(text), TEMPORAL.search(text) is not None]
            self.table.dirty = True
        return list(fact)

    def hash(self, path: str, mode: str) -> str | None:
        """sha256 of the file's bytes (raw) or of its comment-stripped bytes; None if it is gone."""
        fact = self._fact(path, stripped=mode == STRIPPED)
        return None if fact is None else str(fact[0] if mode == RAW else fact[1])

    def temporal(self, path: str) -> bool:
        """Whether the file uses __DATE__, __TIME__ or __TIMESTAMP__ outside comments (cached with its hash)."""
        fact = self._fact(path, stripped=True)
        return True if fact is None else bool(fact[2])

    def save(self) -> None:
        self.table.save()


@dataclass
class ObjectChoice:
    """One object of a build: what was decided, why, and the record that proves a reuse."""
    compile: Compile
    decision: Decision
    entry: str | None = None         # the object entry used or recorded
    waived: list[str] = field(default_factory=list)
    reason: str = ""                 # why it was compiled (for --explain)
    record: ObjectRecord | None = None
    weight: int = 0                  # inputs the last compile of this source read: a proxy for its cost
    waited_for: str | None = None    # the compile of another variant whose object this one waited for


@dataclass(frozen=True)
class Chosen:
    record: ObjectRecord
    decision: Decision
    waived: list[str]


@dataclass(frozen=True)
class NoneFits:
    reason: str
    weight: int = 0


def choose(defines: dict[str, str | None], records: Sequence[ObjectRecord],
           inputs_match: Callable[[ObjectRecord], bool],
           waiver_blocker: Callable[[ObjectRecord, list[str]], str | None]) -> Chosen | NoneFits:
    """The decision function of certified reuse, pure but for the two questions it asks: of the records
    filed under a compile's lookup key, the one it may use (an exact match first, then another variant's
    whose differing defines can be waived), or why none fits."""
    candidates = [r for r in records if inputs_match(r)]
    if not candidates:
        return NoneFits(INPUT_CHANGED if records else NO_MATCH)
    weight = max(len(r["inputs"]) for r in candidates)
    for r in candidates:
        if not differing_defines(defines, r["defines"]):
            return Chosen(r, Decision.REUSED, [])
    blocker, diff = "", []
    for r in candidates:
        diff = differing_defines(defines, r["defines"])
        found = waiver_blocker(r, diff)
        if found is None:
            return Chosen(r, Decision.REUSED_VARIANT, diff)
        blocker = found
    return NoneFits(f"defines differ ({', '.join(diff)}) and {blocker}", weight)


class ObjectCache:
    """The objects of one build's compiles: found, proven, recorded. ``pmap`` rebases the canonical paths of
    records onto this build's folders (and makes this build's own canonical)."""

    def __init__(self, root: Root, store: Store, toolchain: ToolchainId, env: dict[str, str], host: HostIdentity,
                 pmap: PrefixMap, hasher: InputHasher | None = None) -> None:
        self.root, self.store, self.toolchain, self.env = root, store, toolchain, env
        self.host, self.pmap = host, pmap
        self.hasher = hasher or InputHasher(root)   # one per realize: every module's caches share its table
        self._local: dict[str, str] = {}            # canonical input path -> this build's path
        self._scan: dict[tuple[str, str], bool] = {}

    def _env(self, c: Compile) -> dict[str, str]:
        return self.pmap.canonical_env(key_env("nvcc" if c.cuda else "cxx", self.env))

    def _root_pin(self, c: Compile) -> str | None:
        return str(self.root.path) if c.path_bound else None

    def lookup(self, c: Compile) -> str:
        return lookup_key("nvcc" if c.cuda else "cxx", self.pmap.canonical(c.argv), self._env(c), self.toolchain,
                          self.host, self._root_pin(c))

    def input_hash(self, path: str, mode: str) -> str | None:
        """The hash now of a recorded (canonical) input, read from this build's folders."""
        local = self._local.get(path)
        if local is None:
            local = self._local[path] = self.pmap.local_path(path)
        return self.hasher.hash(local, mode)

    def find(self, c: Compile) -> ObjectChoice:
        """A stored object this compile may use, with the proof; or a 'compile' decision saying why not. Through
        a read-only store (a plan), the same proof with nothing pinned: a damaged record is skipped (the realize
        would stop on it, and verify --repair says so) and a corrupt object is said, not removed."""
        names = self.store.index_list(self.lookup(c))
        if not names:
            return ObjectChoice(c, Decision.COMPILED, reason=NO_MATCH)
        if self.store.read_only:
            records = []
            for name in names:
                try:
                    if self.store.use(name):
                        records.append(self.store.object_record(name))
                except (OSError, WorkFailed, BadRecord):
                    continue
        else:
            records = [self.store.object_record(name) for name in names if self.store.use(name)]
        chosen = self.choose(c, records)
        if isinstance(chosen, ObjectChoice):
            return chosen
        return self._use(c, chosen)

    def choose(self, c: Compile, records: Sequence[ObjectRecord]) -> Chosen | ObjectChoice:
        """``choose`` with this cache's answers: the inputs hashed now, the waiver scanned in the inputs (records
        may come from the remote); a 'compiled' choice when none fits."""
        _rest, defines = split_defines(c.argv)
        found = choose(defines, records,
                       lambda r: all(self.input_hash(p, mode) == h for p, mode, h in r["inputs"]),
                       lambda r, names: self._waiver_blocker(c, r, names))
        if isinstance(found, NoneFits):
            return ObjectChoice(c, Decision.COMPILED, reason=found.reason, weight=found.weight)
        return found

    def explain(self, c: Compile, previous: ObjectRecord | None) -> str:
        """The first key component that differs from the object this source had in the previous build."""
        if previous is None:
            return "no previous object of this source"
        old_tc: dict[str, Any] = dict(previous["toolchain"])
        new_tc: dict[str, Any] = dict(self.toolchain)
        if old_tc != new_tc:
            changed = sorted(k for k in set(new_tc) | set(old_tc) if new_tc.get(k) != old_tc.get(k))
            return f"the toolchain changed ({', '.join(changed)})"
        env, old_env = self._env(c), previous["env"]
        for k in sorted(set(env) | set(old_env)):
            if env.get(k) != old_env.get(k):
                return f"environment variable {k} changed: {old_env.get(k)!r} -> {env.get(k)!r}"
        rest, defines = split_defines(self.pmap.canonical(c.argv))
        old = previous["argv"]
        for i, (a, b) in enumerate(zip(old, rest, strict=False)):
            if a != b:
                return f"command argument {i} changed: {a!r} -> {b!r}"
        if len(old) != len(rest):
            return f"command changed length: {len(old)} -> {len(rest)} arguments"
        if previous.get("root") != self._root_pin(c):
            return f"the object was bound to the root {previous.get('root')}, this compile to {self._root_pin(c)}"
        for path, mode, h in previous["inputs"]:
            now = self.input_hash(path, mode)
            if now is None:
                return f"input {path} is gone"
            if now != h:
                return f"input {path} changed"
        diff = differing_defines(defines, previous["defines"])
        if diff:
            return f"defines changed: {', '.join(diff)}"
        return "the stored object is gone or corrupt"

    def command_blocker(self, c: Compile, names: list[str]) -> str | None:
        """Why differing identifiers cannot be waived for what the command itself says, or None."""
        rest, _d = split_defines(self.pmap.canonical(c.argv))
        others = " ".join(rest) + " " + " ".join(self.env.get(k, "") for k in ("NVCC_PREPEND_FLAGS",
                                                                                 "NVCC_APPEND_FLAGS"))
        if identifier_re(names).search(others.encode()):
            return "one of them appears in the rest of the command"
        return None

    def _waiver_blocker(self, c: Compile, rec: ObjectRecord, names: list[str]) -> str | None:
        """Why the differing identifiers cannot be waived, or None when they appear nowhere."""
        if (blocker := self.command_blocker(c, names)) is not None:
            return blocker
        pattern = identifier_re(names)
        key = ",".join(names)
        for path, _mode, h in rec["inputs"]:
            hit = self._scan.get((h + path, key))
            if hit is None:
                try:
                    hit = pattern.search(Path(self.pmap.local_path(path)).read_bytes()) is not None
                except OSError:
                    hit = True
                self._scan[(h + path, key)] = hit
            if hit:
                return f"{path} mentions one of them"
        return None

    def _use(self, c: Compile, chosen: Chosen) -> ObjectChoice:
        # re-hashed at every use: the blob that holds the object (a packed one's bytes then follow from it;
        # place() checks them against the record as it unpacks them)
        rec = chosen.record
        digest = stored_blob(rec)
        blob = self.store.blob_path(digest)
        if not blob.exists() or fs.sha256_file(blob)[0] != digest:
            if self.store.read_only:
                return ObjectChoice(c, Decision.COMPILED, reason=f"stored object {digest[:12]}… is corrupt")
            self.store.drop_entry(rec["name"])
            self.store.drop_blob(digest)
            return ObjectChoice(c, Decision.COMPILED, reason=f"stored object {digest[:12]}… was corrupt; removed it")
        return ObjectChoice(c, chosen.decision, rec["name"], chosen.waived, record=rec)

    def record(self, c: Compile, producer: Producer, cost: CompileCost | None = None) -> ObjectChoice:
        """After a compile: store the object with its full input list (unless time macros make it unfit) and
        what its compile took."""
        deps = parse_depfile(Path(c.depfile).read_text())
        cwd = os.path.dirname(c.object)
        paths = [d if os.path.isabs(d) else os.path.normpath(os.path.join(cwd, d)) for d in deps]
        mode = RAW if is_debug(c.argv) else STRIPPED
        inputs: list[InputHash] = []
        for p in paths:
            h = self.hasher.hash(p, mode)
            if h is None:
                return ObjectChoice(c, Decision.UNCACHEABLE, reason=f"input {p} vanished during the build")
            inputs.append((self.pmap.canonical_path(p), mode, h))
        for p in paths:
            if self.hasher.temporal(p):
                return ObjectChoice(c, Decision.UNCACHEABLE, reason=f"{p} uses __DATE__/__TIME__/__TIMESTAMP__")
        lk = self.lookup(c)
        command = self.pmap.canonical(c.argv)
        rest, defines = split_defines(command)
        key = object_key(lk, defines, inputs)
        name = entry_name(key, "obj-" + os.path.basename(c.object))
        data = Path(c.object).read_bytes()
        digest = fs.sha256_bytes(data)
        with self.store.build_entry(name) as staging:
            if staging is not None:
                packed = None if self.store.use_blob(digest) else self._pack(data)
                if packed is None:
                    # the blob is an inode of its own: a later compile rewrites the build folder's object
                    self.store.put_blob_bytes(data)
                staging.record = {
                    "format": STORE_FORMAT, "name": name, "kind": "object", "key": key, "lookup": lk,
                    "source": c.rel, "object": digest, "size": len(data), "inputs": inputs,
                    "defines": dict(sorted(defines.items())), "argv": rest, "command": command,
                    "output": self.pmap.canonical_path(c.object), "env": self._env(c),
                    "toolchain": self.toolchain, "host": self.host, "root": self._root_pin(c), "built_by": producer,
                    "refs": [blob_ref(packed["blob"] if packed else digest)]}
                if packed is not None:
                    staging.record["packed"] = packed
                if cost is not None:
                    staging.record["cost"] = cost
                if "--objdir-as-tempdir" in c.map_flags:
                    staging.record["temps"] = "objdir"
        self.store.index_add(lk, name)
        return ObjectChoice(c, Decision.COMPILED, name, record=self.store.object_record(name))

    def _pack(self, data: bytes) -> Packed | None:
        """Store the object zstd-compressed when that pays (see PACK_RATIO); its description, else None."""
        import zstandard
        packed = zstandard.ZstdCompressor(level=PACK_LEVEL).compress(data)
        if len(packed) > PACK_RATIO * len(data):
            return None
        return {"codec": "zstd", "blob": self.store.put_blob_bytes(packed), "size": len(packed)}

    def adopt(self, rec: ObjectRecord) -> None:
        """Publish an object record made elsewhere (the remote cache; its blob already verified in the store,
        raw) and list it under its lookup key, where find() then sees it like any other."""
        with self.store.build_entry(rec["name"]) as staging:
            if staging is not None:
                local: ObjectRecord = {**rec, "refs": [blob_ref(rec["object"])]}
                local.pop("packed", None)
                staging.record = local
        self.store.index_add(rec["lookup"], rec["name"])

    def place(self, d: ObjectChoice) -> None:
        """Put a reused object where the link step expects it: a hard link to its blob, or its unpacked bytes."""
        assert d.record is not None
        obj = Path(d.compile.object)
        obj.parent.mkdir(parents=True, exist_ok=True)
        if obj.exists() or obj.is_symlink():
            obj.unlink()
        if not d.record.get("packed"):
            fs.link_or_copy(self.store.blob_path(d.record["object"]), obj)
            return
        data = object_bytes(self.store, d.record)
        if data is None:  # _use checked its blob a moment ago: only a concurrent corruption gets here
            raise WorkFailed(f"the stored object {d.record['name']} changed while it was being reused",
                             where=str(self.store.blob_path(stored_blob(d.record))),
                             hint="run `hermetic verify --repair`, then realize again")
        fs.atomic_write(obj, data, durable=False)


def producer_record(recipe: str, variant: str, module: str) -> Producer:
    return {"recipe": recipe, "variant": variant, "module": module, "host": os.uname().nodename,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
