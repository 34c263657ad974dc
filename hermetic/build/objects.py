"""Certified object reuse: compiled objects in the store, found by input hash, every reuse proven.

An *object entry* records one compile: the lookup key (toolchain, command without defines and output,
the environment variables that change compiler output), the defines, and every input the compiler read
(its full -MD dependency list, system headers included) with the hash of its content: raw bytes under debug
or line-info flags, else the bytes with comments removed and every line kept. ``index/<lookup>/`` lists
the entries compiled under a lookup key; a compile reuses one when every recorded input still hashes the
same and, where the defines differ (another variant), no differing identifier occurs in any input or in
the rest of the command. Inputs using __DATE__, __TIME__ or __TIMESTAMP__ are never recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.build.plan import Compile
from hermetic.errors import WorkFailed
from hermetic.keys import (
    TEMPORAL,
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
from hermetic.store import Store, entry_name

RAW, STRIPPED = "raw", "stripped"
# An object is stored zstd-compressed (``meta["packed"]``) when that saves at least a quarter of its bytes:
# host objects shrink about 4x; objects whose device code nvcc already compressed barely shrink and stay raw.
PACK_LEVEL, PACK_RATIO = 3, 0.75
# find() knows only that no stored object matched; --explain then names the component that changed
NO_MATCH = "no object compiled with this command and toolchain"
INPUT_CHANGED = "an input changed since the stored objects were compiled"


def object_bytes(store: Store, meta: dict[str, Any]) -> bytes | None:
    """An object record's bytes (unpacked if it is stored compressed); None unless they hash to the record."""
    import zstandard
    packed = meta.get("packed")
    try:
        if packed:
            data = store.blob_path(packed["blob"]).read_bytes()
            if fs.sha256_bytes(data) != packed["blob"]:  # the blob itself first: zstd ignores trailing bytes
                return None
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=int(meta["size"]))
        else:
            data = store.blob_path(meta["object"]).read_bytes()
    except (OSError, zstandard.ZstdError, KeyError, TypeError, ValueError):
        return None
    return data if fs.sha256_bytes(data) == meta["object"] else None


def stored_blob(meta: dict[str, Any]) -> str:
    """The blob an object record keeps its bytes in: the compressed one, else the object's own."""
    packed = meta.get("packed")
    return str(packed["blob"]) if packed else str(meta["object"])


class InputHasher:
    """Content hashes of input files, trusted while their stat fingerprint is unchanged (state/hashes.json)."""

    def __init__(self, root: Root) -> None:
        self.path = root.state / "hashes.json"
        try:
            self.cache: dict[str, list[Any]] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.cache = {}
        self.dirty = False
        self.rehashed = 0

    def hash(self, path: str, mode: str) -> str | None:
        """sha256 of the file's bytes (raw) or of its comment-stripped bytes; None if it is gone."""
        fp = fs.fingerprint(path)
        if fp is None:
            return None
        rec = self.cache.get(path)
        if rec is None or rec[0] != list(fp):
            try:
                data = Path(path).read_bytes()
            except OSError:
                return None
            rec = [list(fp), fs.sha256_bytes(data), None, False]
            self.cache[path] = rec
            self.dirty = True
            self.rehashed += 1
        if mode == STRIPPED and rec[2] is None:
            self._strip(path, rec)
        return str(rec[1] if mode == RAW else rec[2])

    def temporal(self, path: str) -> bool:
        """Whether the file uses __DATE__, __TIME__ or __TIMESTAMP__ outside comments (cached with its hash)."""
        if self.hash(path, RAW) is None:
            return True
        rec = self.cache[path]
        if len(rec) < 4 or rec[2] is None:
            self._strip(path, rec)
        return bool(rec[3])

    def _strip(self, path: str, rec: list[Any]) -> None:
        stripped = strip_comments(Path(path).read_bytes())
        rec[2:] = [fs.sha256_bytes(stripped), TEMPORAL.search(stripped) is not None]
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            fs.atomic_write(self.path, fs.canonical_json(self.cache), durable=False)
            self.dirty = False


@dataclass
class Decision:
    compile: Compile
    decision: str                    # compiled, reused, reused-variant, fetched-remote, compiled-uncacheable
    entry: str | None = None         # the object entry used or recorded
    waived: list[str] = field(default_factory=list)
    reason: str = ""                 # why it was compiled (for --explain)
    meta: dict[str, Any] | None = None
    weight: int = 0                  # inputs the last compile of this source read: a proxy for its cost


class ObjectCache:
    def __init__(self, root: Root, store: Store, toolchain: dict[str, Any], env: dict[str, str]) -> None:
        self.root, self.store, self.toolchain, self.env = root, store, toolchain, env
        self.hasher = InputHasher(root)
        self.index = store.path / "index"
        self._scan: dict[tuple[str, str], bool] = {}

    def lookup(self, c: Compile) -> str:
        return lookup_key("nvcc" if c.cuda else "cxx", c.argv, self.env, self.toolchain)

    def find(self, c: Compile) -> Decision:
        """A stored object this compile may use, with the proof; or a 'compile' decision saying why not."""
        lk = self.lookup(c)
        folder = self.index / lk[:2] / lk
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
        if not names:
            return Decision(c, "compiled", reason=NO_MATCH)
        chosen = self.choose(c, [self.store.entry_meta(name) for name in names if self.store.use(name)])
        if isinstance(chosen, Decision):
            return chosen
        meta, decision, waived = chosen
        return self._use(c, meta, decision, waived)

    def choose(self, c: Compile, metas: list[dict[str, Any]]) -> tuple[dict[str, Any], str, list[str]] | Decision:
        """The object record (of this compile's lookup key) that it may use, with its decision and waived
        identifiers; else a 'compiled' decision saying why none fits. Records may come from the remote."""
        _rest, defines = split_defines(c.argv)
        candidates = [meta for meta in metas
                      if all(self.hasher.hash(p, mode) == h for p, mode, h in meta["inputs"])]
        if not candidates:
            return Decision(c, "compiled", reason=INPUT_CHANGED if metas else NO_MATCH)
        weight = max(len(m["inputs"]) for m in candidates)
        # an exact match first, then one from another variant whose differing defines can be waived
        for meta in candidates:
            if not differing_defines(defines, meta["defines"]):
                return meta, "reused", []
        for meta in candidates:
            diff = differing_defines(defines, meta["defines"])
            blocker = self._waiver_blocker(c, meta, diff)
            if blocker is None:
                return meta, "reused-variant", diff
        return Decision(c, "compiled", reason=f"defines differ ({', '.join(diff)}) and {blocker}", weight=weight)

    def explain(self, c: Compile, previous: dict[str, Any] | None) -> str:
        """The first key component that differs from the object this source had in the previous build."""
        if previous is None:
            return "no previous object of this source"
        kind = "nvcc" if c.cuda else "cxx"
        if previous.get("toolchain") != self.toolchain:
            changed = sorted(k for k in set(self.toolchain) | set(previous.get("toolchain", {}))
                             if self.toolchain.get(k) != previous.get("toolchain", {}).get(k))
            return f"the toolchain changed ({', '.join(changed)})"
        env, old_env = key_env(kind, self.env), previous.get("env", {})
        for k in sorted(set(env) | set(old_env)):
            if env.get(k) != old_env.get(k):
                return f"environment variable {k} changed: {old_env.get(k)!r} -> {env.get(k)!r}"
        rest, defines = split_defines(c.argv)
        old = previous.get("argv", [])
        for i, (a, b) in enumerate(zip(old, rest, strict=False)):
            if a != b:
                return f"command argument {i} changed: {a!r} -> {b!r}"
        if len(old) != len(rest):
            return f"command changed length: {len(old)} -> {len(rest)} arguments"
        for path, mode, h in previous.get("inputs", []):
            now = self.hasher.hash(path, mode)
            if now is None:
                return f"input {path} is gone"
            if now != h:
                return f"input {path} changed"
        diff = differing_defines(defines, previous.get("defines", {}))
        if diff:
            return f"defines changed: {', '.join(diff)}"
        return "the stored object is gone or corrupt"

    def _waiver_blocker(self, c: Compile, meta: dict[str, Any], names: list[str]) -> str | None:
        """Why the differing identifiers cannot be waived, or None when they appear nowhere."""
        rest, _d = split_defines(c.argv)
        pattern = identifier_re(names)
        others = " ".join(rest) + " " + " ".join(self.env.get(k, "") for k in ("NVCC_PREPEND_FLAGS",
                                                                                 "NVCC_APPEND_FLAGS"))
        if pattern.search(others.encode()):
            return "one of them appears in the rest of the command"
        key = ",".join(names)
        for path, _mode, h in meta["inputs"]:
            hit = self._scan.get((h + path, key))
            if hit is None:
                try:
                    hit = pattern.search(Path(path).read_bytes()) is not None
                except OSError:
                    hit = True
                self._scan[(h + path, key)] = hit
            if hit:
                return f"{path} mentions one of them"
        return None

    def _use(self, c: Compile, meta: dict[str, Any], decision: str, waived: list[str]) -> Decision:
        # re-hashed at every use: the blob that holds the object (a packed one's bytes then follow from it;
        # place() checks them against the record as it unpacks them)
        digest = stored_blob(meta)
        blob = self.store.blob_path(digest)
        if not blob.exists() or fs.sha256_file(blob)[0] != digest:
            trash = self.store.invalidate(meta["name"])
            if trash is not None:
                fs.remove_tree(trash)
            if blob.exists():
                os.chmod(blob, 0o644)
                blob.unlink()
            return Decision(c, "compiled", reason=f"stored object {digest[:12]}… was corrupt; removed it")
        return Decision(c, decision, meta["name"], waived, meta=meta)

    def record(self, c: Compile, producer: dict[str, Any]) -> Decision:
        """After a compile: store the object with its full input list (unless time macros make it unfit)."""
        deps = parse_depfile(Path(c.depfile).read_text())
        cwd = os.path.dirname(c.object)
        paths = [d if os.path.isabs(d) else os.path.normpath(os.path.join(cwd, d)) for d in deps]
        mode = RAW if is_debug(c.argv) else STRIPPED
        inputs = []
        for p in paths:
            h = self.hasher.hash(p, mode)
            if h is None:
                return Decision(c, "compiled-uncacheable", reason=f"input {p} vanished during the build")
            inputs.append([p, mode, h])
        for p in paths:
            if self.hasher.temporal(p):
                return Decision(c, "compiled-uncacheable", reason=f"{p} uses __DATE__/__TIME__/__TIMESTAMP__")
        lk = self.lookup(c)
        rest, defines = split_defines(c.argv)
        name = entry_name(object_key(lk, defines, inputs), "obj-" + os.path.basename(c.object))
        obj = Path(c.object)
        data = obj.read_bytes()
        digest, size = fs.sha256_bytes(data), len(data)
        with self.store.build_entry(name) as staging:
            if staging is not None:
                packed = None if self.store.use_blob(digest) else self._pack(data)
                if packed is None and not self.store.use_blob(digest):
                    # the blob must be its own inode: a later compile rewrites the build folder's object
                    with fs.scratch_file(self.store.tmp, "obj-") as tmp:
                        shutil.copyfile(obj, tmp)
                        self.store.put_blob_file(tmp, digest)
                if packed is not None:
                    staging.meta["packed"] = packed
                staging.meta.update({"kind": "object", "name": name, "key": object_key(lk, defines, inputs),
                                     "lookup": lk, "source": c.rel,
                                     "object": digest, "size": size, "inputs": inputs,
                                     "defines": dict(sorted(defines.items())), "argv": rest,
                                     "command": list(c.argv), "output": c.object,
                                     "env": key_env("nvcc" if c.cuda else "cxx", self.env),
                                     "toolchain": self.toolchain, "built_by": producer,
                                     "refs": [f"blob:{packed['blob'] if packed else digest}"]})
        self._index(lk, name)
        return Decision(c, "compiled", name, meta=self.store.entry_meta(name))

    def _pack(self, data: bytes) -> dict[str, Any] | None:
        """Store the object zstd-compressed when that pays (see PACK_RATIO); its description, else None."""
        import zstandard
        packed = zstandard.ZstdCompressor(level=PACK_LEVEL).compress(data)
        if len(packed) > PACK_RATIO * len(data):
            return None
        return {"codec": "zstd", "blob": self.store.put_blob_bytes(packed), "size": len(packed)}

    def adopt(self, meta: dict[str, Any]) -> None:
        """Publish an object record made elsewhere (the remote cache; its blob already verified in the store)
        and list it under its lookup key, where find() then sees it like any other."""
        with self.store.build_entry(meta["name"]) as staging:
            if staging is not None:
                staging.meta.update({**{k: v for k, v in meta.items() if k != "packed"},
                                     "refs": [f"blob:{meta['object']}"]})
        self._index(meta["lookup"], meta["name"])

    def _index(self, lk: str, name: str) -> None:
        link = self.index / lk[:2] / lk / name
        fs.atomic_symlink(os.path.relpath(self.store.entry_path(name), link.parent), link)

    def place(self, d: Decision) -> None:
        """Put a reused object where the link step expects it: a hard link to its blob, or its unpacked bytes."""
        assert d.meta is not None
        obj = Path(d.compile.object)
        obj.parent.mkdir(parents=True, exist_ok=True)
        if obj.exists() or obj.is_symlink():
            obj.unlink()
        if not d.meta.get("packed"):
            fs.link_or_copy(self.store.blob_path(d.meta["object"]), obj)
            return
        data = object_bytes(self.store, d.meta)
        if data is None:  # _use checked its blob a moment ago: only a concurrent corruption gets here
            raise WorkFailed(f"the stored object {d.meta['name']} changed while it was being reused",
                             where=str(self.store.blob_path(stored_blob(d.meta))),
                             hint="run `hermetic verify --repair`, then realize again")
        fs.atomic_write(obj, data, durable=False)


def producer_record(recipe: str, variant: str, module: str) -> dict[str, Any]:
    return {"recipe": recipe, "variant": variant, "module": module, "host": os.uname().nodename,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
