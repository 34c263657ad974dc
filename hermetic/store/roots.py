"""gc roots: what keeps entries alive. ``roots/<name>.json`` (one per realized recipe or variant, written by
realize), ``receipts/*.json`` (realize and run receipts: gc never deletes a measurement unless asked), the
profiles, and the temp roots of running processes (``store.live_temproots``). gc reads them all here.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from hermetic import fs
from hermetic.root import Root


def root_refs(root: Root, dropped: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    """Every entry and blob reference the roots hold (those of ``dropped`` root names left out)."""
    refs: set[str] = set()
    for folder in (root.roots, root.receipts):
        if not folder.exists():
            continue
        for p in sorted(folder.glob("*.json")):
            try:
                record = json.loads(p.read_text())
            except (OSError, ValueError):
                continue  # an unreadable root protects nothing; verify reports it
            if root_name(record, p) in dropped:
                continue
            refs.update(r for r in record.get("refs", []) if isinstance(r, str))
    if root.profiles.exists():
        for link in root.profiles.iterdir():
            if link.name in dropped or not link.is_symlink():
                continue
            target = Path(os.readlink(link))
            if target.name == "out":
                refs.add(f"entry:{target.parent.name}")
    return refs


def root_name(record: dict[str, object], path: Path) -> str:
    name = record.get("recipe_name") or record.get("name")
    if isinstance(name, str):
        return name
    recipe = record.get("recipe")
    if isinstance(recipe, dict) and isinstance(recipe.get("name"), str):
        return str(recipe["name"])
    return path.stem


def drop_root(root: Root, name: str) -> None:
    """Forget a root: its roots/ record, its profile and its realize receipts (never run results)."""
    with contextlib.suppress(FileNotFoundError):
        (root.roots / f"{name}.json").unlink()
    for p in sorted(root.receipts.glob("*.json")) if root.receipts.exists() else []:
        try:
            record = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if record.get("kind") == "realize" and root_name(record, p) == name:
            p.unlink()
    link = root.profiles / name
    if link.is_symlink():
        link.unlink()


def write_root(root: Root, name: str, recipe_path: Path, entries: list[str]) -> bool:
    """The gc root of a recipe (or one variant of it), rewritten when its entries or its recipe's path change;
    True when the entries changed (a recipe at a new path with the same entries is no change)."""
    record = {"format": 1, "name": name, "recipe": str(recipe_path),
              "profile": name, "refs": [f"entry:{e}" for e in entries]}
    path = root.roots / f"{name}.json"
    data = fs.pretty_json(record)
    try:
        old = path.read_bytes()
    except OSError:
        old = None
    if old == data:
        return False
    fs.atomic_write(path, data)
    try:
        return json.loads(old or b"null")["refs"] != record["refs"]
    except (ValueError, TypeError, KeyError):
        return True
