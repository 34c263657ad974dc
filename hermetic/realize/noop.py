"""Step 0 of realize: has anything changed since the last realize of this recipe?

PRODUCT.md: a no-op trusts a recorded stat fingerprint (size, mtime_ns, inode, ctime_ns) of each input.
This module imports nothing heavy, so an unchanged realize parses no lock, imports neither packaging,
installer, requests nor torch, and touches nothing in the store.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

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


def record_inputs(root: Root, recipe_path: Path, variant: str | None, paths: list[Path], outcome: Outcome) -> None:
    """What a later no-op trusts: the fingerprints of the recipe, every input it read and the running
    interpreter (its tags and markers chose the wheels), and what this realize produced."""
    value = {"name": outcome.name, "tree": outcome.tree, "entries": outcome.entries, "counts": outcome.counts,
             "profile": os.readlink(outcome.profile), "receipt": str(outcome.receipt) if outcome.receipt else None,
             "python": outcome.python, "archs": outcome.archs, "cuda": outcome.cuda}
    inputs = [fs.resolve(recipe_path), *paths, Path(sys.executable).resolve()]
    root.cache("realize").put(_key(recipe_path, variant), value, inputs)


def noop_check(root: Root, recipe_path: Path, variant: str | None = None) -> Outcome | None:
    """The previous outcome when no input changed and every entry is still there, else None."""
    state = root.cache("realize").get(_key(recipe_path, variant))
    if not isinstance(state, dict):
        return None
    try:
        store = Store(root.store)
        profile = root.profiles / state["name"]
        if not store.exists() or not all(store.use(e) for e in state["entries"]):
            return None
        if not profile.is_symlink() or os.readlink(profile) != state["profile"]:
            return None
        if not (root.roots / f"{state['name']}.json").exists():
            return None
        receipt = Path(state["receipt"]) if state.get("receipt") else None
        wheels = int(state["counts"].get("wheels", 0))
        counts = {"wheels": wheels, "fetched": 0, "fetched_bytes": 0, "unpacked": 0, "reused": wheels,
                  "files": int(state["counts"].get("files", 0))}
        if "objects_objects" in state["counts"]:
            n = int(state["counts"]["objects_objects"])
            counts.update({"objects_objects": n, "objects_reused": n, "objects_compiled": 0})
        return Outcome(state["name"], fs.resolve(recipe_path), profile, state["tree"], list(state["entries"]),
                       counts, {}, receipt, changed=False, python=state["python"], archs=list(state["archs"]),
                       cuda=state["cuda"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a record of another shape: re-derive it
