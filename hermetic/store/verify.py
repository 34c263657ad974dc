"""verify: re-hash every blob, check every entry and tree against its record; --repair mends.

Tree files are hard links to blobs, so a tree file that shares its blob's inode is checked by the blob's
hash; a copied file (another file system) is hashed itself.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from hermetic import fs
from hermetic.root import Root
from hermetic.store import ENTRY_META, Store, blob_name, split_blob_name


@dataclass(frozen=True)
class Problem:
    kind: str       # blob, entry, tree, profile
    name: str       # blob digest or entry name
    what: str


@dataclass
class VerifyReport:
    blobs: int = 0
    entries: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)


def verify(store: Store, root: Root) -> VerifyReport:
    report = VerifyReport()
    bad_blobs: set[str] = set()
    inodes: dict[tuple[str, bool], int] = {}
    for digest, executable, path in store.iter_blobs():
        report.blobs += 1
        st = os.lstat(path)
        inodes[(digest, executable)] = st.st_ino
        actual, size = fs.sha256_file(path)
        report.bytes += size
        name = blob_name(digest, executable)
        if actual != digest:
            report.problems.append(Problem("blob", name, f"content hashes to {actual[:16]}…"))
            bad_blobs.add(name)
        elif st.st_mode & 0o222:
            report.problems.append(Problem("blob", name, "is writable (store files must be read-only)"))
    for name in store.iter_entries():
        report.entries += 1
        report.problems += _check_entry(store, name, inodes, bad_blobs)
    if root.profiles.exists():
        for link in sorted(root.profiles.iterdir()):
            if link.is_symlink() and not link.exists():
                report.problems.append(Problem("profile", link.name, "points at a missing entry"))
    return report


def _check_entry(store: Store, name: str, inodes: dict[tuple[str, bool], int],
                 bad_blobs: set[str]) -> list[Problem]:
    problems: list[Problem] = []
    path = store.entry_path(name)
    try:
        meta = json.loads((path / ENTRY_META).read_text())
    except (OSError, ValueError) as e:
        return [Problem("entry", name, f"meta.json unreadable: {e}")]
    files = {p: (d, bool(x)) for p, (d, x) in meta.get("files", {}).items()}
    for rel, (digest, executable) in files.items():
        bname = blob_name(digest, executable)
        if bname in bad_blobs:
            problems.append(Problem("entry", name, f"{rel} uses corrupt blob {digest[:16]}…"))
        elif meta.get("kind") != "tree" and (digest, executable) not in inodes:
            problems.append(Problem("entry", name, f"{rel}: blob {digest[:16]}… is missing"))
    if meta.get("kind") == "tree":
        problems += _check_tree(path / "out", name, files, meta.get("links", {}), inodes)
    packed = meta.get("packed")
    for key in ("object", "so"):  # objects and modules: their one blob must be there and sound
        digest = packed.get("blob") if key == "object" and isinstance(packed, dict) else meta.get(key)
        if isinstance(digest, str):
            if digest in bad_blobs:
                problems.append(Problem("entry", name, f"its {key} blob {digest[:16]}… is corrupt"))
            elif (digest, False) not in inodes:
                problems.append(Problem("entry", name, f"its {key} blob {digest[:16]}… is missing"))
    return problems


def _check_tree(out: Path, name: str, files: dict[str, tuple[str, bool]], links: dict[str, str],
                inodes: dict[tuple[str, bool], int]) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[str] = set()
    for dirpath, _dirs, names in os.walk(out):
        for fname in names:
            full = os.path.join(dirpath, fname)
            rel = os.path.relpath(full, out)
            seen.add(rel)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                if links.get(rel) != os.readlink(full):
                    problems.append(Problem("tree", name, f"{rel}: unexpected symlink"))
                continue
            spec = files.get(rel)
            if spec is None:
                problems.append(Problem("tree", name, f"{rel}: file not in the record"))
            elif inodes.get(spec) != st.st_ino and fs.sha256_file(Path(full))[0] != spec[0]:
                problems.append(Problem("tree", name, f"{rel}: content differs from the record"))
    for rel in sorted(set(files) - seen):
        problems.append(Problem("tree", name, f"{rel}: missing"))
    for rel in sorted(set(links) - seen):
        if not os.path.islink(out / rel):
            problems.append(Problem("tree", name, f"{rel}: symlink missing"))
    return problems


def drop_corrupt(store: Store, problems: list[Problem]) -> int:
    """Remove corrupt blobs and every entry that is itself corrupt or uses one; returns items removed."""
    removed = 0
    for p in problems:
        if p.kind == "blob":
            digest, executable = split_blob_name(p.name)
            path = store.blob_path(digest, executable)
            if path.exists():
                path.unlink()
                removed += 1
    for name in sorted({p.name for p in problems if p.kind in ("entry", "tree")}):
        trash = store.invalidate(name)
        if trash is not None:
            fs.remove_tree(trash)
            removed += 1
    return removed
