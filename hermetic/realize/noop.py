"""Step 0 of realize: has anything changed since the last realize of this recipe?

PRODUCT.md: a no-op trusts a recorded stat fingerprint (size, mtime_ns, inode, ctime_ns) of each input.
This module imports nothing heavy, so an unchanged realize parses no lock, imports neither packaging,
installer, requests nor torch, and touches nothing in the store.
"""

from __future__ import annotations

import json
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


def _state_path(root: Root, recipe_path: Path, variant: str | None) -> Path:
    key = f"{recipe_path.resolve()}\0{variant or ''}"
    return root.state / "realize" / (fs.sha256_bytes(key.encode())[:24] + ".json")


def _fingerprints(recipe_path: Path, paths: list[Path]) -> dict[str, Any]:
    # the running interpreter is an input too: its tags and markers chose the wheels
    every = [recipe_path.resolve(), *paths, Path(sys.executable).resolve()]
    return {str(p): fs.fingerprint(p) for p in every}


def record_inputs(root: Root, recipe_path: Path, variant: str | None, paths: list[Path], outcome: Outcome) -> None:
    state = {"format": 1, "name": outcome.name, "inputs": _fingerprints(recipe_path, paths),
             "locks": [str(p) for p in paths], "tree": outcome.tree, "entries": outcome.entries,
             "counts": outcome.counts, "profile": os.readlink(outcome.profile),
             "receipt": str(outcome.receipt) if outcome.receipt else None}
    path = _state_path(root, recipe_path, variant)
    data = fs.canonical_json(state)
    if not (path.exists() and path.read_bytes() == data):
        fs.atomic_write(path, data, durable=False)


def noop_check(root: Root, recipe_path: Path, variant: str | None = None) -> Outcome | None:
    """The previous outcome when no input changed and every entry is still there, else None."""
    try:
        state = json.loads(_state_path(root, recipe_path, variant).read_text())
        locks = [Path(p) for p in state["locks"]]
        recorded = {k: tuple(v) if v else None for k, v in state["inputs"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if recorded != _fingerprints(recipe_path, locks):
        return None
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
    return Outcome(state["name"], recipe_path.resolve(), profile, state["tree"], state["entries"],
                   counts, {}, receipt, changed=False)
