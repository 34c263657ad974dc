"""hermetic/fs.py, the careful primitives, tested directly (as uv-fs is): real files, real folders, real
subprocesses for the locks; a monkeypatched OS call only where a failure cannot be made for real (EXDEV, a
rename that fails)."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermetic import fs
from hermetic.errors import PreconditionFailed
from tests.support.cli import REPO

# --- hashing and hashed writes ------------------------------------------------------------------------------


def test_sha256_of_an_empty_file_and_of_one_larger_than_a_chunk(tmp_path: Path) -> None:
    empty, big = tmp_path / "empty", tmp_path / "big"
    empty.write_bytes(b"")
    data = os.urandom(fs.CHUNK * 2 + 17)
    big.write_bytes(data)
    assert fs.sha256_file(empty) == (hashlib.sha256(b"").hexdigest(), 0)
    assert fs.sha256_file(big) == (hashlib.sha256(data).hexdigest(), len(data))
    assert fs.sha256_bytes(data) == hashlib.sha256(data).hexdigest()


def test_sha256_file_without_following_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to("real")
    assert fs.sha256_file(tmp_path / "link")[1] == 1
    with pytest.raises(OSError) as e:
        fs.sha256_file(tmp_path / "link", follow=False)
    assert e.value.errno == errno.ELOOP


def test_write_hashed_hashes_counts_and_reports_progress(tmp_path: Path) -> None:
    seen: list[int] = []
    digest, size = fs.write_hashed([b"ab", b"", b"cde"], tmp_path / "f", progress=seen.append)
    assert (digest, size) == (hashlib.sha256(b"abcde").hexdigest(), 5)
    assert (tmp_path / "f").read_bytes() == b"abcde" and seen == [2, 0, 3]


def test_write_hashed_fresh_refuses_an_existing_file_and_limit_stops_a_bomb(tmp_path: Path) -> None:
    (tmp_path / "there").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        fs.write_hashed([b"new"], tmp_path / "there")
    assert (tmp_path / "there").read_bytes() == b"old"
    with pytest.raises(fs.TooLarge) as e:
        fs.write_hashed(iter([b"1234", b"5678"]), tmp_path / "bomb", limit=6)
    assert e.value.limit == 6 and (tmp_path / "bomb").stat().st_size == 4   # nothing past the limit written
    tmp = fs.new_temp_file(tmp_path / "made", ".x-", ".part")
    assert tmp.parent.is_dir() and tmp.stat().st_size == 0 and tmp.name.startswith(".x-")
    assert fs.write_hashed([b"z"], tmp, fresh=False)[1] == 1


def test_copy_hashed_reads_a_stream_whole(tmp_path: Path) -> None:
    data = os.urandom(fs.CHUNK + 3)
    (tmp_path / "src").write_bytes(data)
    with open(tmp_path / "src", "rb") as f:
        assert fs.copy_hashed(f, tmp_path / "dst") == (hashlib.sha256(data).hexdigest(), len(data))


# --- fingerprints ---------------------------------------------------------------------------------------------


def test_fingerprint_changes_on_any_rewrite_and_not_on_a_read(tmp_path: Path) -> None:
    p = tmp_path / "f"
    assert fs.fingerprint(p) is None
    p.write_bytes(b"aaaa")
    first = fs.fingerprint(p)
    p.read_bytes()
    assert fs.fingerprint(p) == first
    st = p.stat()
    p.write_bytes(b"bbbb")   # the same size, the mtime put back: the ctime still tells
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fs.fingerprint(p) != first
    assert first is not None and first[0] == 4


# --- atomic writes ----------------------------------------------------------------------------------------------


def test_atomic_write_replaces_whole_with_its_mode_and_a_reader_keeps_the_old_bytes(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "f"
    fs.atomic_write(p, b"old", mode=0o600)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    with open(p, "rb") as reader:
        fs.atomic_write(p, b"new")
        assert reader.read() == b"old"   # the old inode, whole
    assert p.read_bytes() == b"new" and stat.S_IMODE(p.stat().st_mode) == 0o644
    assert sorted(os.listdir(p.parent)) == ["f"]


def test_atomic_write_that_fails_leaves_the_old_file_and_no_temp(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"old")

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        fs.atomic_write(p, b"new")
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_atomic_write_durable_syncs_the_file_and_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    fs.atomic_write(tmp_path / "f", b"x", durable=False)
    assert synced == []
    fs.atomic_write(tmp_path / "f", b"y", durable=True)
    assert len(synced) == 2   # the file before the rename, the folder after
    monkeypatch.setenv("HERMETIC_FSYNC", "1")
    assert fs.durable_default()
    monkeypatch.setenv("HERMETIC_FSYNC", "0")
    assert not fs.durable_default()


def test_atomic_output_renames_on_success_and_removes_on_error(tmp_path: Path) -> None:
    target = tmp_path / "out.png"
    with fs.atomic_output(target) as tmp:
        tmp.write_bytes(b"plot")
        assert not target.exists()
    assert target.read_bytes() == b"plot"
    with pytest.raises(RuntimeError), fs.atomic_output(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"plot" and os.listdir(tmp_path) == ["out.png"]


def test_json_forms(tmp_path: Path) -> None:
    obj = {"b": [1, 2], "a": "é"}
    assert fs.canonical_json(obj) == '{"a":"é","b":[1,2]}\n'.encode()
    assert fs.pretty_json(obj).decode().splitlines()[0:2] == ["{", ' "a": "é",']
    fs.atomic_write_json(tmp_path / "r.json", obj, pretty=True)
    assert fs.read_json(tmp_path / "r.json") == obj


# --- reading records safely -------------------------------------------------------------------------------------


def test_read_regular_reads_a_file_and_refuses_everything_else(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    assert fs.read_regular(tmp_path / "f", 4) == b"data"
    (tmp_path / "link").symlink_to("f")
    with pytest.raises(fs.NotRegularFile) as e:
        fs.read_regular(tmp_path / "link", 100)
    assert e.value.errno == errno.ELOOP
    os.mkfifo(tmp_path / "fifo")
    started = time.monotonic()
    with pytest.raises(fs.NotRegularFile, match="FIFO"):   # opened without blocking: no writer needed
        fs.read_regular(tmp_path / "fifo", 100)
    assert time.monotonic() - started < 5
    with pytest.raises(fs.NotRegularFile, match="folder"):
        fs.read_regular(tmp_path, 100)
    with pytest.raises(fs.NotRegularFile, match="character device"):
        fs.read_regular("/dev/null", 100)
    with pytest.raises(FileNotFoundError):
        fs.read_regular(tmp_path / "missing", 100)
    with pytest.raises(ValueError, match="holds 4 bytes, more than the 3"):
        fs.read_regular(tmp_path / "f", 3)


def test_read_regular_counts_what_it_reads_not_what_stat_says() -> None:
    # /proc files say size 0 and hold more: the second check, on the bytes read, still stops them
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(ValueError, match="more than the 8 bytes"):
        fs.read_regular("/proc/self/status", 8)


# --- trees ---------------------------------------------------------------------------------------------------


def _tree(top: Path) -> None:
    (top / "d" / "e").mkdir(parents=True)
    (top / "d" / "f").write_bytes(b"12345")
    (top / "d" / "e" / "g").write_bytes(b"1")
    os.chmod(top / "d" / "f", 0o755)


def test_make_tree_readonly_drops_write_bits_and_never_follows_a_link(tmp_path: Path) -> None:
    top, outside = tmp_path / "t", tmp_path / "outside"
    _tree(top)
    outside.write_bytes(b"x")
    os.chmod(outside, 0o644)
    (top / "d" / "link").symlink_to(outside)
    fs.make_tree_readonly(top)
    assert stat.S_IMODE((top / "d" / "f").stat().st_mode) == 0o555
    assert stat.S_IMODE((top / "d" / "e" / "g").stat().st_mode) == 0o444
    assert {stat.S_IMODE(p.stat().st_mode) for p in (top, top / "d", top / "d" / "e")} == {0o555}
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644


def test_remove_tree_counts_files_whose_last_link_went(tmp_path: Path) -> None:
    top = tmp_path / "t"
    _tree(top)
    os.link(top / "d" / "e" / "g", tmp_path / "kept")    # linked elsewhere: its bytes stay
    (top / "d" / "out").symlink_to(tmp_path / "kept")    # removed, never followed
    fs.make_tree_readonly(top)
    assert fs.remove_tree(top) == 5
    assert not top.exists() and (tmp_path / "kept").read_bytes() == b"1"
    assert fs.remove_tree(top) == 0
    (tmp_path / "alink").symlink_to(tmp_path / "kept")
    assert fs.remove_tree(tmp_path / "alink") == 0       # a symlink at the top: removed itself
    assert not (tmp_path / "alink").is_symlink() and (tmp_path / "kept").exists()


def test_remove_aside_never_removes_through_a_linked_parent(tmp_path: Path) -> None:
    # the attack of 2026-12-04 (finding 1): home/.cache a link to a folder outside the root, then the bytecode
    # cache home/.cache/pycache cleared: the outside folder's files were deleted
    outside = tmp_path / "outside"
    (outside / "pycache" / "notes").mkdir(parents=True)
    (outside / "pycache" / "notes" / "keep.txt").write_text("mine")
    home = tmp_path / "root" / "home"
    home.mkdir(parents=True)
    (home / ".cache").symlink_to(outside)
    assert fs.remove_aside(home / ".cache" / "pycache")
    assert (outside / "pycache" / "notes" / "keep.txt").read_text() == "mine"
    assert not os.path.lexists(home / ".cache") and os.listdir(outside) == ["pycache"]


def test_remove_aside_removes_whole(tmp_path: Path) -> None:
    top = tmp_path / "t"
    _tree(top)
    assert fs.remove_aside(top) and os.listdir(tmp_path) == []
    assert not fs.remove_aside(top)


def test_resolve_names_the_path_of_a_symlink_loop(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError) as e:
        fs.resolve(tmp_path / "a")
    assert e.value.errno == errno.ELOOP and str(tmp_path / "a") in str(e.value)


# --- links and copies ----------------------------------------------------------------------------------------


def test_link_or_copy_links_and_copies_across_file_systems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"blob")
    os.utime(src, ns=(1_000_000_000, 2_000_000_000))
    assert fs.link_or_copy(src, tmp_path / "linked")
    assert (tmp_path / "linked").stat().st_ino == src.stat().st_ino
    with pytest.raises(FileExistsError):   # never over (or through) an existing name
        fs.link_or_copy(src, tmp_path / "linked")

    def cross(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross)
    assert not fs.link_or_copy(src, tmp_path / "copied")
    copied = (tmp_path / "copied").stat()
    assert copied.st_ino != src.stat().st_ino and copied.st_mtime_ns == 2_000_000_000
    assert (tmp_path / "copied").read_bytes() == b"blob"

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "link", broken)
    with pytest.raises(OSError, match="Input/output"):
        fs.link_or_copy(src, tmp_path / "never")


def test_copy_file_keeps_mode_and_mtime_and_never_reads_through_a_link(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"x" * 10)
    os.chmod(src, 0o751)
    os.utime(src, ns=(1, 3_000_000_000))
    fs.copy_file(src, tmp_path / "dst")
    st = (tmp_path / "dst").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o751, 3_000_000_000)
    (tmp_path / "link").symlink_to(src)
    with pytest.raises(OSError) as e:
        fs.copy_file(tmp_path / "link", tmp_path / "other")
    assert e.value.errno == errno.ELOOP and not (tmp_path / "other").exists()


def test_open_dir_refuses_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to("d")
    os.close(fs.open_dir(tmp_path / "d"))
    with pytest.raises(OSError) as e:
        fs.open_dir(tmp_path / "l")
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_tree_writer_lays_out_links_and_symlinks_then_seals(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"b")
    top = tmp_path / "tree"
    top.mkdir()
    with fs.TreeWriter(top) as w:
        for rel in ("a/b/c", "a/b/d", "a/e", "f"):
            assert w.link(rel, str(blob))
        w.symlink("g", "f")
    assert (top / "a" / "b" / "c").stat().st_ino == blob.stat().st_ino
    assert os.readlink(top / "g") == "f"
    assert {stat.S_IMODE(p.stat().st_mode) for p in (top, top / "a", top / "a" / "b")} == {0o555}


def test_tree_writer_never_writes_through_a_symlink_the_tree_holds(tmp_path: Path) -> None:
    blob, outside = tmp_path / "blob", tmp_path / "outside"
    blob.write_bytes(b"b")
    outside.mkdir()
    top = tmp_path / "tree"
    top.mkdir()
    w = fs.TreeWriter(top)
    w.symlink("a", str(outside))
    with pytest.raises(OSError):
        w.link("a/x", str(blob))   # `a` is a link to a folder outside: opened O_NOFOLLOW, refused
    w.abandon()
    assert os.listdir(outside) == []


def test_atomic_symlink_makes_keeps_replaces_and_clears_a_leftover(tmp_path: Path) -> None:
    link = tmp_path / "p" / "link"
    assert fs.atomic_symlink("one", link)
    assert not fs.atomic_symlink("one", link)
    (link.parent / f".link.{os.getpid()}.tmp").symlink_to("stale")   # left by a killed run of this pid
    assert fs.atomic_symlink("two", link)
    assert os.readlink(link) == "two" and sorted(os.listdir(link.parent)) == ["link"]


# --- locks ------------------------------------------------------------------------------------------------------

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from hermetic import fs
    lock = fs.FileLock(Path(sys.argv[1]), shared=sys.argv[2] == "shared")
    lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()
""")


def _holder(path: Path, shared: bool = False) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "shared" if shared else "exclusive"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _end(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("\n")
    p.stdin.flush()
    p.wait(timeout=30)


def test_an_exclusive_lock_excludes_another_process_until_it_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "x.lock"
    other = _holder(path)
    try:
        assert not fs.FileLock(path).acquire(blocking=False)
        waited: list[float] = []
        with pytest.raises(PreconditionFailed) as e:
            fs.FileLock(path, timeout=1.2, what="the test's thing").acquire(on_wait=waited.append)
        assert "waiting for the lock on the test's thing" in e.value.what and e.value.where == str(path)
        assert waited and all(0 < w < 2 for w in waited)
    finally:
        _end(other)
    with fs.FileLock(path, timeout=5) as lock:
        assert lock.fd is not None
    lock.release()   # twice: harmless
    assert lock.fd is None


def test_shared_locks_coexist_and_exclude_an_exclusive_one(tmp_path: Path) -> None:
    path = tmp_path / "s.lock"
    other = _holder(path, shared=True)
    try:
        mine = fs.FileLock(path, shared=True)
        assert mine.acquire(blocking=False)
        mine.release()
        assert not fs.FileLock(path).acquire(blocking=False)
    finally:
        _end(other)


WAIT = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from hermetic import fs
    lock = fs.FileLock(Path(sys.argv[1]))
    lock.acquire()
    print(os.stat(sys.argv[1]).st_ino, os.fstat(lock.fd).st_ino, flush=True)
""")


def test_a_waiter_on_a_removed_lock_file_takes_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "r.lock"
    lock = fs.FileLock(path)
    lock.acquire()
    waiter = subprocess.Popen([sys.executable, "-c", WAIT, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    time.sleep(1.0)   # it blocks on the file this process holds
    lock.remove()
    lock.release()
    out, _ = waiter.communicate(timeout=30)
    at_path, locked = out.split()
    assert at_path == locked   # it locked the file at the path, not the removed one it first opened


def test_note_writes_into_the_held_file_without_replacing_it(tmp_path: Path) -> None:
    path = tmp_path / "n.lock"
    with fs.FileLock(path) as lock:
        inode = path.stat().st_ino
        lock.note("pid 1 on here since then")
        lock.note("pid 2")
        assert path.read_text() == "pid 2" and path.stat().st_ino == inode


# --- scratch ----------------------------------------------------------------------------------------------------


def test_scratch_file_and_dir_go_unless_moved(tmp_path: Path) -> None:
    with fs.scratch_file(tmp_path / "s", "part-") as f:
        f.write_bytes(b"x")
    assert os.listdir(tmp_path / "s") == []
    with fs.scratch_file(tmp_path / "s", "part-") as f:
        f.write_bytes(b"x")
        os.rename(f, tmp_path / "kept")
    assert (tmp_path / "kept").exists()
    with fs.scratch_dir(tmp_path / "s", "d-") as d:
        (d / "inner").mkdir()
        (d / "inner" / "f").write_bytes(b"y")
        fs.make_tree_readonly(d)
    assert os.listdir(tmp_path / "s") == []


SCRATCH = textwrap.dedent("""
    import sys
    from hermetic import fs
    a = fs.process_scratch_dir(sys.argv[1])
    assert fs.process_scratch_dir(sys.argv[1]) == a
    (a / "child-wrote").write_text("x")
    print(a, flush=True)
    if sys.argv[2] == "hang":
        sys.stdin.readline()
""")


def test_process_scratch_dir_is_one_per_process_gone_at_exit_and_swept_after_a_kill(tmp_path: Path) -> None:
    prefix = f"hermetic-test-fs-{os.getpid()}-"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRATCH, prefix, "exit"], capture_output=True, text=True,
                          env=env, cwd=REPO, check=True)
    assert not Path(done.stdout.strip()).exists()
    killed = subprocess.Popen([sys.executable, "-c", SCRATCH, prefix, "hang"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert killed.stdout is not None
    left = Path(killed.stdout.readline().strip())
    assert left.is_dir() and fs.sweep_scratch_dirs(prefix) == []   # its process lives: kept
    killed.kill()
    killed.wait(timeout=30)
    assert left.is_dir()   # kill -9 runs no exit handler
    real_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path)
    import tempfile
    tempfile.tempdir = None
    try:
        assert fs.sweep_scratch_dirs(prefix) == [left]
    finally:
        if real_tmp is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = real_tmp
        tempfile.tempdir = None
    assert not left.exists()


FOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from hermetic import fs
    a = fs.folder_for_this_process(Path(sys.argv[1]), "once-")
    assert fs.folder_for_this_process(Path(sys.argv[1]), "once-") == a
    (a / "child-wrote").write_text("x")
    print(a, flush=True)
    if sys.argv[2] == "hang":
        sys.stdin.readline()
""")


def test_a_folder_for_this_process_is_gone_at_exit_and_the_next_one_sweeps_one_a_kill_left(tmp_path: Path) -> None:
    def start(how: str) -> tuple[subprocess.Popen[str], Path]:
        p = subprocess.Popen([sys.executable, "-c", FOLDER, str(tmp_path), how], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert p.stdout is not None
        return p, Path(p.stdout.readline().strip())

    done, first = start("exit")
    assert done.wait(timeout=60) == 0 and not first.exists()
    killed, left = start("hang")
    living, alive = start("hang")
    killed.kill()
    killed.wait(timeout=30)
    assert left.is_dir()   # kill -9 runs no exit handler
    assert fs.sweep_process_folders(tmp_path, "once-") == [left]   # the living one's lock is held: kept
    killed, left = start("hang")
    killed.kill()
    killed.wait(timeout=30)
    done, first = start("exit")   # a new one sweeps first
    assert done.wait(timeout=60) == 0
    assert sorted(tmp_path.iterdir()) == [alive]
    assert living.stdin is not None
    living.stdin.close()
    assert living.wait(timeout=60) == 0 and not alive.exists()


# --- derived caches -----------------------------------------------------------------------------------------------


def test_fingerprint_cache_trusts_a_value_while_its_inputs_are_unchanged(tmp_path: Path) -> None:
    inp = tmp_path / "input"
    inp.write_bytes(b"1")
    cache = fs.FingerprintCache(tmp_path / "c")
    assert cache.get("k") is None
    cache.put("k", {"v": 1}, [inp])
    assert cache.get("k") == {"v": 1} and list(cache.values()) == [{"v": 1}]
    record = next((tmp_path / "c").glob("*.json"))
    mtime = record.stat().st_mtime_ns
    time.sleep(0.01)
    cache.put("k", {"v": 1}, [inp])
    assert record.stat().st_mtime_ns == mtime   # unchanged: not written again
    inp.write_bytes(b"2")
    assert cache.get("k") is None and list(cache.values()) == []
    calls: list[int] = []
    assert cache.cached("k", [inp], lambda: calls.append(1) or 7) == 7
    assert cache.cached("k", [inp], lambda: calls.append(1) or 8) == 7 and calls == [1]


def test_fingerprint_cache_misses_on_damage_and_on_another_key(tmp_path: Path) -> None:
    cache = fs.FingerprintCache(tmp_path / "c")
    cache.put("k", 1)
    record = next((tmp_path / "c").glob("*.json"))
    record.write_text(record.read_text().replace('"key":"k"', '"key":"other"'))
    assert cache.get("k") is None   # a record of another key under this name (a prefix collision)
    record.write_bytes(b'{"key": "k", "inp')
    assert cache.get("k") is None
    record.unlink()
    os.mkfifo(record)
    assert cache.get("k") is None   # never a hang
    cache.put("k", 2)               # written anew over the FIFO
    assert cache.get("k") == 2


def test_a_read_only_fingerprint_cache_writes_nothing(tmp_path: Path) -> None:
    fs.FingerprintCache(tmp_path / "c", read_only=True).put("k", 1)
    assert not (tmp_path / "c").exists()


def test_fingerprint_table_keeps_facts_per_file_and_saves_only_when_changed(tmp_path: Path) -> None:
    f = tmp_path / "src.h"
    f.write_bytes(b"int x;")
    table = fs.FingerprintTable(tmp_path / "t.json")
    fp, fact = table.get(str(f))
    assert fp == fs.fingerprint(f) and fact is None
    assert fp is not None
    table.put(str(f), fp, ["h"])
    table.save()
    saved = (tmp_path / "t.json").stat().st_mtime_ns
    again = fs.FingerprintTable(tmp_path / "t.json")
    assert again.get(str(f)) == (fp, ["h"])
    time.sleep(0.01)
    again.save()
    assert (tmp_path / "t.json").stat().st_mtime_ns == saved   # nothing changed: nothing written
    f.write_bytes(b"int y;")
    assert again.get(str(f))[1] is None
    (tmp_path / "t.json").write_bytes(b"[damaged")
    assert fs.FingerprintTable(tmp_path / "t.json").get(str(f))[1] is None


def test_a_read_only_fingerprint_table_is_never_saved(tmp_path: Path) -> None:
    f = tmp_path / "src.h"
    f.write_bytes(b"int x;")
    table = fs.FingerprintTable(tmp_path / "t.json", read_only=True)
    fp, _ = table.get(str(f))
    assert fp is not None
    table.put(str(f), fp, ["h"])
    table.save()
    assert not (tmp_path / "t.json").exists() and table.get(str(f))[1] == ["h"]


def test_a_link_where_a_folder_belongs_is_named_a_link_not_a_file(tmp_path: Path) -> None:
    """Outside attack r1, finding 2 (t_index_link.sh) and U (u_src_folder.sh): a folder hermetic opens without
    following links (store/index/XY/<lookup>, build/<recipe>/<variant>/src) planted as a link to a folder. Before,
    the error said "a folder on the path is a file, not a folder"; it is a link, and says where it points."""
    from hermetic.errors import path_error
    outside = tmp_path / "outside"
    outside.mkdir()
    lookup = tmp_path / "index" / "c9" / "c9abc"
    lookup.parent.mkdir(parents=True)
    lookup.symlink_to(outside)
    with pytest.raises(OSError) as raised:
        fs.atomic_symlink("../../entries/x", lookup / "x-obj")
    err = path_error(raised.value)
    assert err is not None and err.exit_code == 2, err
    text = err.render()
    assert f"{lookup} is a symbolic link to {outside}" in text and "verify --repair" in text, text
    assert "is a file" not in text and not list(outside.iterdir())
    plain = tmp_path / "plain"   # a file on the path is still said as one
    plain.write_text("x")
    with pytest.raises(OSError) as raised:
        fs.open_dir(plain / "sub")
    text = path_error(raised.value).render()  # type: ignore[union-attr]
    assert f"{plain} is a file, not a folder" in text, text
