"""gc roots: what keeps entries alive. ``roots/<name>.json`` (one per realized recipe or variant, written by
realize), ``receipts/*.json`` (realize and run receipts: gc never deletes a measurement unless asked), the
profiles, and the temp roots of running processes (``store.live_temproots``). gc reads them all here.

A root or receipt that fails its check (docs/layout.md, "A bad record") makes gc refuse to collect: it cannot
know what that root protects. Nothing here opens anything but a regular file (``records.read_checked``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadRecord
from hermetic.root import Root
from hermetic.store import list_names, lstat_or_none
from hermetic.store.records import read_checked, receipt_problem, root_problem


def root_files(folder: Path) -> list[Path]:
    """The records of a roots/ or receipts/ folder: its ``*.json`` names (a write in progress, ``.name.tmp``,
    is none of them)."""
    return [folder / n for n in list_names(folder) if n.endswith(".json") and not n.startswith(".")]


def read_root(path: Path) -> dict[str, Any]:
    """A gc root (``RootRecord``), checked; BadRecord naming it, FileNotFoundError when it is gone."""
    record: dict[str, Any] = read_checked(path, root_problem, "gc root")
    return record


def read_receipt(path: Path) -> dict[str, Any]:
    """A receipt's head (``ReceiptHead``), checked; BadRecord naming it, FileNotFoundError when it is gone."""
    record: dict[str, Any] = read_checked(path, receipt_problem, "receipt")
    return record


def receipt_owner(path: Path) -> str | None:
    """The recipe a realize receipt's file name says it is for (``<name>-<time>-<digest>.json``); None for a
    run's (``run-...``) or a name of another shape: what a receipt that cannot be read is known by."""
    parts = path.stem.rsplit("-", 2)
    if len(parts) != 3 or path.name.startswith("run-"):
        return None
    return parts[0]


def root_refs(root: Root, dropped: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    """Every entry and blob reference the roots hold (those of ``dropped`` root names left out). A root or a
    receipt that fails its check stops gc (BadRecord, exit 2): what it protects cannot be known, unless it is
    the record of a root being dropped."""
    refs: set[str] = set()
    for folder, read, what in ((root.roots, read_root, "gc root"), (root.receipts, read_receipt, "receipt")):
        for p in root_files(folder):
            try:
                record = read(p)
            except FileNotFoundError:
                continue  # dropped meanwhile
            except BadRecord as bad:
                owner = p.stem if folder == root.roots else receipt_owner(p)
                if owner is not None and owner in dropped:
                    continue
                hint = (f"run `hermetic verify --repair` (which removes it), or `hermetic gc --drop-root "
                        f"{owner or 'NAME'}` to forget it")
                raise BadRecord(f"{bad.what}: what that {what} protects cannot be known, so nothing is collected",
                                where=str(p), hint=hint) from None
            if root_name(record, p) in dropped:
                continue
            refs.update(record.get("refs", []))
    for name in list_names(root.profiles):
        link = root.profiles / name
        st = lstat_or_none(link)
        if name in dropped or st is None or not stat.S_ISLNK(st.st_mode):
            continue
        with contextlib.suppress(OSError):
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


def recipe_names(root: Root, names: set[str]) -> set[str]:
    """What ``gc --drop-root NAME`` forgets of a recipe: ``NAME``, its toolchain's profile ``NAME.toolchain``
    and its variants ``NAME.<variant>`` (a root of that name whose recipe is the file NAME's own root or realize
    receipts name: a recipe of another file called ``NAME.x`` is left alone)."""
    found = set(names)
    for name in names:
        paths: set[str] = set()
        with contextlib.suppress(OSError, BadRecord):
            paths.add(read_root(root.roots / f"{name}.json")["recipe"])
        for p in root_files(root.receipts):
            with contextlib.suppress(OSError, BadRecord):
                record = read_receipt(p)
                recipe = record.get("recipe")
                if record["kind"] == "realize" and isinstance(recipe, dict) and recipe.get("name") == name \
                        and isinstance(recipe.get("path"), str):
                    paths.add(recipe["path"])
        found.add(f"{name}.toolchain")
        for p in root_files(root.roots):
            if not p.stem.startswith(f"{name}.") or p.stem in found:
                continue
            with contextlib.suppress(OSError, BadRecord):
                if read_root(p)["recipe"] in paths:
                    found.add(p.stem)
    return found


def drop_root(root: Root, name: str) -> None:
    """Forget a root: its roots/ record, its profile and its realize receipts (never run results); a receipt
    that cannot be read goes when its file name says it is this recipe's."""
    with contextlib.suppress(FileNotFoundError):
        (root.roots / f"{name}.json").unlink()
    for p in root_files(root.receipts):
        try:
            record = read_receipt(p)
            mine = record.get("kind") == "realize" and root_name(record, p) == name
        except FileNotFoundError:
            continue
        except BadRecord:
            mine = receipt_owner(p) == name
        if mine:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    link = root.profiles / name
    st = lstat_or_none(link)
    if st is not None and stat.S_ISLNK(st.st_mode):
        link.unlink()


def root_owner(recipe: str, variant: str | None) -> dict[str, str]:
    """Who a root (and its profile) belongs to: recipe ``vx``'s variant ``b`` and a recipe named ``vx.b`` both
    realize under the name ``vx.b``; the root records which one made it (``owner``)."""
    return {"recipe": recipe, "variant": variant or ""}


def owner_in_root(root: Root, name: str) -> dict[str, str] | None:
    """The owner of the root ``name``: the one it records, else (an older hermetic's root) the one its recipe file
    names if that file is still there; None when there is no such root or its recipe file is gone. BadRecord
    (exit 2 naming the file) for a root that fails its check (``root_problem``: a malformed owner among it)."""
    try:
        record = read_root(root.roots / f"{name}.json")
    except FileNotFoundError:
        return None
    owner = record.get("owner")
    if isinstance(owner, dict):
        return {"recipe": owner["recipe"], "variant": owner["variant"]}
    try:   # written before roots named their owner: the recipe file it names says whose it is
        import tomllib
        recipe = tomllib.loads(fs.read_regular(record["recipe"], 1 << 20).decode())["recipe"]["name"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not isinstance(recipe, str) or not (name == recipe or name.startswith(f"{recipe}.")):
        return None
    return root_owner(recipe, name[len(recipe) + 1:] or None)


def owner_unrecorded(root: Root, name: str) -> str | None:
    """The recipe file an older hermetic's root ``name`` names, when that root records no owner and ``name``
    could be another recipe's variant (it holds a dot); None otherwise. ``hermetic env`` refuses such a root
    whatever its recipe file now says (a file replaced by another recipe's, or relinked to one, would name
    that one: the outside attack on stop 48's env check); the realize, which rebuilds, reads the file."""
    if "." not in name:
        return None
    try:
        record = read_root(root.roots / f"{name}.json")
    except (FileNotFoundError, BadRecord):
        return None
    return None if "owner" in record else str(record["recipe"])


def owner_unknown(root: Root, name: str, recipe_path: Path) -> str | None:
    """The recipe file an older hermetic's root ``name`` names, when whose root it is cannot be told: it records
    no owner, its recipe file is another than ``recipe_path`` and is gone or unreadable (``owner_in_root`` found
    none), and ``name`` could be another recipe's variant (it holds a dot). None otherwise."""
    then = owner_unrecorded(root, name)
    return None if then is None or os.path.realpath(then) == os.path.realpath(recipe_path) else then


def describe_owner(owner: dict[str, str]) -> str:
    return f"recipe {owner['recipe']}'s variant {owner['variant']}" if owner["variant"] else \
        f"recipe {owner['recipe']}"


def write_root(root: Root, name: str, recipe_path: Path, entries: list[str], owner: dict[str, str]) -> bool:
    """The gc root of a recipe (or one variant of it: ``owner``), rewritten when its entries or its recipe's
    path change; True when the entries changed (a recipe at a new path with the same entries is no change)."""
    record = {"format": 1, "name": name, "recipe": str(recipe_path),
              "profile": name, "refs": [f"entry:{e}" for e in entries], "owner": owner}
    path = root.roots / f"{name}.json"
    data = fs.pretty_json(record)
    try:
        old: dict[str, Any] | None = read_root(path)
    except (OSError, BadRecord):
        old = None   # none yet, or a bad one: replaced by this one
    if old == record:
        return False
    fs.atomic_write(path, data)
    return old is None or old.get("refs") != record["refs"]
