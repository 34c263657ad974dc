"""Step 0 of realize: has anything changed since the last realize of this recipe?

PRODUCT.md: a no-op trusts a recorded stat fingerprint (size, mtime_ns, inode, ctime_ns) of each input.
When a fingerprint changed but the bytes did not (a fresh checkout, a copy of the recipe's folder at the same
path or another, `touch`), the files of the recipe (the recipe, its locks, patches and folder sources) are
hashed again and compared with the hashes the last realize recorded, found by the recipe's own hash; the
host's files (the interpreter, torch, the compilers, and every input outside the root that the build's object
records list: ``outside_inputs``) must keep their fingerprints. Equal: still a no-op,
whose only writes are the refreshed fingerprints and, for a recipe at a new path, the gc root's recipe path.

This module imports nothing heavy, so an unchanged realize parses no lock, imports neither packaging,
installer, requests nor torch, and touches nothing in the store.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.reporter import plural
from hermetic.root import Root
from hermetic.store import Store

# The one place a count's key is spelled (tests/test_shape.py): (attribute, JSON key). An object key is
# "objects_" and the compile room's decision (``extensions.objects.Decision``), so the two vocabularies meet here.
WHEEL_KEYS = (("wheels", "wheels"), ("fetched", "fetched"), ("fetched_bytes", "fetched_bytes"),
              ("unpacked", "unpacked"), ("reused", "reused"), ("files", "files"))
OBJECT_KEYS = (("compiled", "objects_compiled"), ("uncacheable", "objects_compiled-uncacheable"),
               ("reused", "objects_reused"), ("reused_variant", "objects_reused-variant"),
               ("fetched_remote", "objects_fetched-remote"))
TOTAL_KEY, LINKED_KEY = "objects", "modules_linked"
LEGACY = {"objects_objects": TOTAL_KEY}   # receipts and no-op records before receipt format 2


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a count is a whole number, not {value!r}")
    return value


class ObjectCounts:
    """What became of a realize's objects: a count per decision (plain slots: the no-op creates it)."""
    __slots__ = ("compiled", "uncacheable", "reused", "reused_variant", "fetched_remote")

    def __init__(self, compiled: int = 0, uncacheable: int = 0, reused: int = 0, reused_variant: int = 0,
                 fetched_remote: int = 0) -> None:
        self.compiled, self.uncacheable, self.reused = compiled, uncacheable, reused
        self.reused_variant, self.fetched_remote = reused_variant, fetched_remote

    @property
    def total(self) -> int:
        return self.compiled + self.uncacheable + self.reused + self.reused_variant + self.fetched_remote

    @classmethod
    def from_decisions(cls, tally: Mapping[str, int]) -> ObjectCounts:
        """From a tally by decision, as the compile room counts them (``{"compiled": 3, "reused-variant": 1}``)."""
        return cls(**{attr: int(tally.get(key.removeprefix("objects_"), 0)) for attr, key in OBJECT_KEYS})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectCounts) and all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self) -> str:
        return "ObjectCounts(" + ", ".join(f"{a}={getattr(self, a)}" for a in self.__slots__) + ")"


class Counts:
    """What a realize did, or would do: the receipt's, the no-op record's, the dry run's and the result's counts,
    in one JSON form (``to_json``). ``objects`` and ``modules_linked`` are None for a recipe that builds nothing
    (no object keys in the JSON); for one that builds, every object key is there, zero or not."""
    __slots__ = ("wheels", "fetched", "fetched_bytes", "unpacked", "reused", "files", "objects", "modules_linked")

    def __init__(self, wheels: int = 0, fetched: int = 0, fetched_bytes: int = 0, unpacked: int = 0,
                 reused: int = 0, files: int = 0, objects: ObjectCounts | None = None,
                 modules_linked: int | None = None) -> None:
        self.wheels, self.fetched, self.fetched_bytes = wheels, fetched, fetched_bytes
        self.unpacked, self.reused, self.files = unpacked, reused, files
        self.objects = objects
        self.modules_linked = modules_linked if modules_linked is not None or objects is None else 0

    def to_json(self) -> dict[str, int]:
        out = {key: getattr(self, attr) for attr, key in WHEEL_KEYS}
        if self.objects is not None:
            out[TOTAL_KEY] = self.objects.total
            out.update({key: getattr(self.objects, attr) for attr, key in OBJECT_KEYS})
            out[LINKED_KEY] = self.modules_linked or 0
        return out

    @classmethod
    def from_json(cls, value: object) -> Counts:
        """A counts block as any hermetic wrote it: a missing key is 0, an unknown one (a newer hermetic's)
        ignored, ``objects_objects`` read as ``objects``; ValueError for one that is not a count."""
        if not isinstance(value, dict):
            raise ValueError(f"counts are a JSON object, not {type(value).__name__}")
        value = {LEGACY.get(k, k): v for k, v in value.items()}
        wheels = {attr: _count(value.get(key, 0)) for attr, key in WHEEL_KEYS}
        objects = None
        if TOTAL_KEY in value or any(key in value for _a, key in OBJECT_KEYS):
            objects = ObjectCounts(**{attr: _count(value.get(key, 0)) for attr, key in OBJECT_KEYS})
            _count(value.get(TOTAL_KEY, 0))   # the sum of the others: read as a check only
        linked = _count(value[LINKED_KEY]) if LINKED_KEY in value else None
        return cls(**wheels, objects=objects, modules_linked=linked)

    def noop(self) -> Counts:
        """The counts of a realize that changed nothing, from the last one that did: every wheel reused, every
        object reused as it would be found now (another variant's object still counts across variants)."""
        objects = None
        if self.objects is not None:
            across = self.objects.reused_variant
            objects = ObjectCounts(reused=self.objects.total - across, reused_variant=across)
        return Counts(self.wheels, reused=self.wheels, files=self.files, objects=objects,
                      modules_linked=0 if objects is not None else None)

    def say(self) -> str:
        """The counts as the command's closing line says them."""
        o = self.objects
        objects = "" if o is None else (
            f"; objects: {o.compiled} compiled, {o.reused} reused, {o.reused_variant} reused across variants"
            + (f", {o.fetched_remote} from the remote cache" if o.fetched_remote else ""))
        return (f"{plural(self.wheels, 'wheels')}: {self.fetched} fetched, {self.unpacked} unpacked, "
                f"{self.reused} reused{objects}; {plural(self.files, 'files')}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counts) and all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self) -> str:
        return "Counts(" + ", ".join(f"{a}={getattr(self, a)!r}" for a in self.__slots__) + ")"


@dataclass
class Outcome:
    name: str
    recipe_path: Path
    profile: Path
    tree: str
    entries: list[str]
    counts: Counts = field(default_factory=Counts)
    timings: dict[str, float] = field(default_factory=dict)
    receipt: Path | None = None
    changed: bool = False
    python: str | None = None          # the recipe's host interpreter (None: the one running hermetic)
    archs: list[str] = field(default_factory=list)   # GPU architectures its modules were built for
    cuda: str | None = None            # its toolchain's CUDA release


def _key(recipe_path: Path, variant: str | None) -> str:
    return f"{fs.resolve(recipe_path)}\0{variant or ''}"


def _content_key(recipe_sha256: str, variant: str | None) -> str:
    return f"sha256:{recipe_sha256}\0{variant or ''}"


def _content(path: Path) -> str | None:
    """A file's sha256, a folder's listing's; None when it is gone."""
    try:
        if path.is_dir():
            return "dir:" + fs.sha256_bytes("\0".join(sorted(os.listdir(path))).encode())
        return fs.sha256_file(path)[0]
    except OSError:
        return None


def record_inputs(root: Root, recipe_path: Path, variant: str | None, local: list[Path], host: list[Path],
                  outcome: Outcome, links: list[str] | None = None) -> None:
    """What a later no-op trusts: the fingerprints of the recipe, of every file it read (``local``: locks,
    patches, folder sources) and of the host's files (``host``: interpreters, torch, compilers; the running
    interpreter's tags and markers chose the wheels), with the hashes of the recipe's files for a copy of them,
    and what this realize produced: its profile and the other profiles it made (``links``: names under
    profiles/, a recipe that builds has its toolchain's), each with its target."""
    recipe = fs.resolve(recipe_path)
    base = recipe.parent
    hashes = {os.path.relpath(p, base): _content(p) for p in local}
    host_files = [str(p) for p in [*host, Path(sys.executable).resolve()]]
    try:
        profile = os.readlink(outcome.profile)
        targets = {name: os.readlink(root.profiles / name) for name in links or ()}
    except FileNotFoundError:   # `gc --drop-root` forgot the recipe meanwhile: no no-op for what is forgotten
        return
    value: dict[str, Any] = {
             "name": outcome.name, "tree": outcome.tree, "entries": outcome.entries,
             "counts": outcome.counts.to_json(),
             "profile": profile, "links": targets, "receipt": str(outcome.receipt) if outcome.receipt else None,
             "python": outcome.python, "archs": outcome.archs, "cuda": outcome.cuda,
             "local": hashes, "host": host_files}
    cache = root.cache("realize")
    cache.put(_key(recipe_path, variant), value, [recipe, *local, *host_files])
    digest = _content(recipe)
    if digest is not None:  # found by the recipe's bytes wherever it is; valid while the host is unchanged
        cache.put(_content_key(digest, variant), value, host_files)


def outside_inputs(root: Root, inputs: list[str]) -> list[Path]:
    """The files outside the root among a build's object inputs (as its object records list them): a header
    #included by absolute path, the host's system headers. A no-op trusts them by fingerprint as it trusts the
    host's files; a changed one sends the realize on to its object lookup, which re-hashes every input
    (docs/reuse.md). Fixed names (``/hermetic/...``: the root, the build's folders, the host's torch and
    Python headers, covered by the interpreter's and torch's own fingerprints) are no files of the host."""
    inside = (fs.resolve(root.path), root.path)
    out: set[Path] = set()
    for p in inputs:
        if not os.path.isabs(p) or p.startswith("/hermetic/"):
            continue
        q = Path(p)
        if not any(q.is_relative_to(r) for r in inside) and q.is_file():
            out.add(q)
    return sorted(out)


def noop_check(root: Root, recipe_path: Path, variant: str | None = None) -> Outcome | None:
    """The previous outcome when no input changed and every entry is still there, else None."""
    cache = root.cache("realize")
    state = cache.get(_key(recipe_path, variant))
    if isinstance(state, dict):
        return _outcome(root, state, recipe_path, variant)
    return _same_bytes(root, recipe_path, variant)


def _same_bytes(root: Root, recipe_path: Path, variant: str | None) -> Outcome | None:
    """A no-op for a recipe whose files have new fingerprints and the recorded bytes (module docstring)."""
    recipe = fs.resolve(recipe_path)
    digest = _content(recipe)
    cache = root.cache("realize")
    state = cache.get(_content_key(digest, variant)) if digest is not None else None
    if not isinstance(state, dict):
        return None
    try:
        local = {recipe.parent / rel: h for rel, h in state["local"].items()}
        host = [str(p) for p in state["host"]]
    except (KeyError, TypeError, AttributeError):
        return None
    if any(_content(p) != h for p, h in local.items()):
        return None
    outcome = _outcome(root, state, recipe_path, variant)
    if outcome is None:
        return None
    if root.read_only:  # a dry run: the same answer, nothing refreshed
        return outcome
    cache.put(_key(recipe_path, variant), state, [recipe, *local, *host])  # its bytes, trusted by fingerprint
    from hermetic.store.roots import root_owner, write_root  # the common no-op (fingerprints unchanged) needs it not
    owner = root_owner(_recipe_name(state, variant), variant)
    write_root(root, outcome.name, recipe, outcome.entries, owner)   # a new recipe path is no change to the gc root
    return outcome


def _toolchain_link_then(root: Root, state: dict[str, Any], variant: str | None) -> dict[str, str] | None:
    """The toolchain's profile of a record written before records named it (an older hermetic's build): taken
    as that realize left it when it points at an entry the record holds (the toolchain's tree is one of the
    realize's entries), so the first realize after an upgrade stays a no-op; else None (realize again)."""
    label = f"{_recipe_name(state, variant)}.toolchain"
    try:
        target = os.readlink(root.profiles / label)
    except OSError:
        return None
    parts = target.split("/")
    if len(parts) != 5 or parts[:3] != ["..", "store", "entries"] or parts[4] != "out" \
            or parts[3] not in state["entries"]:
        return None
    return {label: target}


def _owned_by_another(root: Root, name: str, recipe: str, variant: str | None) -> bool:
    """Whether the gc root ``name`` is not recipe ``recipe``'s ``variant`` (roots.root_owner; read here without
    importing the records' module, which a no-op does not need otherwise). A malformed owner counts as another's
    (the realize then says what is wrong with it); a root an older hermetic wrote, without an owner, gets this
    one's when its recipe file says it is this recipe's (``roots.owner_in_root``)."""
    path = root.roots / f"{name}.json"
    mine = {"recipe": recipe, "variant": variant or ""}
    try:
        record = json.loads(fs.read_regular(path, 1 << 20))
        owner = record.get("owner")
    except (OSError, ValueError, AttributeError):
        return False   # unreadable: the realize's own checks say what is wrong with it
    if owner is not None:
        return bool(owner != mine)
    from hermetic.errors import BadRecord
    from hermetic.store.roots import owner_in_root  # only for an older hermetic's root
    try:
        if owner_in_root(root, name) not in (None, mine):
            return True
    except BadRecord:
        return True
    if not root.read_only:
        fs.atomic_write(path, fs.pretty_json({**record, "owner": mine}))
    return False


def _recipe_name(state: dict[str, Any], variant: str | None) -> str:
    return str(state["name"]) if variant is None else str(state["name"]).removesuffix(f".{variant}")


def _outcome(root: Root, state: dict[str, Any], recipe_path: Path, variant: str | None) -> Outcome | None:
    try:
        store = Store(root.store)
        profile = root.profiles / state["name"]
        held = store.has_entry if root.read_only else store.use   # a dry run pins nothing (no temp root)
        if not store.exists() or not all(held(e) for e in state["entries"]):
            return None
        if not profile.is_symlink() or os.readlink(profile) != state["profile"]:
            return None
        links = state.get("links")
        if links is None and state.get("cuda") is not None:
            links = _toolchain_link_then(root, state, variant)
            if links is None:
                return None
        for link, target in (links or {}).items():   # the toolchain's profile: there, and what the realize made
            if "/" in link or not isinstance(target, str) or not (root.profiles / link).is_symlink() \
                    or os.readlink(root.profiles / link) != target:
                return None
        if not (root.roots / f"{state['name']}.json").exists():
            return None
        if _owned_by_another(root, state["name"], _recipe_name(state, variant), variant):
            return None   # another recipe's root of that name now: the realize says so (pipeline.check_owner)
        receipt = Path(state["receipt"]) if state.get("receipt") else None
        if receipt is not None and not receipt.exists():
            # gc --drop-root removed it, and a realize killed after writing the root (before its own receipt
            # and this record) put the root back: realize again, which writes a receipt this record names
            return None
        return Outcome(state["name"], fs.resolve(recipe_path), profile, state["tree"], list(state["entries"]),
                       Counts.from_json(state["counts"]).noop(), {}, receipt, changed=False, python=state["python"],
                       archs=list(state["archs"]), cuda=state["cuda"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a record of another shape: re-derive it
