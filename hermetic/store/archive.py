"""export / import: a realized closure as one verified zstd-compressed tar, for air-gapped machines.

The archive holds MANIFEST.json first (every member's sha256 and size, every entry's key), then entry
records and blobs. Trees travel as records only and are laid out again on import, so the archive holds each
file's bytes once. Wheel files are not exported: the unpacked entries make them unnecessary.

Import is all or nothing: every member is verified against the manifest into a staging folder before
anything enters the store; a flipped byte, an unexpected member or a size beyond the manifest's is a bad
archive (exit 2) and leaves the store as it was.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, cast

from hermetic import __version__, fs
from hermetic.errors import BadInput, PreconditionFailed, WorkFailed
from hermetic.reporter import Reporter
from hermetic.root import Root, refuse_folders
from hermetic.store import (
    ENTRY_META,
    Store,
    blob_name,
    blob_ref,
    describe,
    lstat_or_none,
    provenance,
    split_blob_name,
    split_refs,
)
from hermetic.store.admission import record_problem
from hermetic.store.records import RECORD_LIMIT, EntryRecord, entry_problem, files_of, read_checked, root_problem
from hermetic.store.roots import root_files as root_files_of
from hermetic.store.roots import root_refs
from hermetic.store.trees import build_tree, tree_entry_name

ARCHIVE_FORMAT = 1
MAX_BLOB_BYTES = 1 << 44   # 16 TiB: a size past this is no file's
_ENTRY_RE = re.compile(r"^entries/([A-Za-z0-9._+-]{1,160})/meta\.json$")
_BLOB_RE = re.compile(r"^blobs/([0-9a-f]{64}x?)$")
_ROOT_RE = re.compile(r"^roots/([A-Za-z0-9._-]{1,80})\.json$")


def _closure(store: Store, refs: set[str]) -> tuple[list[str], dict[str, str]]:
    """The entries reachable from ``refs`` and their blobs, each blob with one path it has in a tree
    (the smallest, for a stable order; a wheel file's own blob gets its reference instead)."""
    entries: list[str] = []
    blobs: dict[str, str] = {}
    pending, _ = split_refs(refs)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or not store.has_entry(name):
            continue
        seen.add(name)
        store.pin_entry(name)  # the caller holds the gc lock: from here to the end of the export gc spares it
        entries.append(name)
        rec = store.record(name)
        for path, (digest, executable) in files_of(rec).items():
            b = blob_name(digest, executable)
            blobs[b] = min(blobs.get(b, path), path)
        named, named_blobs = split_refs(rec["refs"])
        pending += named
        if rec["kind"] != "unpacked":  # an unpacked wheel does not need its wheel file any more
            blobs.update({b: blob_ref(b) for b in named_blobs if store.blob_file(b).exists() and b not in blobs})
    return sorted(entries), blobs


BIG_BLOB = 1 << 20


def stream_order(blobs: dict[str, str], sizes: dict[str, int]) -> list[str]:
    """The order blobs go into the compressed stream: similar bytes close together, so that zstd's window
    (and its long-distance matching) sees them. The large binaries first, largest first: cicc sits next to
    libnvvm and ptxas next to nvlink and nvcc, which share much of their code (grouped, the toolchain
    compresses about a quarter smaller than in hash order); then the small files by extension and path, so
    that headers follow headers of their own library."""
    def key(b: str) -> tuple[int, int, str, str, str]:
        path = blobs[b]
        if sizes[b] >= BIG_BLOB:
            return (0, -sizes[b], "", path, b)
        return (1, 0, os.path.splitext(path)[1], path, b)
    return sorted(blobs, key=key)


def export_closure(root: Root, archive: Path, *, names: list[str], reporter: Reporter,
                   level: int = 19, sign: Path | None = None) -> dict[str, Any]:
    """Write the closure of the roots (``names``, else all) to ``archive``; ``sign``: a secret key file whose
    signature over the manifest lets an importer that trusts its public key take every record."""
    import zstandard

    key = provenance.load_secret(sign) if sign is not None else None  # a bad key fails before any work
    store = Store(root.store)
    if not store.exists():
        raise BadInput(f"nothing to export: no store at {root.store}", where="--root",
                       hint="realize a recipe first")
    store.open()
    target = Path(os.path.realpath(archive))  # through the profile symlinks too: they lead into the store
    if target.is_relative_to(os.path.realpath(store.path)):
        raise BadInput(f"hermetic export would write {archive} inside the store ({target})", where=str(archive),
                       hint="store files are read-only and content-addressed: write the archive outside the store, "
                            "e.g. ./closure.tar.zst")
    if target.is_relative_to(os.path.realpath(root.path)):  # a gc root, a receipt, the marker: hermetic's own
        raise BadInput(f"hermetic export would write {archive} inside the scratch root {root.path} ({target})",
                       where=str(archive), hint="everything under the root is hermetic's (gc --all removes it): "
                                                "write the archive outside it, e.g. ./closure.tar.zst")
    refuse_folders(root.folder_problems())   # roots/ and profiles/ read, never through a link
    wanted = set(names)
    root_files = sorted(p for p in root_files_of(root.roots) if not wanted or p.stem in wanted)
    missing = wanted - {p.stem for p in root_files}
    if missing:
        raise BadInput(f"no root named {', '.join(sorted(missing))}", where="--name",
                       hint="`hermetic show` lists the roots")
    refs: set[str] = set()
    # the roots read and their closure pinned at once, under the gc lock: a gc waits, then sees the pins
    with store.gc_lock():
        root_bytes: dict[Path, bytes] = {}
        for p in root_files:  # a root gc then drops still travels; a bad one is refused (docs/layout.md)
            record = read_checked(p, root_problem, "gc root")
            root_bytes[p] = fs.read_regular(p, RECORD_LIMIT)
            refs.update(record["refs"])
        if not wanted:
            refs |= root_refs(root)
        entries, blobs = _closure(store, refs)
    manifest: dict[str, Any] = {"format": ARCHIVE_FORMAT, "hermetic": __version__,
                                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                "entries": {}, "blobs": {}, "roots": {}}
    metas = {name: fs.read_regular(store.entry_path(name) / ENTRY_META, RECORD_LIMIT) for name in entries}
    for name in entries:
        manifest["entries"][name] = fs.sha256_bytes(metas[name])
    total = 0
    for b in sorted(blobs):
        size = _blob_size(store, b)
        manifest["blobs"][b] = size
        total += size
    order = stream_order(blobs, manifest["blobs"])
    for p in root_files:
        manifest["roots"][p.stem] = fs.sha256_bytes(root_bytes[p])
    if key is not None:
        manifest["signatures"] = [key.sign(provenance.manifest_message(manifest))]
    archive.parent.mkdir(parents=True, exist_ok=True)
    task = reporter.task(f"export {archive.name}", total, "bytes")
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as raw:
            # long-distance matching finds the repeats between nvcc's, cicc's and libnvvm's binaries, which
            # stream_order puts next to each other
            params = zstandard.ZstdCompressionParameters.from_level(
                level, enable_ldm=True, window_log=27, threads=-1, write_checksum=True)
            cctx = zstandard.ZstdCompressor(compression_params=params)
            with cctx.stream_writer(raw, closefd=False) as zw, \
                    tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add_bytes(tar, "MANIFEST.json", fs.canonical_json(manifest))
                for name in entries:
                    _add_bytes(tar, f"entries/{name}/meta.json", metas[name])
                for p in root_files:
                    _add_bytes(tar, f"roots/{p.name}", root_bytes[p])
                for b in order:
                    info = tarfile.TarInfo(f"blobs/{b}")
                    info.size = manifest["blobs"][b]
                    info.mode = 0o555 if split_blob_name(b)[1] else 0o444
                    with _BlobReader(store, b, info.size) as f:
                        tar.addfile(info, f)
                        f.check()
                    task.advance(info.size)
        os.replace(tmp, archive)
    finally:
        task.close()
        if tmp.exists():
            tmp.unlink()
    return {"entries": len(entries), "blobs": len(blobs), "bytes": total,
            "archive_bytes": archive.stat().st_size, "signed_by": key.name if key is not None else None}


def _damaged(store: Store, blob: str, what: str) -> WorkFailed:
    return WorkFailed(f"blob {blob} {what}: the store is damaged, so nothing was exported",
                      where=str(store.blob_file(blob)),
                      hint="run `hermetic verify --repair` (it removes the blob, which is fetched or built again), "
                           "then export again")


def _blob_size(store: Store, blob: str) -> int:
    """A blob's size as its lstat says, once it is the store's own regular file (exit 1 naming it if not)."""
    st = lstat_or_none(store.blob_file(blob))
    if st is None:
        raise _damaged(store, blob, "is missing")
    if not stat.S_ISREG(st.st_mode):
        raise _damaged(store, blob, f"is {describe(st.st_mode)}, not a file")
    return st.st_size


class _BlobReader:
    """A blob read into the archive as the store's own regular file: opened without following a link or waiting
    on a FIFO, checked by fstat, and hashed while tarfile reads it. A blob of another size, or whose bytes do not
    hash to its name, fails the export (exit 1, naming it): the archive never vouches for wrong bytes."""

    def __init__(self, store: Store, blob: str, size: int) -> None:
        self.store, self.blob, self.size = store, blob, size
        path = store.blob_file(blob)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _damaged(store, blob, "is missing") from None
        except PermissionError:
            raise _damaged(store, blob, "cannot be read by this user (its mode)") from None
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise _damaged(store, blob, "is a symbolic link, not a file") from None
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            raise _damaged(store, blob, f"is {describe(st.st_mode)}, not a file")
        if st.st_size != size:
            os.close(self.fd)
            raise _damaged(store, blob, f"holds {st.st_size} bytes where {size} were listed")
        self.hash = hashlib.sha256()
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the listed size, all of them unless the file ends first (then exit 1)."""
        want = self.size - self.read_bytes if n < 0 else min(n, self.size - self.read_bytes)
        parts = []
        while want > 0:
            chunk = os.read(self.fd, want)
            if not chunk:   # shorter than its lstat said (it changed while read)
                raise _damaged(self.store, self.blob, f"ended after {self.read_bytes} of its {self.size} bytes")
            parts.append(chunk)
            self.hash.update(chunk)
            self.read_bytes += len(chunk)
            want -= len(chunk)
        return b"".join(parts)

    def check(self) -> None:
        if self.hash.hexdigest() != split_blob_name(self.blob)[0]:
            raise _damaged(self.store, self.blob, f"hashes to {self.hash.hexdigest()[:16]}…, not to its name")

    def __enter__(self) -> _BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    tar.addfile(info, io.BytesIO(data))


def import_closure(root: Root, archive: Path, *, reporter: Reporter,
                   host: Callable[[], Mapping[str, object]], trust_unsigned: bool = False,
                   trusted: list[provenance.PublicKey] | None = None) -> dict[str, Any]:
    """Verify and add an archive; ``host`` gives this machine's interpreter and torch identity (asked only
    when an entry was built for one: it may import torch). Records that cannot be re-derived (objects,
    modules, unpacked wheels, source trees) are taken only under a signature by a key of ``trusted`` (default:
    HERMETIC_TRUSTED_KEYS), or with ``trust_unsigned``; otherwise they are left out, and said. Every import
    writes its receipt in ``imports/``."""
    import zstandard

    if not archive.is_file():
        raise BadInput(f"archive {archive} does not exist", where=str(archive))
    keys = provenance.trusted_keys() if trusted is None else trusted
    root.ensure()
    store = Store(root.store).open()
    staging = store.work_dir("import-")   # locked while this process lives: gc spares it
    try:
        with open(archive, "rb") as raw:
            dctx = zstandard.ZstdDecompressor(max_window_size=1 << 27)
            with dctx.stream_reader(raw) as zr:
                manifest, metas, roots, blob_files = _read_verified(zr, staging, archive)
        _check_records(store, metas, blob_files, archive)  # every record, before anything is published
        signer, vouched_by = _vouch(manifest, keys, trust_unsigned, archive)
        left_out = [] if vouched_by else sorted(n for n, m in metas.items() if needs_vouching(n, m))
        kept = {n: m for n, m in metas.items() if n not in left_out}
        wanted = _wanted_blobs(kept, blob_files) if left_out else set(blob_files)
        blob_files = {b: p for b, p in blob_files.items() if b in wanted}
        _check_hosts(host, kept, archive)
        new_blobs = sum(not store.has_blob(*split_blob_name(b)) for b in blob_files)
        _publish(root, store, kept, _as_imported(roots, archive), blob_files)
    except (zstandard.ZstdError, tarfile.TarError, EOFError) as e:
        raise BadInput(f"archive {archive.name} is damaged: {e}", where=str(archive),
                       hint="copy it again; nothing was imported") from None
    finally:
        fs.remove_tree(staging)
    stats: dict[str, Any] = {
        "entries": len(kept), "blobs": len(blob_files), "new_blobs": new_blobs, "roots": len(roots),
        "bytes": sum(manifest["blobs"].values()), "signed_by": signer, "vouched_by": vouched_by,
        "trust_unsigned": vouched_by == "--trust-unsigned", "left_out": left_out}
    _write_receipt(root, archive, stats)
    return stats


def needs_vouching(name: str, meta: Mapping[str, Any]) -> bool:
    """Whether a record says more than its name proves (store/provenance.py): an object (its compiled bytes),
    a module (its linked library), an unpacked wheel (the wheel is not in the archive) and an input-addressed
    source tree; a content-addressed tree is named by the files and links it holds, a blob by its bytes."""
    if meta["kind"] != "tree":
        return True
    files = {p: (d, bool(x)) for p, (d, x) in meta["files"].items()}
    return bool(tree_entry_name(meta["label"], files, meta["links"]) != name)


def _vouch(manifest: dict[str, Any], keys: list[provenance.PublicKey], trust_unsigned: bool,
           archive: Path) -> tuple[str | None, str | None]:
    """(the key that signed the manifest, or None; who vouches for its records: "key NAME", "--trust-unsigned"
    or None). A signature by a trusted key that does not verify is a changed archive: refused."""
    try:
        sigs = provenance.signatures_of(manifest)
    except ValueError as e:
        raise BadInput(f"archive {archive.name}: MANIFEST.json: {e}", where=str(archive),
                       hint="the archive is damaged or not from `hermetic export`; nothing was imported") from None
    signer, broken = provenance.trusted_signer(provenance.manifest_message(manifest), sigs, keys) if sigs \
        else (None, [])
    if broken:
        raise BadInput(f"archive {archive.name}: its signature by trusted key {broken[0]} does not verify: it was "
                       "changed after it was signed", where=str(archive),
                       hint="copy it again from its signer; nothing was imported")
    if signer is not None:
        return signer, f"key {signer}"
    return (sigs[0]["key"] if sigs else None), ("--trust-unsigned" if trust_unsigned else None)


def _wanted_blobs(kept: Mapping[str, Any], blob_files: Mapping[str, Path]) -> set[str]:
    """The blobs the records kept need or name (what left-out records alone need would be garbage)."""
    wanted: set[str] = set()
    for meta in kept.values():
        wanted |= _needed_blobs(meta) | set(split_refs(meta["refs"])[1])
    return wanted & set(blob_files)


def _write_receipt(root: Root, archive: Path, stats: Mapping[str, Any]) -> None:
    """``imports/<time>-<pid>.json``: what an import took, from which archive, and who vouched for it."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    record = {"format": 1, "kind": "import", "archive": str(archive.absolute()),
              "archive_sha256": fs.sha256_file(archive)[0], "time": stamp, **stats}
    fs.atomic_write_json(root.path / "imports" / f"{stamp}-{os.getpid()}.json", record, pretty=True)


def _read_verified(stream: IO[bytes], staging: Path, archive: Path) -> tuple[
        dict[str, Any], dict[str, dict[str, Any]], dict[str, bytes], dict[str, Path]]:
    def bad(what: str) -> BadInput:
        return BadInput(f"archive {archive.name}: {what}", where=str(archive),
                        hint="the archive is damaged or not from `hermetic export`; nothing was imported")

    manifest: dict[str, Any] | None = None
    metas: dict[str, dict[str, Any]] = {}
    roots: dict[str, bytes] = {}
    blobs: dict[str, Path] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                raise bad(f"member {member.name!r} is not a regular file")
            name = member.name
            if manifest is None:
                if name != "MANIFEST.json" or member.size > 64 << 20:
                    raise bad("the first member is not MANIFEST.json")
                manifest = _load_manifest(tar, member, bad)
                _check_space(manifest, staging, archive)  # before a byte of a blob is written
                continue
            if m := _BLOB_RE.match(name):
                bname = m.group(1)
                if manifest["blobs"].get(bname) != member.size:
                    raise bad(f"blob {bname[:16]}… is not in the manifest with this size")
                blobs[bname] = _extract_blob(tar, member, staging, bname, bad)
            elif m := _ENTRY_RE.match(name):
                data = _read_member(tar, member, 256 << 20)
                if manifest["entries"].get(m.group(1)) != fs.sha256_bytes(data):
                    raise bad(f"entry {m.group(1)} does not match the manifest")
                try:
                    metas[m.group(1)] = json.loads(data)
                except ValueError:
                    raise bad(f"entry {m.group(1)} is not JSON") from None
            elif m := _ROOT_RE.match(name):
                data = _read_member(tar, member, 1 << 20)
                if manifest["roots"].get(m.group(1)) != fs.sha256_bytes(data):
                    raise bad(f"root {m.group(1)} does not match the manifest")
                try:
                    why = root_problem(json.loads(data))
                except ValueError:  # UnicodeDecodeError too
                    why = "it is not JSON"
                if why is not None:  # a bad gc root would make every later gc refuse to collect
                    raise bad(f"member {name} is no gc root: {why}")
                roots[m.group(1)] = data
            else:
                raise bad(f"unexpected member {name!r}")
    if manifest is None:
        raise bad("it is empty")
    if set(manifest["blobs"]) != set(blobs) or set(manifest["entries"]) != set(metas):
        raise bad("members listed in the manifest are missing (truncated archive?)")
    return manifest, metas, roots, blobs


def _load_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, bad: Any) -> dict[str, Any]:
    try:
        manifest = json.loads(_read_member(tar, member, 64 << 20))
    except ValueError:
        raise bad("MANIFEST.json is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ARCHIVE_FORMAT:
        raise bad(f"unsupported manifest format (this hermetic reads format {ARCHIVE_FORMAT})")
    for key in ("entries", "blobs", "roots"):
        if not isinstance(manifest.get(key), dict):
            raise bad(f"MANIFEST.json has no {key} table")
    for name, size in manifest["blobs"].items():
        if not (isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= MAX_BLOB_BYTES):
            raise bad(f"MANIFEST.json gives blob {str(name)[:16]}… the size {str(size)[:40]!r}")
    for key in ("entries", "roots"):
        for name, digest in manifest[key].items():
            if not (isinstance(digest, str) and len(digest) == 64):
                raise bad(f"MANIFEST.json gives {key[:-1]} {str(name)[:40]!r} no sha256")
    return manifest


def _check_space(manifest: dict[str, Any], staging: Path, archive: Path) -> None:
    """The blobs the manifest declares must fit the free space of the store's file system, checked before
    anything is extracted (a small archive may declare, and hold, gigabytes of zeros)."""
    import shutil
    need = sum(manifest["blobs"].values())
    free = shutil.disk_usage(staging).free
    if need > free:
        raise WorkFailed(f"archive {archive.name} holds {need} bytes of files and the store's file system has "
                         f"{free} bytes free", where=str(archive),
                         hint="free space (`hermetic gc` deletes what no root needs) or import into a root on a "
                              "larger file system; nothing was imported")


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    if member.size > limit:
        raise BadInput(f"archive member {member.name} is larger than {limit} bytes")
    f = tar.extractfile(member)
    assert f is not None
    return f.read()


def _extract_blob(tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path, bname: str,
                  bad: Any) -> Path:
    """A blob member into the staging folder, never past its declared size (checked while it streams) and
    hashed on the way."""
    f = tar.extractfile(member)
    assert f is not None
    dst = staging / bname
    try:
        digest, size = fs.copy_hashed(f, dst, limit=member.size)
    except fs.TooLarge:
        raise bad(f"blob {bname[:16]}… is larger than its declared {member.size} bytes") from None
    except FileExistsError:
        raise bad(f"blob {bname[:16]}… appears twice") from None
    if size != member.size:
        raise bad(f"blob {bname[:16]}… is shorter than its declared {member.size} bytes")
    if digest != split_blob_name(bname)[0]:
        raise bad(f"blob {bname[:16]}… does not hash to its name")
    return dst


def _check_hosts(host: Callable[[], Mapping[str, object]], metas: dict[str, dict[str, Any]], archive: Path) -> None:
    """Entries built for an interpreter or torch are only accepted on a machine that has the same."""
    needs = {name: m["host"] for name, m in metas.items() if isinstance(m.get("host"), dict)}
    if not needs:
        return
    here = host()
    for name, facts in sorted(needs.items()):
        for key, want in sorted(facts.items()):
            if here.get(key) != want:
                raise PreconditionFailed(
                    f"entry {name} was built for {key}={want}, this machine has {here.get(key)}",
                    where=str(archive), hint="export from a machine with the same interpreter and torch")


def _check_records(store: Store, metas: dict[str, Any], blob_files: dict[str, Path], archive: Path) -> None:
    """Refuse the archive (nothing published yet) unless every record is the entry it claims to be (the
    checks a remote cache's records pass: store/admission.py) and every blob it needs is in the archive or,
    pinned now, in the store."""
    for name in sorted(metas):
        meta = metas[name]
        why = entry_problem(meta, name) or record_problem(meta, name)  # its shape, then its name
        if why is None:
            missing = [b for b in sorted(_needed_blobs(meta)) if b not in blob_files and not
                       store.use_blob(*split_blob_name(b))]
            why = f"it needs blob {missing[0][:16]}…, which neither the archive nor this store holds" \
                if missing else None
        if why is not None:
            raise BadInput(f"archive {archive.name}: entry {name} cannot be imported: {why}", where=str(archive),
                           hint="the archive is damaged or not from `hermetic export`; nothing was imported")


def _needed_blobs(meta: dict[str, Any]) -> set[str]:
    """The blobs an entry cannot be laid out or used without (a wheel's own file is not one: it is unpacked)."""
    needed = {blob_name(d, bool(x)) for d, x in files_of(cast(EntryRecord, meta)).values()}
    if meta["kind"] == "object":
        needed |= set(split_refs(meta["refs"])[1])
    elif meta["kind"] == "module":
        needed.add(meta["so"])
    return needed


def _as_imported(roots: dict[str, bytes], archive: Path) -> dict[str, bytes]:
    """The archive's gc roots as this root keeps them: marked imported, from which archive. A root's ``recipe`` is
    the exporter's path, vouched for by nobody (no signature covers what it would run): ``verify --repair``
    realizes only recipes a realize on this machine wrote into a root, and a local realize of the recipe
    rewrites its root without the mark."""
    out = {}
    for name, data in roots.items():
        record = json.loads(data)   # checked by root_problem already
        record["imported_from"] = os.path.abspath(archive)
        out[name] = fs.pretty_json(record)
    return out


def _publish(root: Root, store: Store, metas: dict[str, Any], roots: dict[str, bytes],
             blob_files: dict[str, Path]) -> None:
    """Blobs, then entries (trees last: they link the others' blobs), then the index links of the objects,
    then the roots. All or nothing: a failure midway takes back the roots and index links written and the
    entries published (those no other process has pinned meanwhile); the blobs stay, unpinned garbage for
    the next gc."""
    published: list[str] = []
    links: list[Path] = []
    written: list[Path] = []
    try:
        for bname, path in blob_files.items():
            store.put_blob_file(path, *split_blob_name(bname))  # pins it
        for name, meta in sorted(metas.items(), key=lambda kv: (kv[1]["kind"] == "tree", kv[0])):
            if _import_entry(store, name, meta):
                published.append(name)
        for name, meta in sorted(metas.items()):
            # an object is listed where a build's lookup finds it, as one compiled here
            if meta["kind"] == "object" and name not in store.index_list(meta["lookup"]):
                links.append(store.index_add(meta["lookup"], name))
        for rname, data in sorted(roots.items()):
            dst = root.roots / f"{rname}.json"
            if not dst.exists():
                fs.atomic_write(dst, data)
                written.append(dst)
    except BaseException:
        for p in [*written, *links]:
            p.unlink(missing_ok=True)
        store.unpublish(published)
        raise


def _import_entry(store: Store, name: str, meta: dict[str, Any]) -> bool:
    """Publish one checked record; whether this import published it (False: the store had it)."""
    if meta["kind"] == "tree":
        files = {p: (d, bool(x)) for p, (d, x) in meta["files"].items()}
        return build_tree(store, meta["label"], files, meta["links"], meta["refs"], name=name,
                          source=meta.get("source"))[1]
    with store.build_entry(name) as staging:
        if staging is None:
            return False
        staging.record = cast(EntryRecord, meta)
    return True
