"""The fuzz of issue 34: archives mutated from a real export and patches mutated from a real git patch, each
judged the same way. Shared by tests/test_fuzz.py (a fixed-seed sample) and bench/soak (``--fuzz-archives``,
``--fuzz-patches``).

An archive trial imports one mutated archive into a fresh root beside a sentinel folder (the place a hostile
link aims at) with the real CLI. It passes when the exit code is 0 or 2 (1 only for "does not fit the free
space"), there is no traceback or internal error, a refusal has an ``error:`` line and publishes nothing, an
accepted archive verifies clean, and the sentinel folder and the work folder around the root are exactly as
they were. A patch trial applies one mutated patch to a real source folder with the real GNU patch into a real
store (``extensions.sources.realize_source``, in this process: an error is exit 2 when it is a BadInput, any other
exception a failure); it passes when the result is a tree of regular files or a BadInput, nothing of a refused
source is published, and the sentinel is unchanged.

The mutations (``ARCHIVE_MUTATIONS``, ``PATCH_MUTATIONS``) cover link targets and chains, names, sizes, record
fields and roots, and a patch's headers, paths and hunks. Most keep the manifest consistent (every hash and
size recomputed, a tree renamed for what it holds), so that import judges the records themselves.
"""

from __future__ import annotations

import io
import json
import os
import random
import stat
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.store.trees import tree_entry_name
from tests.support import cli

Members = list[tuple[str, bytes]]   # the archive's tar members in order, MANIFEST.json first


# --- the sentinel: a folder outside the root every hostile path aims at -----------------------------------------
def make_sentinel(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("the user's file\n")
    (folder / "sub" / "config.ini").write_text("[x]\na = 1\n")
    os.chmod(folder / "precious.txt", 0o640)
    return folder


def state_of(folder: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every path below ``folder`` (and itself): mode, inode, mtime and bytes (a link's target)."""
    out = {}
    for p in [folder, *sorted(folder.rglob("*"))]:
        st = os.lstat(p)
        data = os.readlink(p).encode() if stat.S_ISLNK(st.st_mode) else \
            p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out[str(p)] = (st.st_mode, st.st_ino, st.st_mtime_ns, data)
    return out


# --- archives ----------------------------------------------------------------------------------------------------
def read_archive(path: Path) -> Members:
    import zstandard
    raw = zstandard.ZstdDecompressor().stream_reader(path.read_bytes()).read()
    members: Members = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
        for m in tar:
            f = tar.extractfile(m)
            members.append((m.name, f.read() if f is not None else b""))
    return members


def write_members(path: Path, members: Members, *, specials: list[tarfile.TarInfo] | None = None,
                  header_lie: tuple[str, int] | None = None, level: int = 3) -> Path:
    """A .tar.zst of ``members`` (plus ``specials``: links, folders, FIFOs as tar members); ``header_lie``
    (name, size) writes that member's header with another size than its bytes."""
    import zstandard
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o444
            if header_lie is not None and header_lie[0] == name:
                info.size = header_lie[1]
                body = data[:header_lie[1]] + bytes(max(0, header_lie[1] - len(data)))
                tar.addfile(info, io.BytesIO(body))
                continue
            tar.addfile(info, io.BytesIO(data))
        for special in specials or []:
            tar.addfile(special)
    path.write_bytes(zstandard.ZstdCompressor(level=level).compress(raw.getvalue()))
    return path


@dataclass
class Model:
    """An archive taken apart: its manifest, records, roots and blobs (by name), in member order."""
    manifest: dict[str, Any]
    entries: dict[str, Any]
    roots: dict[str, Any]
    blobs: dict[str, bytes]
    order: list[str] = field(default_factory=list)
    raw_roots: dict[str, bytes] = field(default_factory=dict)  # a root replaced by bytes that are no JSON

    @classmethod
    def of(cls, members: Members) -> Model:
        manifest = json.loads(members[0][1])
        entries, roots, blobs, order = {}, {}, {}, []
        for name, data in members[1:]:
            order.append(name)
            if name.startswith("entries/"):
                entries[name[len("entries/"):-len("/meta.json")]] = json.loads(data)
            elif name.startswith("roots/"):
                roots[name[len("roots/"):-len(".json")]] = json.loads(data)
            else:
                blobs[name[len("blobs/"):]] = data
        return cls(manifest, entries, roots, blobs, order)

    def members(self, *, consistent: bool = True) -> Members:
        """The members again; ``consistent``: the manifest names every member with its hash and size."""
        records = {n: fs.canonical_json(m) for n, m in self.entries.items()}
        roots = {n: self.raw_roots.get(n) or fs.pretty_json(r) for n, r in self.roots.items()}
        manifest = dict(self.manifest)
        if consistent:
            manifest["entries"] = {n: fs.sha256_bytes(d) for n, d in records.items()}
            manifest["blobs"] = {b: len(d) for b, d in self.blobs.items()}
            manifest["roots"] = {r: fs.sha256_bytes(d) for r, d in roots.items()}
        out: Members = [("MANIFEST.json", fs.canonical_json(manifest))]
        out += [(f"entries/{n}/meta.json", d) for n, d in records.items()]
        out += [(f"roots/{n}.json", d) for n, d in roots.items()]
        out += [(f"blobs/{b}", d) for b, d in self.blobs.items()]
        return out

    def trees(self) -> list[str]:
        return sorted(n for n, m in self.entries.items() if isinstance(m, dict) and m.get("kind") == "tree")

    def rename(self, old: str, new: str) -> None:
        """An entry under another name, every reference to it following (roots and records)."""
        if old == new or old not in self.entries:
            return
        self.entries[new] = self.entries.pop(old)
        if isinstance(self.entries[new], dict):
            self.entries[new]["name"] = new
        for rec in [*self.entries.values(), *self.roots.values()]:
            if isinstance(rec, dict) and isinstance(rec.get("refs"), list):
                rec["refs"] = [f"entry:{new}" if r == f"entry:{old}" else r for r in rec["refs"]]

    def rekey(self, tree: str) -> None:
        """A tree renamed for the files and links it holds now (so that its name passes, and its shape is judged)."""
        meta = self.entries[tree]
        try:
            files = {p: (d, x) for p, (d, x) in meta["files"].items()}
            new = tree_entry_name(meta["label"], files, meta["links"])
        except (KeyError, TypeError, ValueError, AttributeError):
            return
        self.rename(tree, new)


@dataclass
class Aim:
    """Where hostile paths point: the sentinel, by absolute path and by the climb from a tree's staging folder
    (ROOT/store/tmp/entry-*/out: from out/a, seven folders up is the folder holding the roots' folder)."""
    sentinel: Path
    climb: int = 7
    relative: str = "sentinel/precious.txt"


ArchiveMutation = Callable[[random.Random, Model, Aim], dict[str, Any]]


def _tree_links(rng: random.Random, model: Model, aim: Aim, links: dict[str, str],
                files: dict[str, Any] | None = None) -> dict[str, Any]:
    tree = rng.choice(model.trees())
    meta = model.entries[tree]
    meta["links"] = {**meta.get("links", {}), **links}
    if files:
        meta["files"] = {**meta["files"], **files}
    if rng.random() < 0.85:
        model.rekey(tree)
    return {}


def _some_digest(model: Model) -> list[Any]:
    blob = next(iter(model.blobs))
    return [blob.rstrip("x"), blob.endswith("x")]


def m_link_chain(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    # never past the work folder: against a hermetic before issue 34 these links chmod what they reach
    levels = rng.choice([aim.climb - 1, aim.climb, aim.climb, rng.randint(2, aim.climb)])
    n = (levels + 1) // 2
    chain = "a/b/" * n + "a/c"
    victim = aim.relative if levels == aim.climb else rng.choice([aim.relative, "x", "sentinel/sub/config.ini"])
    return _tree_links(rng, model, aim, {"a/b": "..", chain: "/".join([".."] * levels), f"{chain}/{victim}": "p"})


def m_link_through_sibling(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    depth = rng.randint(1, 9)
    folder = "/".join(f"d{i}" for i in range(depth))
    up = "/".join([".."] * depth)
    extra = rng.randint(1, depth)
    return _tree_links(rng, model, aim, {f"{folder}/L": up, f"{folder}/E": "L/" + "/".join([".."] * extra)})


def m_link_target(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    depth = rng.randint(0, 4)
    rel = "/".join([f"k{i}" for i in range(depth)] + ["link"])
    target = rng.choice([str(aim.sentinel), str(aim.sentinel / "precious.txt"), "/".join([".."] * (depth + 1)),
                         "/".join([".."] * (depth + rng.randint(1, 6))) + "/sentinel", "", ".", "a\nb", "x\x00y",
                         "../" * depth + "ok", "/", "//etc/passwd", "./../" * (depth + 1)])
    return _tree_links(rng, model, aim, {rel: target})


def m_file_through_link(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    target = rng.choice([str(aim.sentinel), "/".join([".."] * aim.climb) + "/sentinel", "real", "."])
    return _tree_links(rng, model, aim, {"via": target}, {"via/precious.txt": _some_digest(model)})


def m_link_loop(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    n = rng.randint(1, 45)
    links = {f"l{i}": f"l{(i + 1) % n}" for i in range(n)}
    return _tree_links(rng, model, aim, links)


def m_link_over_file(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    tree = rng.choice(model.trees())
    rel = rng.choice(sorted(model.entries[tree]["files"]))
    return _tree_links(rng, model, aim, {rel: rng.choice([str(aim.sentinel), "x"])})


def m_path_name(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    name = rng.choice([n for n, m in model.entries.items() if isinstance(m.get("files"), dict) and m["files"]])
    meta = model.entries[name]
    rel = rng.choice(sorted(meta["files"]))
    bad = rng.choice([f"../{rel}", "/".join([".."] * aim.climb) + "/sentinel/precious.txt",
                      str(aim.sentinel / "precious.txt"), f"a/./{rel}", f"a//{rel}", f"{rel}\n", f"{rel}\x1b[2J",
                      "x" * 5000, f"{rel}/", "", ".", "a/" * 300 + "z", "ä/ö.py", f"{rel}\x00"])
    meta["files"] = {**{k: v for k, v in meta["files"].items() if k != rel}, bad: meta["files"][rel]}
    if meta.get("kind") == "tree" and rng.random() < 0.8:
        model.rekey(name)
    return {}


def m_entry_name(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    old = rng.choice(sorted(model.entries))
    new = rng.choice([f"../../{old}", f"{old}/x", "x" * 200, old[:32] + "-" + "\x1b[31m", old.upper(),
                      f"{old[:31]}-{old[33:]}", "0" * 32 + "-crafted", old + "/../" + old])
    model.rename(old, new)
    return {}


def m_member(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    kind = rng.choice(["symlink", "hardlink", "dir", "fifo", "name"])
    if kind == "name":
        name = rng.choice(["../evil", str(aim.sentinel / "x"), "entries/../../x/meta.json", "blobs/../../x",
                           "roots/../../x.json", "MANIFEST.json", "entries/a b/meta.json"])
        return {"extra": [(name, b"{}")]}
    info = tarfile.TarInfo(rng.choice(["blobs/" + "0" * 64, "entries/x/meta.json", str(aim.sentinel / "y"),
                                       "roots/x.json"]))
    info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "dir": tarfile.DIRTYPE,
                 "fifo": tarfile.FIFOTYPE}[kind]
    info.linkname = str(aim.sentinel / "precious.txt")
    return {"specials": [info]}


def m_sizes(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    blob = rng.choice(sorted(model.blobs))
    if rng.random() < 0.5:
        size = len(model.blobs[blob])
        model.manifest["blobs"] = {b: len(d) for b, d in model.blobs.items()}
        model.manifest["blobs"][blob] = rng.choice([size + 1, size - 1, 0, 1 << 62, -5, str(size), size + 0.5,
                                                    True, None, 1 << 44, [size]])
        return {"consistent": False}
    return {"header_lie": (f"blobs/{blob}", rng.choice([0, 1, len(model.blobs[blob]) + rng.randint(1, 4096)]))}


def _garbage(rng: random.Random) -> Any:
    return rng.choice([None, [], {}, 0, -1, 1 << 70, "", "x" * 10000, True, 1.5, ["entry:x"], {"a": 1},
                       "entry:../../x", "\x00"])


def m_record_field(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    name = rng.choice(sorted(model.entries))
    meta = model.entries[name]
    key = rng.choice(sorted(meta) + ["kind", "format", "refs", "files"])
    action = rng.random()
    if action < 0.3 and key in meta:
        del meta[key]
    elif action < 0.4:
        meta["kind"] = rng.choice(["module", "object", "tree", "unpacked", "other", None])
    elif action < 0.5 and isinstance(meta.get("files"), dict) and meta["files"]:
        rel = rng.choice(sorted(meta["files"]))
        meta["files"][rel] = _garbage(rng)
    else:
        meta[key] = _garbage(rng)
    if meta.get("kind") == "tree" and rng.random() < 0.5:
        model.rekey(name)
    return {}


def m_root(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    name = rng.choice(sorted(model.roots))
    choice = rng.random()
    if choice < 0.35:
        model.roots[name] = rng.choice([[f"entry:{n}" for n in model.entries], "entry:x", 7, None, [], {}])
    elif choice < 0.7:
        root = dict(model.roots[name])
        key = rng.choice(["refs", "name", "format", "recipe", "profile"])
        root[key] = _garbage(rng) if rng.random() < 0.7 else root.pop(key, None)
        model.roots[name] = root
    elif choice < 0.85:
        model.raw_roots[name] = rng.choice([b"", b"[", b"\xff\xfe", b"{" * 100000, b"null"])
    else:
        model.roots[rng.choice(["../evil", "a/b", "x" * 100, "ok.name"])] = model.roots.pop(name)
    return {}


def m_manifest(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    choice = rng.randint(0, 5)
    if choice == 0:
        model.manifest["format"] = _garbage(rng)
    elif choice == 1:
        model.manifest[rng.choice(["entries", "blobs", "roots"])] = _garbage(rng)
        return {"consistent": False}
    elif choice == 2:
        return {"drop": rng.randint(1, 3)}       # members missing (a truncated archive)
    elif choice == 3:
        return {"shuffle": True}                 # MANIFEST.json not first
    elif choice == 4:
        return {"duplicate": True}
    else:
        model.manifest["entries"] = {**model.manifest.get("entries", {}), "f" * 32 + "-ghost": "0" * 64}
        return {"consistent": False}
    return {}


def m_bytes(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    return {"damage": rng.choice(["flip", "truncate", "flip-tar"])}


def m_benign(rng: random.Random, model: Model, aim: Aim) -> dict[str, Any]:
    model.manifest["created"] = "1999-01-01T00:00:00Z"
    model.manifest["hermetic"] = rng.choice(["0.0.1", "9.9.9", "crafted"])
    return {}


ARCHIVE_MUTATIONS: dict[str, ArchiveMutation] = {
    "link-chain": m_link_chain, "link-through-sibling": m_link_through_sibling, "link-target": m_link_target,
    "file-through-link": m_file_through_link, "link-loop": m_link_loop, "link-over-file": m_link_over_file,
    "path-name": m_path_name, "entry-name": m_entry_name, "member": m_member, "sizes": m_sizes,
    "record-field": m_record_field, "root": m_root, "manifest": m_manifest, "bytes": m_bytes, "benign": m_benign,
}


def mutate_archive(base: Members, rng: random.Random, aim: Aim, out: Path) -> tuple[Path, list[str]]:
    """One mutated archive from ``base``: one to three mutations; returns its path and their names."""
    model = Model.of(base)
    names = rng.sample(sorted(ARCHIVE_MUTATIONS), rng.choice([1, 1, 1, 2, 3]))
    how: dict[str, Any] = {"consistent": True}
    for n in names:
        try:
            how.update(ARCHIVE_MUTATIONS[n](rng, model, aim))
        except (IndexError, KeyError, TypeError, AttributeError, ValueError):
            pass  # the archive no longer has what this mutation changes: the others still apply
    members = model.members(consistent=how["consistent"])
    members += how.get("extra", [])
    if how.get("drop"):
        for _ in range(min(how["drop"], len(members) - 1)):
            members.pop(rng.randrange(1, len(members)))
    if how.get("shuffle") and len(members) > 1:
        members.insert(rng.randrange(1, len(members)), members.pop(0))
    if how.get("duplicate") and len(members) > 1:
        members.append(members[rng.randrange(1, len(members))])
    path = write_members(out, members, specials=how.get("specials"), header_lie=how.get("header_lie"))
    damage = how.get("damage")
    if damage:
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[:rng.randrange(1, len(data))]
        elif damage == "flip":
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:  # a bit flipped inside the tar, compressed again: the zstd checksum is right, the tar is not
            import zstandard
            raw = bytearray(zstandard.ZstdDecompressor().stream_reader(bytes(data)).read())
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            data = bytearray(zstandard.ZstdCompressor(level=3).compress(bytes(raw)))
        path.write_bytes(bytes(data))
    return path, names


@dataclass
class Trial:
    n: int
    kind: str                  # archive or patch
    mutations: list[str]
    rc: int
    first_line: str
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _work_listing(work: Path, roots: Path) -> set[str]:
    """What is in the work folder, the roots' folder and the archives aside (everything there is a root)."""
    out = set()
    for dirpath, dirnames, files in os.walk(work):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) != roots and d != "archives"]
        out.update(os.path.join(dirpath, n) for n in dirnames + files)
    return out


def archive_trial(n: int, base: Members, rng: random.Random, work: Path, env: dict[str, str]) -> Trial:
    """One mutated archive imported into a fresh root beside the sentinel (``work/sentinel``)."""
    sentinel, roots = work / "sentinel", work / "roots"
    (work / "archives").mkdir(exist_ok=True)
    roots.mkdir(exist_ok=True)
    before, around = state_of(sentinel), _work_listing(work, roots)
    archive, names = mutate_archive(base, rng, Aim(sentinel), work / "archives" / f"a{n}.tar.zst")
    root = roots / f"r{n}"
    start = time.monotonic()
    run = cli.run(root, "import", archive, env=env, cwd=work, code=cli.REPO, timeout=300)
    first = next((ln for ln in run.err.splitlines() if ln.strip()), "")
    t = Trial(n, "archive", names, run.rc, first[:300])
    _judge_cli(t, run)
    if run.rc != 0:
        entries = root / "store" / "entries"
        if entries.exists() and any(entries.iterdir()):
            t.problems.append(f"refused, yet entries were published: {sorted(os.listdir(entries))[:3]}")
        if (root / "roots").exists() and any((root / "roots").iterdir()):
            t.problems.append("refused, yet a gc root was written")
    else:
        check = cli.run(root, "verify", env=env, cwd=work, code=cli.REPO, timeout=300)
        if check.rc != 0:
            t.problems.append(f"imported, but verify says: {check.err[-500:]}")
    if state_of(sentinel) != before:
        t.problems.append("the sentinel folder outside the root changed")
    if _work_listing(work, roots) != around:
        t.problems.append(f"the work folder changed: {sorted(_work_listing(work, roots) ^ around)[:3]}")
    t.seconds = round(time.monotonic() - start, 2)
    fs.remove_tree(root)
    archive.unlink()
    return t


def _judge_cli(t: Trial, run: cli.Result) -> None:
    if "Traceback" in run.err or "internal error" in run.err:
        t.problems.append(f"a traceback or internal error: {run.err[-800:]}")
    elif run.rc == 1 and "bytes free" in run.err:
        pass  # an archive that declares more than the disk holds: refused before extracting (exit 1, as ENOSPC)
    elif run.rc not in (0, 2):
        t.problems.append(f"exit {run.rc}: {run.err[-500:]}")
    elif run.rc == 2 and not t.first_line.startswith("error: "):
        t.problems.append(f"exit 2 without an error line: {run.err[-300:]}")


def make_base_export(work: Path, env: dict[str, str]) -> Path:
    """A real export: two wheels from a loopback index realized into a root, then `hermetic export`."""
    from tests.support.index import serve_index
    from tests.support.recipes import make_pkg, pip_lock_line, write_recipe
    wheels = [make_pkg(work / "whl", f"fuzz{i}", "1.0") for i in range(2)]
    with serve_index(*(w.path for w in wheels)) as index:
        recipe = write_recipe(work / "recipe", "fuzzed", "".join(pip_lock_line(w) for w in wheels))
        source = work / "source-root"
        cli.run(source, "realize", recipe, env={**env, "PIP_INDEX_URL": index.simple_url}, cwd=work, code=cli.REPO,
                check=True)
    archive = work / "base.tar.zst"
    cli.run(source, "export", archive, "--level", "3", env=env, cwd=work, code=cli.REPO, check=True)
    fs.remove_tree(source)
    return archive


# --- patches -------------------------------------------------------------------------------------------------------
GIT = ["git", "-c", "user.email=f@example.org", "-c", "user.name=f", "-c", "core.symlinks=true"]
SOURCE = {"a.cpp": "int a() { return 1; }\n" * 8, "b.h": "#pragma once\nint b;\n" * 6,
          "sub/c.cpp": "int c;\n" * 10, "run.sh": "#!/bin/sh\necho hi\n"}


def make_source(folder: Path) -> Path:
    for rel, text in SOURCE.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def make_base_patch(work: Path) -> str:
    """A real git patch of the source: a change, a new file, a deleted file, the executable bit set."""
    repo = make_source(work / "git")
    subprocess.run([*GIT, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "."], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=repo, check=True)
    (repo / "a.cpp").write_text("int a() { return 2; }\n" + "int a() { return 1; }\n" * 7)
    (repo / "d.h").write_text("#define D 1\n")
    (repo / "sub" / "c.cpp").unlink()
    os.chmod(repo / "run.sh", 0o755)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    return subprocess.run([*GIT, "diff", "--cached"], cwd=repo, check=True, capture_output=True, text=True).stdout


PatchMutation = Callable[[random.Random, list[str], Aim], list[str]]


def _insert(rng: random.Random, lines: list[str], new: list[str]) -> list[str]:
    heads = [i for i, ln in enumerate(lines) if ln.startswith(("diff --git", "--- ", "index "))] or [0]
    at = rng.choice(heads) + rng.choice([0, 1])
    return lines[:at] + new + lines[at:]


def p_header(rng: random.Random, lines: list[str], aim: Aim) -> list[str]:
    new = rng.choice([["new file mode 120000"], ["index 0000000..17984f4 120000"], ["old mode 100644",
                      "new mode 120000"], ["rename from a.cpp", "rename to z.cpp"], ["copy from b.h", "copy to y.h"],
                      ["similarity index 90%"], ["GIT binary patch", "literal 0", "HcmV?d00001", ""],
                      ["Binary files a/a.cpp and b/a.cpp differ"], ["deleted file mode 160000"],
                      ["new file mode 100644 extra"], ["index zz"], ["new mode 0100755"]])
    return _insert(rng, lines, new)


def p_symlink_file(rng: random.Random, lines: list[str], aim: Aim) -> list[str]:
    target = rng.choice([str(aim.sentinel / "precious.txt"), "../" * 8 + "etc/passwd", "a.cpp", str(aim.sentinel)])
    mode = rng.choice(["new file mode 120000", "index 0000000..17984f4 120000"])
    head = ["diff --git a/leak.h b/leak.h"] + ([mode] if mode.startswith("new") else []) + \
        ["index 0000000..17984f4" + (" 120000" if not mode.startswith("new") else "")]
    return lines + head + ["--- /dev/null", "+++ b/leak.h", "@@ -0,0 +1 @@", f"+{target}",
                           "\\ No newline at end of file"]


def p_path(rng: random.Random, lines: list[str], aim: Aim) -> list[str]:
    idx = [i for i, ln in enumerate(lines) if ln.startswith(("--- a/", "+++ b/", "diff --git"))]
    if not idx:
        return lines
    i = rng.choice(idx)
    bad = rng.choice(["../sentinel/precious.txt", "sub/../../sentinel/x", str(aim.sentinel / "precious.txt"),
                      '"a\\tb"', "a\x1bb", "", "./a.cpp", "a.cpp b/other", "sub//c.cpp"])
    ln = lines[i]
    if ln.startswith("diff --git"):
        lines[i] = f"diff --git a/{bad} b/{bad}" if rng.random() < 0.7 else f"diff --git a/a.cpp b/{bad}"
    else:
        lines[i] = ln[:6] + bad if rng.random() < 0.8 else ln[:4] + bad
    return lines


def p_plain_escape(rng: random.Random, lines: list[str], aim: Aim) -> list[str]:
    path = rng.choice([str(aim.sentinel / "precious.txt"), "a/../../sentinel/precious.txt"])
    return [f"--- {path}", f"+++ {path}", "@@ -1 +1 @@", "-the user's file", "+owned"]


def p_hunk(rng: random.Random, lines: list[str], aim: Aim) -> list[str]:
    choice = rng.randint(0, 4)
    if choice == 0:   # counts that lie
        return [f"@@ -{rng.randint(0, 99)},{rng.randint(0, 99)} +{rng.randint(0, 99)},{rng.randint(0, 999)} @@"
                if ln.startswith("@@") else ln for ln in lines]
    if choice == 1 and len(lines) > 2:
        del lines[rng.randrange(1, len(lines))]
        return lines
    if choice == 2:
        return [ln + "\r" for ln in lines]
    if choice == 3:
        return lines[:rng.randrange(1, len(lines) + 1)]
    text = bytearray("\n".join(lines).encode())
    for _ in range(rng.randint(1, 6)):
        text[rng.randrange(len(text))] = rng.randrange(256)
    return text.decode(errors="replace").split("\n")


def p_benign(rng: random.Random, lines: list[str], aim: Aim) -> list[str]:
    return ["From: someone", "Subject: [PATCH] a change", "", *lines]


PATCH_MUTATIONS: dict[str, PatchMutation] = {
    "header": p_header, "symlink-file": p_symlink_file, "path": p_path, "plain-escape": p_plain_escape,
    "hunk": p_hunk, "benign": p_benign,
}


def patch_trial(n: int, base: str, rng: random.Random, work: Path) -> Trial:
    """One mutated patch applied to the source by the real GNU patch into the store of ``work/patch-root``."""
    from hermetic.errors import BadInput, HermeticError
    from hermetic.extensions.sources import realize_source
    from hermetic.recipe import Source
    from hermetic.reporter import Reporter
    from hermetic.root import Root
    from hermetic.store import Store
    sentinel = work / "sentinel"
    names = rng.sample(sorted(PATCH_MUTATIONS), rng.choice([1, 1, 2]))
    lines = base.splitlines()
    for name in names:
        lines = PATCH_MUTATIONS[name](rng, list(lines), Aim(sentinel))
    patch = work / "patches" / f"p{n}.patch"
    patch.parent.mkdir(exist_ok=True)
    patch.write_text("\n".join(lines) + "\n", errors="surrogateescape")
    source = work / "patch-source"
    if not source.exists():
        make_source(source)
    root = Root(work / "patch-root")
    root.ensure()
    store = Store(root.store).open()
    before = state_of(sentinel)
    entries = set(store.iter_entries())
    start = time.monotonic()
    t = Trial(n, "patch", names, 0, "")
    try:
        tree = realize_source(root, store, Source("s", path=source, where="fuzz.toml:1"), (patch,),
                              Reporter(quiet=True))
        out = tree.out(store)
        odd = [str(p) for p in out.rglob("*") if not (p.is_file() or p.is_dir()) or p.is_symlink()]
        if odd:
            t.problems.append(f"the patched tree holds what is no regular file: {odd[:3]}")
    except BadInput as e:
        t.rc, t.first_line = 2, e.render().splitlines()[0][:300]
        if set(store.iter_entries()) != entries:
            t.problems.append("refused, yet an entry was published")
    except HermeticError as e:
        t.rc, t.first_line = e.exit_code, e.render().splitlines()[0][:300]
        t.problems.append(f"exit {e.exit_code}: {e.render()[:300]}")
    except Exception as e:  # a traceback, had it reached the command line
        t.rc = 1
        t.problems.append(f"internal error: {type(e).__name__}: {e}")
    if state_of(sentinel) != before:
        t.problems.append("the sentinel folder outside the root changed")
    if any((store.tmp).iterdir()):
        t.problems.append(f"store/tmp holds {sorted(os.listdir(store.tmp))[:3]}")
    t.seconds = round(time.monotonic() - start, 3)
    patch.unlink()
    return t


def summary(trials: list[Trial]) -> dict[str, Any]:
    by: dict[str, dict[str, int]] = {}
    for t in trials:
        for m in t.mutations:
            row = by.setdefault(f"{t.kind}:{m}", {"trials": 0, "accepted": 0, "refused": 0, "failed": 0})
            row["trials"] += 1
            row["accepted" if t.rc == 0 else "refused"] += 1
            row["failed"] += not t.ok
    return {"trials": len(trials), "ok": sum(t.ok for t in trials),
            "accepted": sum(t.rc == 0 for t in trials), "refused_exit_2": sum(t.rc == 2 for t in trials),
            "refused_other": sum(t.rc not in (0, 2) for t in trials), "by_mutation": by,
            "failed": [asdict(t) for t in trials if not t.ok]}


def run_fuzz(work: Path, env: dict[str, str], archives: int, patches: int, seed: int,
             log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """``archives`` mutated archives and ``patches`` mutated patches, from ``seed``; the figures."""
    work.mkdir(parents=True, exist_ok=True)
    make_sentinel(work / "sentinel")
    rng = random.Random(seed)
    out: dict[str, Any] = {"seed": seed}
    t0 = time.monotonic()
    if archives:
        base = read_archive(make_base_export(work / "base", env))
        done = []
        for i in range(archives):
            t = archive_trial(i, base, rng, work, env)
            done.append(t)
            log(f"archive {i + 1}/{archives} {'+'.join(t.mutations)}: exit {t.rc} "
                f"{'ok' if t.ok else 'FAILED: ' + '; '.join(t.problems)[:300]}")
        out["archives"] = {**summary(done), "seconds": round(time.monotonic() - t0, 1),
                           "members_of_the_base_export": len(base)}
    t1 = time.monotonic()
    if patches:
        base_patch = make_base_patch(work / "base-patch")
        done = []
        for i in range(patches):
            t = patch_trial(i, base_patch, rng, work)
            done.append(t)
            log(f"patch {i + 1}/{patches} {'+'.join(t.mutations)}: exit {t.rc} "
                f"{'ok' if t.ok else 'FAILED: ' + '; '.join(t.problems)[:300]}")
        out["patches"] = {**summary(done), "seconds": round(time.monotonic() - t1, 1)}
    return out
