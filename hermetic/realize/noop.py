"""Step 0 of realize: has anything changed since the last realize of this recipe?

PRODUCT.md: a no-op trusts a recorded stat fingerprint (size, mtime_ns, inode, ctime_ns) of each input.
When a fingerprint changed but the bytes did not (a fresh checkout, a copy of the recipe's folder at the same
path or another, `touch`), the files of the recipe (the recipe, its locks, patches and folder sources) are
hashed again and compared with the hashes the last realize recorded, found by the recipe's own hash; the
host's files (the interpreter, torch, the compilers) must keep their fingerprints. Equal: still a no-op,
whose only writes are the refreshed fingerprints and, for a recipe at a new path, the gc root's recipe path.

This module imports nothing heavy, so an unchanged realize parses no lock, imports neither packaging,
installer, requests nor torch, and touches nothing in the store.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.root import Root
from hermetic.store import Store


@dataclass
class Outcome:
    name: str
    recipe_path: Path
    profile: Path
    tree: str
    entries: list[str]
    counts: dict[str, int] = field(default_factory=dict)
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
                  outcome: Outcome) -> None:
    """What a later no-op trusts: the fingerprints of the recipe, of every file it read (``local``: locks,
    patches, folder sources) and of the host's files (``host``: interpreters, torch, compilers; the running
    interpreter's tags and markers chose the wheels), with the hashes of the recipe's files for a copy of them,
    and what this realize produced."""
    recipe = fs.resolve(recipe_path)
    base = recipe.parent
    hashes = {os.path.relpath(p, base): _content(p) for p in local}
    host_files = [str(p) for p in [*host, Path(sys.executable).resolve()]]
    try:
        profile = os.readlink(outcome.profile)
    except FileNotFoundError:   # `gc --drop-root` forgot the recipe meanwhile: no no-op for what is forgotten
        return
    value: dict[str, Any] = {
             "name": outcome.name, "tree": outcome.tree, "entries": outcome.entries, "counts": outcome.counts,
             "profile": profile, "receipt": str(outcome.receipt) if outcome.receipt else None,
             "python": outcome.python, "archs": outcome.archs, "cuda": outcome.cuda,
             "local": hashes, "host": host_files}
    cache = root.cache("realize")
    cache.put(_key(recipe_path, variant), value, [recipe, *local, *host_files])
    digest = _content(recipe)
    if digest is not None:  # found by the recipe's bytes wherever it is; valid while the host is unchanged
        cache.put(_content_key(digest, variant), value, host_files)


def noop_check(root: Root, recipe_path: Path, variant: str | None = None) -> Outcome | None:
    """The previous outcome when no input changed and every entry is still there, else None."""
    cache = root.cache("realize")
    state = cache.get(_key(recipe_path, variant))
    if isinstance(state, dict):
        return _outcome(root, state, recipe_path)
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
    outcome = _outcome(root, state, recipe_path)
    if outcome is None:
        return None
    if root.read_only:  # a dry run: the same answer, nothing refreshed
        return outcome
    cache.put(_key(recipe_path, variant), state, [recipe, *local, *host])  # its bytes, trusted by fingerprint
    from hermetic.store.roots import write_root  # the common no-op (fingerprints unchanged) needs it not
    write_root(root, outcome.name, recipe, outcome.entries)   # a new recipe path is no change to the gc root
    return outcome


def noop_counts(counts: dict[str, Any]) -> dict[str, int]:
    """The counts of a realize that changed nothing, from the last one that did: every wheel reused, every
    object reused as it would be found now (another variant's object still counts across variants)."""
    wheels = int(counts.get("wheels", 0))
    out = {"wheels": wheels, "fetched": 0, "fetched_bytes": 0, "unpacked": 0, "reused": wheels,
           "files": int(counts.get("files", 0))}
    if "objects_objects" in counts:
        n = int(counts["objects_objects"])
        across = int(counts.get("objects_reused-variant", 0))
        out.update({"objects_objects": n, "objects_reused": n - across, "objects_reused-variant": across,
                    "objects_compiled": 0})
    return out


def _outcome(root: Root, state: dict[str, Any], recipe_path: Path) -> Outcome | None:
    try:
        store = Store(root.store)
        profile = root.profiles / state["name"]
        held = store.has_entry if root.read_only else store.use   # a dry run pins nothing (no temp root)
        if not store.exists() or not all(held(e) for e in state["entries"]):
            return None
        if not profile.is_symlink() or os.readlink(profile) != state["profile"]:
            return None
        if not (root.roots / f"{state['name']}.json").exists():
            return None
        receipt = Path(state["receipt"]) if state.get("receipt") else None
        if receipt is not None and not receipt.exists():
            # gc --drop-root removed it, and a realize killed after writing the root (before its own receipt
            # and this record) put the root back: realize again, which writes a receipt this record names
            return None
        return Outcome(state["name"], fs.resolve(recipe_path), profile, state["tree"], list(state["entries"]),
                       noop_counts(state["counts"]), {}, receipt, changed=False, python=state["python"],
                       archs=list(state["archs"]), cuda=state["cuda"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a record of another shape: re-derive it
