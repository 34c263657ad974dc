"""Store trees, and profiles: the stable paths pointing at them.

A *tree entry* is the union of file maps (the unpacked wheels', a build's modules) plus symlinks, laid
out as hard links to the blobs. A file with the same bytes therefore has the same inode and mtime in every
tree that holds it, across lock updates too: ninja sees unchanged headers as unchanged. A *profile* is a
symlink ``profiles/<name>`` swapped atomically to the current tree: the stable path users build against.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.errors import BadInput, BadRecord, WorkFailed
from hermetic.store import STORE_FORMAT, Store, describe, entry_name, is_entry_name
from hermetic.store.records import FileMap, SourceOrigin, check_relpath

TREE_VERSION = 1




def check_link_target(rel: str, target: str) -> None:
    """One link on its own: a relative target with no control character that does not climb above the tree
    from where the link is. ``tree_problem`` checks the tree as a whole, every link through the others."""
    depth = rel.count("/")
    parts = target.split("/")
    if not target or target.startswith("/") or parts.count("..") > depth or any(ord(c) < 32 for c in target):
        raise ValueError(f"symlink {rel} -> {target} leaves the tree")


MAX_LINK_HOPS = 40   # the kernel's limit on symlinks in one path (Linux: 40)
MAX_TARGET = 4096    # PATH_MAX: no link the kernel could follow has a longer target
MAX_STEPS = 5_000_000  # components walked resolving every link of one tree (an honest tree: a few dozen)


def tree_problem(files: Mapping[str, object], links: Mapping[str, str]) -> str | None:
    """Why a tree of ``files`` and ``links`` cannot be laid out safely, or None: a path that is not plain; a
    path both a file and a link, or a file and a folder; a file or link whose folder passes one of the tree's
    links (it would be laid out through the link); a link whose target, resolved in the tree with the tree's
    other links, leaves it (each link's own ``..`` check is not enough: links can chain through one another).
    The work is bounded for any record (sorted paths and a trie of the links, no list of every ancestor)."""
    for rel in (*files, *links):
        try:
            check_relpath(rel)
        except ValueError:
            return f"its path {rel!r} is not a plain relative path"
    for rel in links:
        if rel in files:
            return f"{rel!r} is both a file and a symlink"
    paths = sorted({*files, *links})

    def first_below(prefix: str) -> str | None:
        i = bisect.bisect_left(paths, prefix + "/")
        return paths[i] if i < len(paths) and paths[i].startswith(prefix + "/") else None

    for rel in sorted(links):
        passing = first_below(rel)
        if passing is not None:
            return f"{passing!r} would be laid out through its symlink {rel!r}"
    for rel in files:
        if first_below(rel) is not None:
            return f"{rel!r} is both a file and a folder"
    trie = _link_trie(links)
    budget = [MAX_STEPS]
    for rel, target in sorted(links.items()):
        try:
            check_link_target(rel, target)
        except ValueError as e:
            return str(e)
        if len(target) > MAX_TARGET:
            return f"symlink {rel} has a target of {len(target)} characters, more than a path may have"
        if _resolve_in_tree(rel, target, trie, budget) is None:
            if budget[0] <= 0:
                return "its symlinks are too many or too long to judge"
            return f"symlink {rel} -> {target} leaves the tree through its other symlinks"
    return None


_LINK = ""   # the key under which a trie node holds the link that ends there


def _link_trie(links: Mapping[str, str]) -> dict[str, Any]:
    """The links' paths as nested dicts of components; a node where a link ends holds its target at ``_LINK``
    (no component is empty: check_relpath)."""
    trie: dict[str, Any] = {}
    for rel, target in links.items():
        node = trie
        for part in rel.split("/"):
            node = node.setdefault(part, {})
        node[_LINK] = target
    return trie


def _resolve_in_tree(rel: str, target: str, trie: dict[str, Any], budget: list[int]) -> list[str] | None:
    """Where the link ``rel -> target`` leads, as the kernel resolves it: component by component from the
    link's folder, each of the tree's links met on the way replaced by its own target; None when the path
    climbs above the tree, passes more than MAX_LINK_HOPS links (a loop), or the tree's budget of steps is
    spent. The trie follows the path, so each step costs the same however deep the path is."""
    at: list[str] = []
    nodes: list[dict[str, Any] | None] = [trie]
    for part in rel.split("/")[:-1]:
        at.append(part)
        nodes.append(nodes[-1].get(part) if nodes[-1] is not None else None)
    pending = deque(p for p in target.split("/") if p not in ("", "."))
    hops = 0
    while pending:
        budget[0] -= 1
        if budget[0] <= 0:
            return None
        part = pending.popleft()
        if part == "..":
            if not at:
                return None
            at.pop()
            nodes.pop()
            continue
        parent = nodes[-1]
        node = parent.get(part) if parent is not None else None
        if node is not None and _LINK in node:
            hops += 1
            if hops > MAX_LINK_HOPS:
                return None
            substitute = node[_LINK]
            if substitute.startswith("/"):
                return None
            pending.extendleft(reversed([p for p in substitute.split("/") if p not in ("", ".")]))
            continue
        at.append(part)
        nodes.append(node)
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


def profile_entry(store: Store, link: Path) -> tuple[str | None, str | None]:
    """(the entry the profile ``link`` names, why it is no profile). A profile is a symbolic link to an entry's
    ``out/`` folder in this store's ``entries/``; anything else (a folder, a file, a link out of the store) is a
    bad record (docs/layout.md). (None, None) when nothing is there. Read with lstat and readlink: never
    followed."""
    try:
        st = os.lstat(link)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    if not stat.S_ISLNK(st.st_mode):
        return None, f"is {describe(st.st_mode)}, not a link to an entry"
    try:
        target = Path(os.readlink(link))
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    entry = target.parent.name
    if target.name != "out" or not is_entry_name(entry) or \
            os.path.normpath(link.parent / target.parent.parent) != os.path.normpath(store.entries):
        return None, f"points at {target}, which is no entry of this store"
    return entry, None


def set_profile(profiles: Path, name: str, store: Store, entry: str) -> Path:
    """Point ``profiles/<name>`` at an entry's out/ atomically; unchanged when it already does."""
    link = profiles / name
    try:
        fs.atomic_symlink(os.path.relpath(store.entry_path(entry) / "out", profiles), link)
    except IsADirectoryError:   # a folder where the profile belongs: a bad record (docs/layout.md)
        raise BadRecord("the profile is a folder, not a link to an entry: hermetic never writes over it",
                        where=str(link), hint="run `hermetic verify --repair`, which removes it; then realize again") \
            from None
    return link
