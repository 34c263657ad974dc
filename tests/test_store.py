"""hermetic/store/__init__.py, the store's primitives tested directly: names, opening, blobs, entries built once
and published whole (Staging), the index, and the temp roots that keep what a running process uses alive.
Real files and real processes (two builders of one entry, a holder killed with kill -9)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermetic import store as store_module
from hermetic.errors import BadInput, BadRecord, WorkFailed
from hermetic.store import (
    ENTRY_META,
    STORE_FORMAT,
    Store,
    blob_name,
    blob_ref,
    entry_name,
    entry_ref,
    live_temproots,
    split_blob_name,
    split_refs,
)
from tests.support.cli import REPO


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store").open()
    yield s
    # this process's temp-roots file of that store: released as a command's end releases it
    tr = store_module._OPEN_TEMPROOTS.pop(s.temproots_dir.resolve(), None)
    if tr is not None:
        tr.lock.release()


def _tree_record(name: str, files: dict[str, tuple[str, bool]] | None = None) -> dict[str, object]:
    return {"format": STORE_FORMAT, "name": name, "kind": "tree", "label": "t", "files": files or {},
            "links": {}, "refs": []}


def _pins(store: Store) -> list[str]:
    return store.temproots.path.read_text().splitlines()[1:]


# --- names ------------------------------------------------------------------------------------------------------


def test_names_and_references() -> None:
    e1, e2, b1 = entry_name("a" * 64, "e1"), entry_name("b" * 64, "e2"), "c" * 64 + "x"
    assert split_refs([entry_ref(e1), blob_ref(b1), "future:thing", entry_ref(e2)]) == ([e1, e2], [b1])
    # a name no entry or blob has (it could only be a path) is ignored, never followed
    assert split_refs([entry_ref("../../etc"), blob_ref("b1"), entry_ref("e1")]) == ([], [])
    name = entry_name("ab" * 32, "mod-x/../y z")
    assert name.startswith("ab" * 16 + "-") and len(name.split("-", 1)[0]) == 32
    assert "/" not in name and " " not in name
    assert len(entry_name("0" * 64, "l" * 300)) <= 32 + 1 + 80
    d = "c" * 64
    assert blob_name(d, True) == d + "x" and split_blob_name(d + "x") == (d, True)
    assert split_blob_name(d) == (d, False)


# --- opening ----------------------------------------------------------------------------------------------------


def test_open_makes_the_layout_once_and_refuses_another_format(tmp_path: Path) -> None:
    s = Store(tmp_path / "s")
    assert not s.exists()
    s.open()
    assert s.exists() and (tmp_path / "s" / "FORMAT").read_text() == f"hermetic-store {STORE_FORMAT}\n"
    assert {p.name for p in (tmp_path / "s").iterdir()} >= {"blobs", "entries", "locks", "tmp", "trash"}
    (tmp_path / "s" / "FORMAT").write_text("hermetic-store 99\n")
    with pytest.raises(WorkFailed) as e:
        Store(tmp_path / "s").open()
    assert e.value.where == str(tmp_path / "s" / "FORMAT") and "format 'hermetic-store 99'" in e.value.what


# --- blobs ------------------------------------------------------------------------------------------------------


def test_put_blob_file_makes_a_read_only_pinned_blob_and_takes_an_existing_one(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"payload")
    digest = hashlib.sha256(b"payload").hexdigest()
    path = store.put_blob_file(src, digest)
    assert path == store.blob_path(digest) and path.read_bytes() == b"payload"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444 and not src.exists()
    assert blob_ref(digest) in _pins(store)
    again = tmp_path / "again"
    again.write_bytes(b"payload")
    inode = path.stat().st_ino
    assert store.put_blob_file(again, digest) == path
    assert not again.exists() and path.stat().st_ino == inode   # the source removed, the blob kept
    exe = tmp_path / "exe"
    exe.write_bytes(b"payload")
    assert stat.S_IMODE(store.put_blob_file(exe, digest, executable=True).stat().st_mode) == 0o555
    assert store.has_blob(digest, True) and store.has_blob(digest, False)


def test_put_blob_file_makes_the_shard_again_after_drop_blob_removed_it(store: Store, tmp_path: Path) -> None:
    digest = store.put_blob_bytes(b"one")
    store.drop_blob(digest)
    assert not store.blob_path(digest).parent.exists()   # the shard went with its last blob
    other = store.put_blob_bytes(b"one")
    assert other == digest and store.blob_path(digest).read_bytes() == b"one"


def test_drop_blob_keeps_a_shard_that_holds_others(store: Store) -> None:
    a = store.put_blob_bytes(b"a")
    shard = store.blob_path(a).parent
    (shard / (a[:2] + "f" * 62)).write_bytes(b"another blob of this shard")
    store.drop_blob(a)
    assert shard.is_dir() and not store.has_blob(a)


def test_put_blob_stream_and_copy(store: Store, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    digest, size = store.put_blob_stream(io.BytesIO(data))
    assert (digest, size) == (hashlib.sha256(data).hexdigest(), len(data))
    src = tmp_path / "obj.o"
    src.write_bytes(b"object")
    d2, _ = store.put_blob_copy(src)
    assert src.exists() and store.blob_path(d2).stat().st_ino != src.stat().st_ino   # an inode of its own
    assert os.listdir(store.tmp) == []


def test_put_blob_bytes_heals_a_corrupt_blob_in_place(store: Store, tmp_path: Path) -> None:
    digest = store.put_blob_bytes(b"good bytes")
    path = store.blob_path(digest)
    os.link(path, tmp_path / "a-tree-file")   # a tree's file is a hard link to the blob
    os.chmod(path, 0o644)
    path.write_bytes(b"bad! bytes")
    os.chmod(path, 0o444)
    assert store.put_blob_bytes(b"good bytes") == digest
    assert (tmp_path / "a-tree-file").read_bytes() == b"good bytes"   # the same inode, right again
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    with pytest.raises(ValueError, match="other bytes"):
        store.heal_blob(digest, False, b"not them")


def test_has_blob_is_a_regular_file_and_use_blob_pins(store: Store) -> None:
    digest = "d" * 64
    path = store.blob_path(digest)
    path.parent.mkdir()
    path.symlink_to("/etc/passwd")
    assert not store.has_blob(digest)          # a link at a blob's name is a stray, never a blob
    assert not store.use_blob(digest)
    assert blob_ref(digest) in _pins(store)    # pinned before looking, under the gc lock
    real = store.put_blob_bytes(b"z")
    assert store.use_blob(real)
    assert [d for d, _x, _p in store.iter_blobs()] == [real]


# --- entries ----------------------------------------------------------------------------------------------------


def test_build_entry_publishes_once_read_only_then_yields_none(store: Store) -> None:
    name = entry_name("1" * 64, "t")
    with store.build_entry(name) as staging:
        assert staging is not None
        staging.out.mkdir()
        (staging.out / "sub").mkdir()
        (staging.out / "sub" / "f").write_bytes(b"x")
        os.chmod(staging.out / "sub" / "f", 0o755)
        files = staging.ingest()
        staging.record = _tree_record(name, files)  # type: ignore[assignment]
    assert files == {"sub/f": (hashlib.sha256(b"x").hexdigest(), True)}
    entry = store.entry_path(name)
    assert (entry / "out" / "sub" / "f").stat().st_ino == store.blob_path(files["sub/f"][0], True).stat().st_ino
    assert stat.S_IMODE(entry.stat().st_mode) == 0o755                       # renamable, for gc
    assert stat.S_IMODE((entry / ENTRY_META).stat().st_mode) == 0o444
    assert stat.S_IMODE((entry / "out" / "sub").stat().st_mode) == 0o555
    assert store.has_entry(name) and store.iter_entries() == [name] and entry_ref(name) in _pins(store)
    assert store.tree_record(name)["files"] == {"sub/f": [files["sub/f"][0], True]}
    with store.build_entry(name) as staging:
        assert staging is None
    assert os.listdir(store.tmp) == []


def test_a_failed_build_leaves_no_staging_and_no_lock_file(store: Store) -> None:
    name = entry_name("2" * 64, "t")
    with pytest.raises(RuntimeError, match="compile failed"), store.build_entry(name) as staging:
        assert staging is not None
        (staging.path / "half").write_bytes(b"half")
        raise RuntimeError("compile failed")
    assert os.listdir(store.tmp) == [] and os.listdir(store.locks) == [] and not store.has_entry(name)


def test_publish_needs_its_own_record(store: Store) -> None:
    name = entry_name("3" * 64, "t")
    with pytest.raises(RuntimeError, match="without a record"), store.build_entry(name):
        pass
    with pytest.raises(RuntimeError, match="holds the record of"), store.build_entry(name) as staging:
        assert staging is not None
        staging.record = _tree_record(entry_name("4" * 64, "t"))  # type: ignore[assignment]
    assert not store.has_entry(name) and os.listdir(store.tmp) == []


def test_ingest_refuses_a_symlink_in_the_tree(store: Store) -> None:
    name = entry_name("5" * 64, "t")
    with pytest.raises(BadInput, match="not a regular file"), store.build_entry(name) as staging:
        assert staging is not None
        staging.out.mkdir()
        (staging.out / "evil").symlink_to("/etc/passwd")
        staging.ingest()


def test_staged_blobs_enter_the_store_only_when_committed(store: Store) -> None:
    name = entry_name("6" * 64, "t")
    with pytest.raises(RuntimeError), store.build_entry(name) as staging:
        assert staging is not None
        digest, size = staging.stage_blob(io.BytesIO(b"held back"), False)
        assert size == 9
        raise RuntimeError("the wheel's RECORD did not match")
    assert not store.has_blob(digest)
    with store.build_entry(name) as staging:
        assert staging is not None
        staging.stage_blob(io.BytesIO(b"held back"), False)
        staging.commit_blobs()
        staging.record = _tree_record(name)  # type: ignore[assignment]
    assert store.has_blob(digest)


def test_records_are_checked_by_kind(store: Store) -> None:
    name = entry_name("7" * 64, "t")
    with store.build_entry(name) as staging:
        assert staging is not None
        staging.record = _tree_record(name)  # type: ignore[assignment]
    with pytest.raises(BadRecord, match="a tree entry where a object entry was expected"):
        store.object_record(name)
    meta = store.entry_path(name) / ENTRY_META
    os.chmod(meta, 0o644)
    meta.write_bytes(b"{not json")
    with pytest.raises(BadRecord) as e:
        store.record(name)
    assert e.value.where == str(meta) and "verify --repair" in (e.value.hint or "")
    meta.unlink()
    os.mkfifo(meta)
    assert store.has_entry(name)
    with pytest.raises(BadRecord):   # a FIFO in a record's place: never used, never a hang
        store.use(name)
    with pytest.raises(OSError):
        store.record(entry_name("8" * 64, "missing"))


def test_invalidate_moves_to_trash_and_drop_entry_deletes(store: Store) -> None:
    names = [entry_name(c * 64, "t") for c in "9a"]
    for name in names:
        with store.build_entry(name) as staging:
            assert staging is not None
            staging.record = _tree_record(name)  # type: ignore[assignment]
    trash = store.invalidate(names[0])
    assert trash is not None and trash.parent == store.trash and not store.has_entry(names[0])
    store.drop_entry(names[1])
    assert not store.has_entry(names[1]) and os.listdir(store.trash) == [trash.name]
    assert store.invalidate(names[1]) is None


def test_index_lists_entries_under_a_lookup_key(store: Store) -> None:
    assert store.index_list("k" * 64) == []
    link = store.index_add("k" * 64, "b-entry")
    store.index_add("k" * 64, "a-entry")
    store.index_add("k" * 64, "a-entry")
    assert store.index_list("k" * 64) == ["a-entry", "b-entry"]
    assert Path(os.path.normpath(link.parent / os.readlink(link))) == store.entry_path("b-entry")


# --- two processes ----------------------------------------------------------------------------------------------

BUILDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hermetic.store import Store, STORE_FORMAT
    store = Store(Path(sys.argv[1]))
    name = sys.argv[2]
    with store.build_entry(name) as staging:
        if staging is None:
            print("found", flush=True)
        else:
            print("building", flush=True)
            time.sleep(1.5)
            staging.record = {"format": STORE_FORMAT, "name": name, "kind": "tree", "label": "t", "files": {},
                              "links": {}, "refs": []}
    print("done", store.has_entry(name), flush=True)
""")


def test_two_processes_building_one_entry_build_it_once(store: Store) -> None:
    name = entry_name("b" * 64, "t")
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(store.path), name], stdout=subprocess.PIPE,
                              text=True, cwd=REPO) for _ in range(2)]
    outs = sorted(p.communicate(timeout=60)[0] for p in procs)
    assert outs == ["building\ndone True\n", "found\ndone True\n"]


HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from hermetic.store import Store
    store = Store(Path(sys.argv[1]))
    store.use(sys.argv[2])
    print("pinned", flush=True)
    sys.stdin.readline()
""")


def test_temp_roots_hold_what_live_processes_use_and_forget_dead_ones(store: Store) -> None:
    name = entry_name("c" * 64, "t")
    with store.build_entry(name) as staging:
        assert staging is not None
        staging.record = _tree_record(name)  # type: ignore[assignment]
    mine = store.temproots.path
    assert mine.read_text().startswith("created:")
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.path), name], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert other.stdout is not None and other.stdout.readline().strip() == "pinned"
    refs, oldest = live_temproots(store)
    assert refs == {entry_ref(name)} and oldest is not None   # the other process's; this one's own skipped
    store.unpublish([name])
    assert store.has_entry(name)     # pinned by a live process: kept
    other.kill()
    other.wait(timeout=30)
    refs, _ = live_temproots(store)
    assert refs == set() and os.listdir(store.temproots_dir) == [mine.name]   # the dead one's file removed
    store.unpublish([name])
    assert not store.has_entry(name)


def test_a_temp_roots_file_without_its_first_line_counts_by_its_ctime(store: Store) -> None:
    old = store.temproots_dir / "1-old"
    old.write_text("entry:x\n")
    fd = os.open(old, os.O_RDWR)
    import fcntl
    fcntl.flock(fd, fcntl.LOCK_EX)   # held, as a live process of an older hermetic holds it
    try:
        refs, oldest = live_temproots(store)
        assert refs == {"entry:x"} and oldest == os.stat(old).st_ctime_ns
    finally:
        os.close(fd)


# --- a plan's read-only view ------------------------------------------------------------------------------------


def test_a_read_only_view_looks_pins_nothing_and_refuses_every_write(tmp_path: Path) -> None:
    assert not Store(tmp_path / "none", read_only=True).open().exists()   # a missing store stays missing
    assert not (tmp_path / "none").exists()
    writer = Store(tmp_path / "s").open()
    name = entry_name("d" * 64, "t")
    with writer.build_entry(name) as staging:
        assert staging is not None
        staging.record = _tree_record(name)  # type: ignore[assignment]
    digest = writer.put_blob_bytes(b"blob")
    tr = store_module._OPEN_TEMPROOTS.pop(writer.temproots_dir.resolve())
    tr.lock.release()
    tr.path.unlink()
    view = Store(tmp_path / "s", read_only=True).open()
    locks = os.listdir(view.locks)
    assert view.use(name) and view.use_blob(digest) and not view.use(entry_name("e" * 64, "t"))
    assert os.listdir(view.temproots_dir) == []   # nothing pinned, no temp-roots file
    for write in (lambda: view.build_entry(name).__enter__(), lambda: view.put_blob_bytes(b"x"),
                  lambda: view.put_blob_stream(io.BytesIO(b"x")), lambda: view.drop_blob(digest),
                  lambda: view.drop_entry(name), lambda: view.index_add("k" * 64, name),
                  lambda: view.heal_blob(digest, False, b"blob")):
        with pytest.raises(RuntimeError, match="read-only view"):
            write()
    assert view.has_entry(name) and view.has_blob(digest) and os.listdir(view.locks) == locks
