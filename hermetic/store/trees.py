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
    depth = rel.count("/")
    parts = target.split("/")
    if target.startswith("/") or parts.count("..") > depth or any(ord(c) < 32 for c in target):
        raise ValueError(f"symlink {rel} -> {target} leaves the tree")


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
    with store.build_entry(name) as staging:
        if staging is None:
            return name, False
        out = staging.out
        out.mkdir()
        made: set[str] = {""}
        base = str(out)
        for rel in sorted(files):
            check_relpath(rel)  # records may come from an imported archive: never trust a path
            digest, executable = files[rel]
            parent = rel.rpartition("/")[0]
            if parent not in made:
                os.makedirs(f"{base}/{parent}", exist_ok=True)
                made.update(_ancestors(parent))
            # plain strings: pathlib costs more than the link itself over a few thousand files
            blob = store.blob_text(digest, executable)
            try:
                fs.link_or_copy(blob, f"{base}/{rel}")
            except FileNotFoundError:
                raise WorkFailed(f"the store has no blob {digest[:16]}… for {rel} of {label}", where=blob,
                                 hint="an entry's record names a missing blob: run `hermetic verify --repair`") \
                    from None
        for rel, target in sorted(links.items()):
            check_relpath(rel)
            check_link_target(rel, target)
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists() or dst.is_symlink():
                dst.unlink()
            os.symlink(target, dst)
            made.update(_ancestors(rel.rpartition("/")[0]))
        # files are links to read-only blobs already; only the folders need their write bits dropped
        staging.readonly_dirs = sorted(f"{base}/{d}" if d else base for d in made)
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
