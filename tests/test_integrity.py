"""The store's integrity holes of issue 16, each placed exactly: gc in the window between a source tree's
ingest finding a blob and linking it, gc during an export, crafted archives whose manifests are consistent,
a hostile wheel's leftovers, gc past a damaged record, and a realize's own receipt.

The windows are made the way tests/test_concurrency.py makes them: the real function of the product wrapped,
here in the test's own process, so that a real `hermetic gc` runs at that moment; the product has no hooks."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermetic import fs
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import STORE_FORMAT, Store, release_temproots
from tests.support import cli
from tests.support.archives import CRAFTED, crafted, honest_records, write_archive
from tests.support.cli import Hermetic
from tests.support.hostile import REG, raw_wheel
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe


def _paths(folder: Path, skip: tuple[str, ...] = ()) -> set[str]:
    """Every file and folder under ``folder`` (empty folders too), but those under ``skip``."""
    out = set()
    for dirpath, dirnames, files in os.walk(folder):
        rel = os.path.relpath(dirpath, folder)
        dirnames[:] = [d for d in dirnames if os.path.normpath(os.path.join(rel, d)) not in skip]
        out.update(os.path.normpath(os.path.join(rel, n)) for n in dirnames + files)
    return out


# 1. ingest ------------------------------------------------------------------------------------------------
def test_gc_between_ingest_finding_a_blob_and_linking_it_deletes_nothing(tmp_path: Path, hermetic: Hermetic,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree's file whose bytes are an unreferenced blob already in the store: ingest finds the blob,
    and a real gc runs right then, before the link. Unfixed, the blob was not pinned, gc deleted it and the
    link failed."""
    Root(hermetic.root).ensure()
    store = Store(hermetic.root / "store").open()
    data = b"// the same bytes as a blob nobody references\n"
    digest = store.put_blob_bytes(data)
    release_temproots()  # the blob is garbage now, older than anything this process pins next
    store = Store(hermetic.root / "store").open()
    ran: list[cli.Result] = []
    link = fs.link_or_copy

    def paused(src: Any, dst: Any) -> None:
        if not ran:
            ran.append(hermetic("gc", "--json"))
        link(src, dst)

    monkeypatch.setattr(fs, "link_or_copy", paused)
    try:
        with store.build_entry("0" * 32 + "-src-window") as staging:
            assert staging is not None
            staging.out.mkdir()
            (staging.out / "a.h").write_bytes(data)
            files = staging.ingest()
            staging.record = {"format": STORE_FORMAT, "name": staging.name, "kind": "tree", "label": "src-window",
                              "files": files, "links": {}, "refs": []}
    finally:
        release_temproots()
    assert ran and ran[0].rc == 0 and ran[0].result["dead_blobs"] == 0, ran[0].err
    blob = store.blob_path(digest)
    assert blob.exists() and os.stat(blob).st_ino == os.stat(store.entry_path("0" * 32 + "-src-window") / "out" /
                                                            "a.h").st_ino


# 2. import ------------------------------------------------------------------------------------------------
def test_an_honest_crafted_archive_imports(tmp_path: Path, hermetic: Hermetic) -> None:
    """The crafted cases below differ from this one by one record: this one is accepted whole."""
    entries, blobs, roots = honest_records()
    archive = write_archive(tmp_path / "honest.tar.zst", entries, blobs, roots)
    res = hermetic("import", archive, "--trust-unsigned", "--json")  # its unpacked record: no one signed it
    assert res.rc == 0, res.err
    assert sorted(os.listdir(hermetic.root / "store" / "entries")) == sorted(entries)
    assert (hermetic.root / "roots" / "crafted.json").exists()
    assert hermetic("verify").rc == 0


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_a_crafted_archive_is_refused_before_anything_is_published(tmp_path: Path, hermetic: Hermetic,
                                                                   kind: str) -> None:
    archive = crafted(kind, tmp_path / f"{kind}.tar.zst")
    res = hermetic("import", archive, "--json")
    assert res.rc == 2, (res.rc, res.err)
    assert "Traceback" not in res.err and "nothing was imported" in res.err and archive.name in res.err
    root = hermetic.root
    assert not any((root / "store" / "entries").iterdir())
    assert not (root / "store" / "index").exists() or not _paths(root / "store" / "index")
    assert not any((root / "roots").iterdir())


# 3. export ------------------------------------------------------------------------------------------------
def test_gc_during_an_export_removes_nothing_it_exports(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The export's root is dropped and gc collects after the export read its closure and before it wrote a
    byte. Unfixed, gc deleted the entries and blobs and the export failed reading them."""
    import hermetic.store.archive as archive_mod
    wheels = [make_pkg(tmp_path / "whl", f"exp{i}", "1.0") for i in range(2)]
    index.add(*(w.path for w in wheels))
    recipe = write_recipe(tmp_path / "r", "exp", "".join(pip_lock_line(w) for w in wheels))
    hermetic("realize", recipe, check=True)
    ran: list[cli.Result] = []
    order = archive_mod.stream_order

    def paused(blobs: dict[str, str], sizes: dict[str, int]) -> list[str]:
        ran.append(hermetic("gc", "--drop-root", "exp", "--json"))
        return order(blobs, sizes)

    monkeypatch.setattr(archive_mod, "stream_order", paused)
    archive = tmp_path / "exp.tar.zst"
    release_temproots()
    try:
        stats = archive_mod.export_closure(Root(hermetic.root), archive, names=["exp"],
                                           reporter=Reporter(quiet=True), level=3)
    finally:
        release_temproots()
    assert ran and ran[0].rc == 0, ran[0].err
    assert ran[0].result["dead_entries"] == [] and ran[0].result["dead_blobs"] == 0
    assert stats["entries"] == 3
    other = tmp_path / "other"
    hermetic("import", archive, "--trust-unsigned", root=other, check=True)
    assert hermetic("verify", root=other).rc == 0
    assert len(os.listdir(other / "store" / "entries")) == 3


# 4. a hostile wheel's leftovers ----------------------------------------------------------------------------
def test_a_hostile_wheel_refused_at_unpack_leaves_nothing_in_the_store(tmp_path: Path, hermetic: Hermetic,
                                                                       index: LoopbackIndex) -> None:
    honest = make_pkg(tmp_path / "whl", "fine", "1.0")
    index.add(honest.path)
    hermetic("realize", write_recipe(tmp_path / "ok", "ok", pip_lock_line(honest)), check=True)
    store = hermetic.root / "store"
    before = _paths(store, skip=("temproots",))
    hostile = raw_wheel(tmp_path / "bad", "trav", [("../escape.py", b"X = 1\n", REG)])
    index.add(hostile)
    sha = hashlib.sha256(hostile.read_bytes()).hexdigest()
    res = hermetic("realize", write_recipe(tmp_path / "r", "trav", f"trav==1.0 --hash=sha256:{sha}\n"))
    assert res.rc == 2, res.err
    assert _paths(store, skip=("temproots",)) == before  # no empty blob shard, no lock file, nothing in tmp


def test_a_lock_file_removed_by_its_holder_excludes_the_next_holder_and_its_waiter(tmp_path: Path) -> None:
    """A waiter that wakes on a lock file its holder removed takes the lock again on the file now at the
    path, so it never holds the lock together with a process that locked the new file."""
    path = tmp_path / "entry.lock"
    holder = fs.FileLock(path)
    holder.acquire()
    got: list[fs.FileLock] = []

    def wait() -> None:
        waiter = fs.FileLock(path)
        waiter.acquire()
        got.append(waiter)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)  # the waiter is blocked in flock on the old file
    holder.remove()
    newcomer = fs.FileLock(path)
    assert newcomer.acquire(blocking=False)  # a new file at the path: free
    holder.release()
    time.sleep(0.3)
    assert not got  # the waiter woke on the removed file, saw it, and now waits on the newcomer's
    newcomer.release()
    thread.join(10)
    assert got
    got[0].release()


# 5. gc past a damaged record -------------------------------------------------------------------------------
def _damage(store: Path, name: str, data: bytes = b'{"kind": "tr') -> bytes:
    meta = store / "entries" / name / "meta.json"
    old = meta.read_bytes()
    os.chmod(meta, 0o644)
    meta.write_bytes(data)
    return old


def test_gc_goes_past_a_damaged_record(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a, b, c = (make_pkg(tmp_path / "whl", n, "1.0") for n in ("alpha", "beta", "gamma"))
    index.add(a.path, b.path, c.path)
    hermetic("realize", write_recipe(tmp_path / "r1", "one", pip_lock_line(a) + pip_lock_line(b)), check=True)
    hermetic("realize", write_recipe(tmp_path / "r2", "two", pip_lock_line(b) + pip_lock_line(c)), check=True)
    root, store = hermetic.root, hermetic.root / "store"
    for p in [root / "roots" / "two.json", root / "profiles" / "two", *(root / "receipts").glob("two-*.json")]:
        p.unlink()
    entries = set(os.listdir(store / "entries"))
    one = json.loads((root / "roots" / "one.json").read_text())["refs"]
    tree_one = next(e[len("entry:"):] for e in one if "-one" in e)
    alpha = next(e for e in entries if e.endswith("-alpha"))
    gamma = next(e for e in entries if e.endswith("-gamma"))
    tree_two = next(e for e in entries if e.endswith("-two"))
    blobs = _paths(store / "blobs")

    # a damaged reachable tree may name any entry: gc deletes neither an entry nor a blob, and says why
    saved = _damage(store, tree_one)
    res = hermetic("gc", "--json")
    assert res.rc == 0, res.err
    assert res.result["dead_entries"] == [] and res.result["dead_blobs"] == 0
    assert res.result["damaged"] == [tree_one] and set(res.result["kept_unprovable"]) == {tree_two, gamma}
    assert "deleted no blob" in res.err and "verify --repair" in res.err
    _damage(store, tree_one, saved)

    # a damaged reachable unpacked wheel names no entry: the unreachable ones go, a damaged one too; no blob
    _damage(store, alpha)
    _damage(store, gamma)
    res = hermetic("gc", "--json")
    assert res.rc == 0, res.err
    assert sorted(res.result["dead_entries"]) == sorted([tree_two, gamma]) and res.result["dead_blobs"] == 0
    assert res.result["damaged"] == [alpha] and res.result["blobs_unprovable"] is True
    assert set(os.listdir(store / "entries")) == entries - {tree_two, gamma}
    assert _paths(store / "blobs") == blobs


# 6. a realize's own receipt ---------------------------------------------------------------------------------
def test_a_realize_returns_its_own_receipt_and_a_noop_the_one_its_record_names(tmp_path: Path, hermetic: Hermetic,
                                                                              index: LoopbackIndex) -> None:
    w = make_pkg(tmp_path / "whl", "own", "1.0")
    index.add(w.path)
    recipe = write_recipe(tmp_path / "r", "own", pip_lock_line(w))
    first = hermetic("realize", recipe, "--json", check=True).result
    # another process's receipt of the same tree, later in the folder
    theirs = hermetic.root / "receipts" / "own-99991231T235959-000000000000.json"
    theirs.write_text(json.dumps({**json.loads(Path(first["receipt"]).read_text()), "theirs": True}))
    past = hermetic("realize", recipe, "--explain", "--json", check=True).result  # past the no-op check
    assert past["changed"] is False and past["receipt"] not in (str(theirs), first["receipt"])
    mine = json.loads(Path(past["receipt"]).read_text())
    assert "theirs" not in mine and mine["tree"] == past["tree"] and mine["counts"] == past["counts"]
    receipts = sorted(os.listdir(hermetic.root / "receipts"))
    noop = hermetic("realize", recipe, "--json", check=True).result
    assert noop["timings"] == {} and noop["receipt"] == past["receipt"]
    assert sorted(os.listdir(hermetic.root / "receipts")) == receipts  # a no-op writes none


def test_an_earlier_unpackers_entry_is_admitted_under_its_own_key_only() -> None:
    """A root realized before an unpacker upgrade holds trees that name the earlier unpacker's entries (trees are
    keyed by their files, so the upgrade reuses them): its export must import. An entry under the key of an
    earlier unpacker is admitted; one under no unpacker's key is not (before the fix the first was refused,
    and a real toolchain archive of such a root failed to import on the H200, 2026-12-02)."""
    from hermetic.keys import UNPACKER_VERSION, unpacked_key
    from hermetic.store import entry_name
    from hermetic.store.admission import record_problem
    wheel = hashlib.sha256(b"a wheel").hexdigest()

    def meta(name: str) -> dict[str, Any]:
        return {"format": STORE_FORMAT, "kind": "unpacked", "name": name, "refs": [], "wheel": wheel,
                "files": {"pkg/__init__.py": [hashlib.sha256(b"").hexdigest(), False]}}

    for v in range(1, UNPACKER_VERSION + 1):
        name = entry_name(unpacked_key(wheel, v), "pkg")
        assert record_problem(meta(name), name) is None, v
    stranger = entry_name(unpacked_key(wheel, UNPACKER_VERSION + 1), "pkg")
    assert "not the key of its wheel" in (record_problem(meta(stranger), stranger) or "")
