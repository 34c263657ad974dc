"""Archives crafted by hand with a consistent manifest (every member's hash and size right), so that import
judges the records themselves: a record under a key it does not have, a record of an unknown format, a bad
tree record placed last. ``honest_records`` is the small closure they start from."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.keys import unpacked_key
from hermetic.store import STORE_FORMAT, blob_ref, entry_name, entry_ref
from hermetic.store.trees import tree_entry_name

FILE = b"X = 'crafted'\n"
ROOT = "crafted"


def honest_records() -> tuple[dict[str, dict[str, Any]], dict[str, bytes], dict[str, bytes]]:
    """(entries by name, blobs by name, roots by name): an unpacked wheel of one file and a tree of it."""
    digest = hashlib.sha256(FILE).hexdigest()
    wheel = hashlib.sha256(b"a wheel that is not in the archive").hexdigest()
    files = {"crafted/__init__.py": [digest, False]}
    unpacked = entry_name(unpacked_key(wheel), "crafted")  # layout.md
    tree = tree_entry_name(ROOT, {p: (d, x) for p, (d, x) in files.items()}, {})
    entries = {
        unpacked: {"format": STORE_FORMAT, "name": unpacked, "kind": "unpacked", "wheel": wheel,
                   "filename": "crafted-1.0-py3-none-any.whl", "files": files, "refs": [blob_ref(wheel)]},
        tree: {"format": STORE_FORMAT, "name": tree, "kind": "tree", "label": ROOT, "files": files, "links": {},
               "refs": [entry_ref(unpacked)]},
    }
    roots = {ROOT: fs.pretty_json({"format": 1, "name": ROOT, "recipe": "/nowhere/recipe.toml", "profile": ROOT,
                                   "refs": [entry_ref(tree), entry_ref(unpacked)]})}
    return entries, {digest: FILE}, roots


def write_archive(path: Path, entries: dict[str, dict[str, Any]], blobs: dict[str, bytes],
                  roots: dict[str, bytes], order: list[str] | None = None) -> Path:
    """An archive as `hermetic export` writes one (records in ``order``), its manifest consistent."""
    import zstandard
    records = {name: fs.canonical_json(meta) for name, meta in entries.items()}
    manifest = {"format": 1, "hermetic": "crafted", "created": "2026-12-01T00:00:00Z",
                "entries": {n: fs.sha256_bytes(d) for n, d in records.items()},
                "blobs": {b: len(d) for b, d in blobs.items()},
                "roots": {r: fs.sha256_bytes(d) for r, d in roots.items()}}
    members = [("MANIFEST.json", fs.canonical_json(manifest))]
    members += [(f"entries/{n}/meta.json", records[n]) for n in (order or sorted(records))]
    members += [(f"roots/{r}.json", d) for r, d in roots.items()]
    members += [(f"blobs/{b}", d) for b, d in blobs.items()]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw.getvalue()))
    return path


def crafted(kind: str, path: Path) -> Path:
    """One hostile archive: ``wrong-key``, ``unknown-format`` or ``bad-tree-last``."""
    entries, blobs, roots = honest_records()
    unpacked = next(n for n, m in entries.items() if m["kind"] == "unpacked")
    tree = next(n for n, m in entries.items() if m["kind"] == "tree")
    if kind == "wrong-key":  # the same record under another entry's name
        meta = entries.pop(unpacked)
        other = "0" * 32 + unpacked[32:]
        entries[other] = {**meta, "name": other}
        entries[tree]["refs"] = [entry_ref(other)]
    elif kind == "unknown-format":
        entries[unpacked]["format"] = STORE_FORMAT + 98
    elif kind == "bad-tree-last":  # a tree whose name is not the key of its files, after a sound record
        meta = entries.pop(tree)
        bad = "f" * 32 + tree[32:]
        entries[bad] = {**meta, "name": bad}
        roots = {ROOT: json.dumps({"format": 1, "name": ROOT, "refs": [entry_ref(bad)]}).encode()}
        return write_archive(path, entries, blobs, roots, order=[unpacked, bad])
    else:
        raise ValueError(kind)
    return write_archive(path, entries, blobs, roots)


CRAFTED = {
    "wrong-key": "an archive record under a key it does not have (manifest consistent)",
    "unknown-format": "an archive record of an unknown store format (manifest consistent)",
    "bad-tree-last": "an archive whose bad tree record comes last, after a sound one (manifest consistent)",
}


def tree_archive(path: Path, links: dict[str, str], extra_files: dict[str, bytes] | None = None) -> Path:
    """The honest closure with its tree given ``links`` (and ``extra_files``), named for what it holds, so that
    import judges the tree's shape alone (the attacks of issue 34: links that chain through each other)."""
    entries, blobs, _roots = honest_records()
    tree = next(n for n, m in entries.items() if m["kind"] == "tree")
    meta = entries.pop(tree)
    files = dict(meta["files"])
    for rel, data in (extra_files or {}).items():
        digest = hashlib.sha256(data).hexdigest()
        files[rel] = [digest, False]
        blobs[digest] = data
    name = tree_entry_name(ROOT, {p: (d, x) for p, (d, x) in files.items()}, links)
    entries[name] = {**meta, "name": name, "files": files, "links": dict(sorted(links.items()))}
    unpacked = next(n for n, m in entries.items() if m["kind"] == "unpacked")
    roots = {ROOT: fs.pretty_json({"format": 1, "name": ROOT, "recipe": "/nowhere/recipe.toml", "profile": ROOT,
                                   "refs": [entry_ref(name), entry_ref(unpacked)]})}
    return write_archive(path, entries, blobs, roots)


def climbing_links(levels: int, victim: str) -> dict[str, str]:
    """Links that reach ``levels`` folders above the tree's folder ``a`` and put a link at ``victim`` (a path
    relative to that place): ``a/b -> ..`` makes ``a/b/a/b/…/a/c`` a short physical path under a long logical
    one, so that each link's own ``..`` count stays below its depth (the check before issue 34)."""
    n = (levels + 1) // 2
    chain = "a/b/" * n + "a/c"
    return {"a/b": "..", chain: "/".join([".."] * levels), f"{chain}/{victim}": "pwned"}
