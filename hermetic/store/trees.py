"""Store trees, and profiles: the stable paths pointing at them.

A *tree entry* is the union of file maps (the unpacked wheels', a build's modules) plus symlinks, laid
out as hard links to the blobs. A file with the same bytes therefore has the same inode and mtime in every
tree that holds it, across lock updates too: ninja sees unchanged headers as unchanged. A *profile* is a
symlink ``profiles/<name>`` swapped atomically to the current tree: the stable path users build against.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from hermetic import fs
from hermetic.errors import BadInput, WorkFailed
from hermetic.store import STORE_FORMAT, Store, entry_name
from hermetic.store.records import FileMap, SourceOrigin

TREE_VERSION = 1


_UNSAFE_PATH = re.compile(r"(^|/)\.{0,2}(/|$)|^/|[\x00-\x1f\x7f]")


def check_relpath(rel: str) -> None:
    """A relative path with no empty, '.' or '..' part and no control character."""
    if not rel or _UNSAFE_PATH.search(rel):
        raise ValueError(f"unsafe path {rel!r}")


def check_link_target(rel: str, target: str) -> None:
    """One link on its own: a relative target with no control character that does not climb above the tree
    from where the link is. ``tree_problem`` checks the tree as a whole, every link through the others."""
    depth = rel.count("/")
    parts = target.split("/")
    if not target or target.startswith("/") or parts.count("..") > depth or any(ord(c) < 32 for c in target):
        raise ValueError(f"symlink {rel} -> {target} leaves the tree")


MAX_LINK_HOPS = 40   # the kernel's limit on symlinks in one path (Linux: 40)


def tree_problem(files: Mapping[str, object], links: Mapping[str, str]) -> str | None:
    """Why a tree of ``files`` and ``links`` cannot be laid out safely, or None: a path that is not plain; a
    path both a file and a link, or a file and a folder; a file or link whose folder passes one of the tree's
    links (it would be laid out through the link); a link whose target, resolved in the tree with the tree's
    other links, leaves it (each link's own ``..`` check is not enough: links can chain through one another)."""
    for rel in (*files, *links):
        try:
            check_relpath(rel)
        except ValueError:
            return f"its path {rel!r} is not a plain relative path"
    folders: set[str] = set()
    for rel in (*files, *links):
        folders.update(_ancestors(rel.rpartition("/")[0]))
    for rel in links:
        if rel in files:
            return f"{rel!r} is both a file and a symlink"
    for folder in sorted(folders):
        if folder in links:
            passing = next(r for r in sorted((*files, *links)) if r.startswith(folder + "/"))
            return f"{passing!r} would be laid out through its symlink {folder!r}"
    for rel in files:
        if rel in folders:
            return f"{rel!r} is both a file and a folder"
    for rel, target in sorted(links.items()):
        try:
            check_link_target(rel, target)
        except ValueError as e:
            return str(e)
        if _resolve_in_tree(rel, target, links) is None:
            return f"symlink {rel} -> {target} leaves the tree through its other symlinks"
    return None


def _resolve_in_tree(rel: str, target: str, links: Mapping[str, str]) -> list[str] | None:
    """Where the link ``rel -> target`` leads, as the kernel resolves it: component by component from the
    link's folder, each of the tree's links met on the way replaced by its own target; None when the path
    climbs above the tree or passes more than MAX_LINK_HOPS links (a loop)."""
    at = rel.split("/")[:-1]
    pending = [p for p in target.split("/") if p not in ("", ".")]
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not at:
                return None
            at.pop()
            continue
        at.append(part)
        here = "/".join(at)
        if here in links:
            hops += 1
            if hops > MAX_LINK_HOPS:
                return None
            at.pop()
            pending = [p for p in links[here].split("/") if p not in ("", ".")] + pending
            if links[here].startswith("/"):
                return None
    return at


# trees ---------------------------------------------------------------------------------------------
def merge_files(parts: Iterable[tuple[str, FileMap]]) -> FileMap:
    """Union of file maps; two sources writing different bytes to one path is an error, not a race."""
    merged: FileMap = {}
    owner: dict[str, str] = {}
    for label, files in parts:
        for rel, spec in files.items():
            if rel in merged and merged[rel] != spec:
                raise BadInput(f"{label} and {owner[rel]} both provide {rel} with different contents",
                               hint="remove one of them from the lock")
            merged[rel] = spec
            owner[rel] = label
    return merged


def tree_entry_name(label: str, files: FileMap, links: Mapping[str, str]) -> str:
    spec = {"v": TREE_VERSION, "files": {p: [d, x] for p, (d, x) in sorted(files.items())},
            "links": dict(sorted(links.items()))}
    return entry_name(fs.sha256_bytes(fs.canonical_json(spec)), label)


def build_tree(store: Store, label: str, files: FileMap, links: Mapping[str, str] | None = None,
               refs: Iterable[str] = (), *, name: str | None = None,
               source: SourceOrigin | None = None) -> tuple[str, bool]:
    """Lay out a tree of hard links to blobs; content-addressed (unless ``name`` is given: an imported
    input-addressed tree), so an unchanged tree is reused as is. Returns (entry name, built now).
    """
    links = dict(links or {})
    name = name or tree_entry_name(label, files, links)
    # records may come from an imported archive: the whole tree is checked before anything is laid out
    why = tree_problem(files, links)
    if why is not None:
        raise BadInput(f"tree {name} ({label}) cannot be laid out: {why}", where=name,
                       hint="a tree record is hostile or damaged: nothing of it was written")
    with store.build_entry(name) as staging:
        if staging is None:
            return name, False
        out = staging.out
        out.mkdir()
        # one sorted walk of files and links, through folder descriptors: nothing passes a link (fs.TreeWriter)
        entries = sorted([*((rel, False) for rel in files), *((rel, True) for rel in links)])
        with fs.TreeWriter(out) as writer:
            for rel, is_link in entries:
                if is_link:
                    writer.symlink(rel, links[rel])
                    continue
                digest, executable = files[rel]
                # plain strings: pathlib costs more than the link itself over a few thousand files
                blob = store.blob_text(digest, executable)
                try:
                    writer.link(rel, blob)
                except FileNotFoundError:
                    raise WorkFailed(f"the store has no blob {digest[:16]}… for {rel} of {label}", where=blob,
                                     hint="an entry's record names a missing blob: run `hermetic verify --repair`") \
                        from None
        staging.readonly_dirs = []  # the writer dropped every folder's write bits as it closed it
        staging.record = {"format": STORE_FORMAT, "name": name, "kind": "tree", "label": label,
                          "files": {p: (d, x) for p, (d, x) in sorted(files.items())},
                          "links": dict(sorted(links.items())), "refs": sorted(set(refs))}
        if source is not None:
            staging.record["source"] = source
    return name, True


def _ancestors(folder: str) -> list[str]:
    parts = folder.split("/") if folder else []
    return ["/".join(parts[:i]) for i in range(len(parts) + 1)]


def set_profile(profiles: Path, name: str, store: Store, entry: str) -> Path:
    """Point ``profiles/<name>`` at an entry's out/ atomically; unchanged when it already does."""
    link = profiles / name
    fs.atomic_symlink(os.path.relpath(store.entry_path(entry) / "out", profiles), link)
    return link
