"""What hermetic shares through a remote cache, and how it lies there (docs/remote.md).

* **Wheels and source archives**: ``cas/<sha256>``, the hash the lock or recipe pins. No action entry: the
  pin is the key.
* **Objects**: ``ac/<objects_key(lookup)>`` is an ActionResult listing, newest first, the object records
  compiled under that lookup key (toolchain, command without defines, compiler environment): for each, the
  record ``<entry>/meta.json`` (the store's meta.json, canonical JSON) and the object ``<entry>/object``. A
  reader checks each record's inputs against its own files exactly as a local lookup does (every input
  hash equal; defines equal or waivable), then fetches only the object it will use. Adding a record is a
  read-modify-write of the list: two writers at once may drop one record, which costs a later miss, never
  a wrong object.
* **Modules and certificates**: ``ac/<module_key(key)>`` holds the linked module and the certificate of
  the build that linked it, under the module's own key (host, toolchain, link command, object digests).

Everything fetched is verified (sha256, sizes, a record's name against its recomputed key) before it enters
the store; any failure is a miss with a warning. Writers upload CAS blobs before the action entry that
names them. Hashes protect the CAS; the action entries say which object a compile gets, so only trusted
builders may write them (docs/remote.md).

* **Signatures** (issue 34): a writer with ``HERMETIC_SIGNING_KEY`` signs each action entry it writes. The
  signature lies in a sidecar entry, ``ac/<signature_key(key)>``, an ActionResult naming one CAS blob
  (``signature.json``: the entry's key, its files and the signatures), so the server stays a plain Bazel
  HTTP cache (nginx stores bytes; bazel-remote finds an ActionResult whose blob it has). What is signed is
  the entry's key and its decoded file list, not its bytes (bazel-remote re-encodes an entry on PUT). A
  reader with ``HERMETIC_TRUSTED_KEYS`` takes an action entry only under a signature by one of those keys:
  an unsigned entry, or one whose files changed since it was signed, is a miss with a warning.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from hermetic import fs
from hermetic.extensions.objects import Chosen, ObjectCache, object_bytes
from hermetic.extensions.plan import Compile
from hermetic.remote.actionresult import SHA256_RE, OutputFile
from hermetic.remote.storage import Storage
from hermetic.store import STORE_FORMAT, Store, blob_ref, provenance
from hermetic.store.admission import record_problem
from hermetic.store.records import ObjectRecord

AC_SALT = "hermetic-remote-v2"  # v2: path-independent object keys (keys.SALT v2)
MAX_CANDIDATES = 16          # object records kept per lookup key (newest first)
MAX_META_BYTES = 64 << 20
CERTIFICATE = "certificate.json.zst"
SIGNATURE = "signature.json"
MAX_SIGNATURE_BYTES = 64 << 10
WORKERS = 8
_OBJECT_NAME = re.compile(r"^[0-9a-f]{32}-obj-[A-Za-z0-9._+-]{1,80}$")
T = TypeVar("T")
R = TypeVar("R")


def objects_key(lookup: str) -> str:
    """The action entry listing the object records of one lookup key."""
    return fs.sha256_bytes(fs.canonical_json({"salt": AC_SALT, "kind": "objects", "lookup": lookup}))


def module_key(key: str) -> str:
    """The action entry of one linked module (its store key: host, toolchain, link command, objects)."""
    return fs.sha256_bytes(fs.canonical_json({"salt": AC_SALT, "kind": "module", "key": key}))


def signature_key(key: str) -> str:
    """The sidecar entry holding the signatures of action entry ``key``."""
    return fs.sha256_bytes(fs.canonical_json({"salt": AC_SALT, "kind": "signature", "ac": key}))


def signed_message(key: str, files: Sequence[OutputFile]) -> bytes:
    """What a signature of action entry ``key`` covers: its key and its files (path, digest, size, mode)."""
    listed = [[f.path, f.digest, f.size, f.executable] for f in files]
    return provenance.REMOTE_DOMAIN + fs.canonical_json({"ac": key, "files": listed})


class Sharing:
    def __init__(self, remote: Storage, store: Store, *, trusted: list[provenance.PublicKey] | None = None,
                 signer: provenance.SecretKey | None = None, from_environment: bool = True) -> None:
        """``trusted``: the keys an action entry must be signed by (default HERMETIC_TRUSTED_KEYS; none: every
        entry is taken, as before signatures); ``signer``: the key this writer signs with (default
        HERMETIC_SIGNING_KEY)."""
        self.remote, self.store = remote, store
        self.trusted = trusted if trusted is not None else provenance.trusted_keys() if from_environment else []
        self.signer = signer if signer is not None else provenance.signing_key() if from_environment else None
        self.counts = {"wheels_fetched": 0, "objects_fetched": 0, "modules_fetched": 0, "objects_uploaded": 0,
                       "modules_uploaded": 0, "blobs_uploaded": 0, "unsigned_ignored": 0, "entries_signed": 0}
        self._counts_lock = threading.Lock()  # uploads and fetches run in threads (_parallel)

    def summary(self) -> dict[str, Any]:
        return {**self.remote.summary(), **self.counts, "trusted_keys": sorted({k.name for k in self.trusted}),
                "signs_as": self.signer.name if self.signer is not None else None}

    # signatures ---------------------------------------------------------------------
    def _vouched(self, key: str, files: list[OutputFile], what: str, *, keys: list[provenance.PublicKey]) -> bool:
        """Whether action entry ``key`` (its ``files``) is signed by one of ``keys``; a warning when not."""
        sidecar = self.remote.get_ac(signature_key(key)) or []
        stmt = next((f for f in sidecar if f.path == SIGNATURE), None)
        data = self.remote.get_cas_bytes(stmt.digest, MAX_SIGNATURE_BYTES, listed=True) if stmt else None
        why = "it is signed by no key"
        if data is not None:
            try:
                record = json.loads(data)
                sigs = provenance.signatures_of(record) if isinstance(record, dict) else []
            except ValueError:
                sigs = []
            signer, broken = provenance.trusted_signer(signed_message(key, files), sigs, keys)
            if signer is not None:
                return True
            why = (f"its signature by {broken[0]} does not cover what it holds now" if broken else
                   f"it is signed by {', '.join(sorted({s['key'] for s in sigs})) or 'no key'}, which "
                   f"{provenance.ENV_TRUSTED} does not name")
        with self._counts_lock:
            self.counts["unsigned_ignored"] += 1
        self.remote.failed(f"{what} (ac/{key[:16]}…): {why}; ignoring it")
        return False

    def _taken(self, key: str, files: list[OutputFile] | None, what: str) -> list[OutputFile] | None:
        """``files`` of action entry ``key`` when this reader takes them: always where no key is trusted, else
        under a trusted signature."""
        if not files or not self.trusted:
            return files
        return files if self._vouched(key, files, what, keys=self.trusted) else None

    def _replaces_unsigned(self, key: str, filename: str) -> bool:
        """A signing writer writes its own module entry over one no key it trusts signed (else readers that
        require signatures would never take this module)."""
        if self.signer is None:
            return False
        files = self.remote.get_ac(key)
        return not files or not self._vouched(key, files, f"the module entry of {filename} there already",
                                              keys=[*self.trusted, self.signer.public])

    def _put_signed(self, key: str, files: list[OutputFile]) -> bool:
        """Write action entry ``key``, then (with a signing key) its signature in the sidecar entry, whose blob
        goes up first: a bazel-remote answers 404 for an entry whose blob it lacks."""
        if not self.remote.put_ac(key, files):
            return False
        if self.signer is None:
            return True
        stmt = fs.canonical_json({"format": 1, "ac": key, "signatures": [
            self.signer.sign(signed_message(key, files))]})
        digest = fs.sha256_bytes(stmt)
        if self.remote.put_cas_bytes(digest, stmt) and \
                self.remote.put_ac(signature_key(key), [OutputFile(SIGNATURE, digest, len(stmt))]):
            with self._counts_lock:
                self.counts["entries_signed"] += 1
        return True

    def record(self) -> dict[str, str]:
        return self.remote.settings.record()

    def close(self) -> None:
        self.remote.close()

    # blobs: wheels and source archives --------------------------------------------
    def fetch_blob(self, digests: Sequence[str], size: int | None = None, *, listed: bool = False,
                   what: str = "blob") -> str | None:
        """The first of ``digests`` the remote has, verified and put in the store; None otherwise. ``what``: a
        "wheel" fetched from the remote is counted as one (the receipt's ``wheels_fetched``)."""
        for digest in digests:
            digest = digest.lower()
            if not SHA256_RE.match(digest):
                continue
            if self.store.use_blob(digest):  # pinned and checked under the gc lock
                return digest
            tmp = self.remote.get_cas_file(digest, self.store.tmp, size=size, listed=listed)
            if tmp is not None:
                self.store.put_blob_file(tmp, digest)  # pins it
                if what == "wheel":
                    with self._counts_lock:
                        self.counts["wheels_fetched"] += 1
                return digest
        return None

    def upload_blob(self, digest: str) -> None:
        if self.remote.writable and self.remote.put_cas_file(digest, self.store.blob_path(digest)):
            self.counts["blobs_uploaded"] += 1

    # objects ------------------------------------------------------------------------
    def fetch_objects(self, cache: ObjectCache, compiles: Iterable[Compile]) -> set[str]:
        """Put into the local store every object of ``compiles`` the remote has and the local lookup
        would accept; returns the sources (Compile.rel) for which it did."""
        by_lookup: dict[str, list[Compile]] = {}
        for c in compiles:
            by_lookup.setdefault(cache.lookup(c), []).append(c)
        if not by_lookup or not self.remote.usable:
            return set()
        records = dict(zip(by_lookup, _parallel(self._records, list(by_lookup)), strict=True))
        wanted: dict[str, ObjectRecord] = {}
        for lk, cs in by_lookup.items():
            for c in cs:  # input hashes in this thread: the hasher is the build's
                chosen = cache.choose(c, records[lk]) if records[lk] else None
                if isinstance(chosen, Chosen):
                    wanted[c.rel] = chosen.record
        pairs = sorted({(m["object"], m["size"]) for m in wanted.values()})
        ok = _parallel(lambda pair: self.fetch_blob([pair[0]], pair[1], listed=True) is not None, pairs)
        got = {digest for (digest, _size), fine in zip(pairs, ok, strict=True) if fine}
        fetched = set()
        for rel, meta in wanted.items():
            if meta["object"] in got:
                cache.adopt(meta)
                fetched.add(rel)
        self.counts["objects_fetched"] += len(fetched)
        return fetched

    def _records(self, lookup: str) -> list[ObjectRecord]:
        """The valid object records the remote lists under ``lookup`` and this store does not have."""
        key = objects_key(lookup)
        files = self._taken(key, self.remote.get_ac(key), "the list of object records of a lookup key")
        out: list[ObjectRecord] = []
        for name, (meta_file, object_file) in _manifest(files or []).items():
            if self.store.has_entry(name):
                continue  # the local lookup already weighed it
            data = self.remote.get_cas_bytes(meta_file.digest, MAX_META_BYTES, listed=True)
            if data is None:
                continue
            why = _invalid_record(data, name, lookup, object_file)
            if why is not None:
                self.remote.failed(f"object record {name} is not valid ({why}); ignoring it")
                continue
            out.append(cast(ObjectRecord, json.loads(data)))  # checked field by field just now
        return out

    def upload_objects(self, metas: Iterable[ObjectRecord]) -> None:
        """Share object records (CAS blobs first, then the list of their lookup key). Records the list
        already holds cost one GET per lookup key and no upload."""
        by_lookup: dict[str, list[ObjectRecord]] = {}
        for meta in metas:
            by_lookup.setdefault(meta["lookup"], []).append(meta)
        if by_lookup and self.remote.writable:
            self.counts["objects_uploaded"] += sum(_parallel(self._upload_lookup, list(by_lookup.items())))

    def _upload_lookup(self, item: tuple[str, list[ObjectRecord]]) -> int:
        lookup, metas = item
        key = objects_key(lookup)
        current = self.remote.get_ac(key) or []
        # a signing writer keeps only what a key it trusts (its own among them) signed: it never vouches, by
        # signing the new list, for records someone else put there
        if current and self.signer is not None and not self._vouched(
                key, current, "the list this writer extends", keys=[*self.trusted, self.signer.public]):
            current = []
        listed = _manifest(current)
        added: list[tuple[OutputFile, OutputFile]] = []
        for meta in metas:
            # the team's records name the object's own bytes: how this store keeps them is its own affair
            shared: ObjectRecord = {**meta, "refs": [blob_ref(meta["object"])]}
            shared.pop("packed", None)
            data = fs.canonical_json(shared)
            digest = fs.sha256_bytes(data)
            if meta["name"] in listed and listed[meta["name"]][0].digest == digest:
                continue
            if not (self._put_object(meta) and self.remote.put_cas_bytes(digest, data)):
                return 0  # the list never names a blob that is not uploaded
            added.append((OutputFile(f"{meta['name']}/meta.json", digest, len(data)),
                          OutputFile(f"{meta['name']}/object", meta["object"], meta["size"])))
        if not added:
            return 0
        names = {a[0].path.split("/")[0] for a in added}
        kept = [pair for name, pair in listed.items() if name not in names]
        pairs = (added + kept)[:MAX_CANDIDATES]
        return len(added) if self._put_signed(key, [f for pair in pairs for f in pair]) else 0

    def _put_object(self, meta: ObjectRecord) -> bool:
        if not meta.get("packed"):
            return self.remote.put_cas_file(meta["object"], self.store.blob_path(meta["object"]))
        data = object_bytes(self.store, meta)
        if data is None:
            return False
        return self.remote.put_cas_bytes(meta["object"], data)

    # modules and certificates ---------------------------------------------------------
    def fetch_module(self, key: str, filename: str) -> tuple[str, str] | None:
        """(module blob, certificate blob) of the build that linked this module elsewhere, verified and in
        the store; None on a miss."""
        files = self._taken(module_key(key), self.remote.get_ac(module_key(key)), f"the module entry of {filename}")
        if not files:
            return None
        by_path = {f.path: f for f in files}
        so, cert = by_path.get(f"module/{filename}"), by_path.get(CERTIFICATE)
        if so is None or cert is None:
            self.remote.failed(f"module entry for {filename} lacks the module or its certificate; ignoring it")
            return None
        if (self.fetch_blob([so.digest], so.size, listed=True) is None
                or self.fetch_blob([cert.digest], cert.size, listed=True) is None):
            return None
        from hermetic.extensions.certificate import read_certificate
        try:
            produced = read_certificate(self.store, cert.digest).get("module_sha256")
        except (ValueError, OSError, AttributeError) as e:  # zstandard.ZstdError is a ValueError
            produced = f"unreadable ({e})"
        if produced != so.digest:
            self.remote.failed(f"the certificate shared with {filename} does not certify it; ignoring both")
            return None
        self.counts["modules_fetched"] += 1
        return so.digest, cert.digest

    def upload_module(self, key: str, filename: str, so_digest: str, cert_blob: str) -> None:
        if not self.remote.writable:
            return
        there = self.remote.has_ac(module_key(key))
        if there is None or (there and not self._replaces_unsigned(module_key(key), filename)):
            return  # there already (another builder's certificate stays), or the remote cannot say
        so_path, cert_path = self.store.blob_path(so_digest), self.store.blob_path(cert_blob)
        if self.remote.put_cas_file(so_digest, so_path) and self.remote.put_cas_file(cert_blob, cert_path):
            files = [OutputFile(f"module/{filename}", so_digest, so_path.stat().st_size),
                     OutputFile(CERTIFICATE, cert_blob, cert_path.stat().st_size)]
            if self._put_signed(module_key(key), files):
                self.counts["modules_uploaded"] += 1


def _manifest(files: list[OutputFile]) -> dict[str, tuple[OutputFile, OutputFile]]:
    """entry name -> (record, object) of an objects list, in its order; incomplete pairs are dropped."""
    metas: dict[str, OutputFile] = {}
    objects: dict[str, OutputFile] = {}
    for f in files:
        name, _, what = f.path.partition("/")
        if _OBJECT_NAME.match(name):
            (metas if what == "meta.json" else objects if what == "object" else {})[name] = f
    return {name: (m, objects[name]) for name, m in metas.items() if name in objects}


def _invalid_record(data: bytes, name: str, lookup: str, object_file: OutputFile) -> str | None:
    """Why a record from the remote cannot be an object entry of this store under ``name``, or None: the
    store's own admission checks (its name the key of its inputs, its command the one its lookup key
    describes: store/admission.py, which an import applies too), then what the list says of it."""
    try:
        meta = json.loads(data)
    except ValueError:
        return "not JSON"
    if not isinstance(meta, dict) or meta.get("kind") != "object" or meta.get("format") != STORE_FORMAT:
        return "not an object record of this store format"
    if meta.get("name") != name or meta.get("lookup") != lookup:
        return "it names another entry or lookup key"
    why = record_problem(meta, name)
    if why is not None:
        return why
    if meta.get("object") != object_file.digest or meta.get("size") != object_file.size:
        return "it names another object than the list"
    return None


def _parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(min(WORKERS, len(items))) as pool:
        return list(pool.map(fn, items))
