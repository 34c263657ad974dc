"""The damage table (issue 35): what a user, a file manager or a crash puts where the store's files belong. Each
case ends in a clear message (no traceback, no hang: every command runs under a time limit) and a repair that
works: verify, show, gc and repair never open anything but the regular files and folders they expect, strays
hermetic owns nothing of are reported and left, and a stray at a blob's or an entry's name is removed by
``verify --repair`` (the blob fetched or unpacked again). The derived caches and the gc roots follow
docs/layout.md's table of bad records."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermetic.store import Store
from tests.support.cli import Hermetic, Result
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe

LIMIT_S = 120   # a command that hangs (a FIFO opened for reading) fails the test instead of the suite


def _clear(res: Result) -> None:
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err[-3000:]


def _run(h: Hermetic, *args: str | Path) -> Result:
    try:
        res = h(*args, "--json", timeout=LIMIT_S)
    except subprocess.TimeoutExpired:  # pragma: no cover - the failure this file guards against
        pytest.fail(f"hermetic {' '.join(map(str, args))} hung (over {LIMIT_S} s)")
    _clear(res)
    return res


@pytest.fixture
def realized(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> tuple[Hermetic, Path, Path]:
    """A root with a lock-only recipe realized: (hermetic, the recipe, a blob one of its files is)."""
    wheel = make_pkg(tmp_path / "whl", "dmg", "1.0")
    index.add(wheel.path)
    recipe = write_recipe(tmp_path / "r", "dmg", pip_lock_line(wheel))
    _run(hermetic, "realize", recipe)
    store = Store(hermetic.root / "store")
    ino = os.stat(hermetic.root / "profiles" / "dmg" / "dmg" / "__init__.py").st_ino
    blob = next(p for _d, _x, p in store.iter_blobs() if os.stat(p).st_ino == ino)
    return hermetic, recipe, blob


def _healed(h: Hermetic, recipe: Path, blob: Path | None = None) -> None:
    """verify --repair mends it; verify is clean after; the recipe realizes and its file reads right."""
    fixed = _run(h, "verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert _run(h, "verify").rc == 0
    assert _run(h, "realize", recipe).rc == 0
    assert (h.root / "profiles" / "dmg" / "dmg" / "__init__.py").read_text() == "VERSION = '1.0'\n"
    if blob is not None:
        assert blob.is_file() and not blob.is_symlink()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("not a blob\n")


def _symlink(path: Path) -> None:
    decoy = path.parent.parent.parent.parent / "decoy"
    decoy.write_text("VERSION = '1.0'\n")   # the right bytes: verify must still not follow the link
    os.symlink(decoy, path)


@pytest.mark.parametrize("shape,make", [("a FIFO", _fifo), ("a folder", _folder), ("a symbolic link", _symlink)],
                         ids=["fifo", "folder", "symlink"])
def test_a_blob_replaced_by_something_else_is_reported_and_repaired(
        shape: str, make: Callable[[Path], None], realized: tuple[Hermetic, Path, Path]) -> None:
    h, recipe, blob = realized
    os.unlink(blob)
    make(blob)
    found = _run(h, "verify")
    assert found.rc == 1
    assert any(p["kind"] == "stray" and p["name"] == str(blob) and shape in p["what"]
               for p in found.result["problems"]), found.result["problems"]
    assert _run(h, "show").rc == 0
    assert _run(h, "gc").rc == 0
    assert os.path.lexists(blob)   # gc never deletes what the store does not own, nor follows it
    _healed(h, recipe, blob)


def test_strays_are_reported_and_left_never_fatal(realized: tuple[Hermetic, Path, Path]) -> None:
    h, recipe, blob = realized
    store = h.root / "store"
    strays = [store / "blobs" / ".DS_Store", store / "blobs" / blob.parent.name / "notes.txt",
              store / "entries" / "README", store / "blobs" / blob.parent.name / "pipe"]
    for p in strays[:3]:
        p.write_text("a stray\n")
    os.mkfifo(strays[3])
    os.mkfifo(store / "temproots" / "stray-fifo")   # gc reads the temp roots: never this one
    for args in (("verify",), ("verify", "--repair"), ("gc",), ("gc", "--dry-run"), ("show",)):
        res = _run(h, *args)
        assert res.rc == 0, (args, res.err[-3000:])
    warned = _run(h, "verify")
    assert sorted(warned.result["strays"]) == sorted(map(str, strays))
    assert all(str(p) in warned.err for p in strays), warned.err
    assert sorted(_run(h, "show").result["strays"]) == sorted(map(str, strays))
    assert all(os.path.lexists(p) for p in strays)   # left as they were
    _healed(h, recipe)


def test_an_entry_record_replaced_by_a_fifo(realized: tuple[Hermetic, Path, Path]) -> None:
    h, recipe, _blob = realized
    store = Store(h.root / "store")
    entry = next(e for e in store.iter_entries() if e.endswith("-dmg") and
                 (store.entry_path(e) / "out").is_dir())
    meta = store.entry_path(entry) / "meta.json"
    os.chmod(store.entry_path(entry), 0o755)
    meta.unlink()
    os.mkfifo(meta)
    found = _run(h, "verify")
    assert found.rc == 1 and any(p["name"] == entry and "FIFO" in p["what"] for p in found.result["problems"])
    shown = _run(h, "show")
    assert shown.rc == 0
    gc = _run(h, "gc")   # a reachable entry whose record cannot be read: gc deletes no blob, and says why
    assert gc.rc == 0 and gc.result["damaged"] == [entry] and gc.result["blobs_unprovable"]
    bad = _run(h, "realize", recipe, "--explain")
    assert bad.rc == 2 and entry in bad.err and "verify --repair" in bad.err
    _healed(h, recipe)


def test_a_derived_cache_record_damaged_is_a_miss_and_repair_removes_it(
        realized: tuple[Hermetic, Path, Path]) -> None:
    h, recipe, _blob = realized
    records = sorted((h.root / "state").glob("*-v*/*.json"))
    assert records
    for i, p in enumerate(records):   # cut short, replaced by a FIFO, a folder
        p.unlink()
        if i % 3 == 0:
            p.write_text('{"key": "cut sh')
        elif i % 3 == 1:
            os.mkfifo(p)
        else:
            p.mkdir()
    again = _run(h, "realize", recipe)   # every record a miss: derived again, never a hang
    assert again.rc == 0, again.err[-3000:]
    found = _run(h, "verify")
    left = [p for p in found.result["problems"] if p["kind"] == "cache"]
    assert found.rc == (1 if left else 0)
    _healed(h, recipe)
    assert not [p for p in _run(h, "verify").result["problems"] if p["kind"] == "cache"]


def test_a_bad_gc_root_stops_gc_and_repair_removes_it(realized: tuple[Hermetic, Path, Path]) -> None:
    h, recipe, _blob = realized
    other = h.root / "roots" / "other.json"
    other.write_text('{"format": 1, "name": "other", "refs": "entry:')   # cut short
    gc = _run(h, "gc")
    assert gc.rc == 2 and str(other) in gc.err and "verify --repair" in gc.err and "--drop-root other" in gc.err
    assert _run(h, "show").rc == 0
    found = _run(h, "verify")
    assert found.rc == 1 and any(p["kind"] == "root" and p["name"] == str(other) for p in found.result["problems"])
    _healed(h, recipe)
    assert not other.exists() and _run(h, "gc").rc == 0


@pytest.fixture
def readonly_entries(realized: tuple[Hermetic, Path, Path]) -> Iterator[tuple[Hermetic, Path, Path]]:
    h, _recipe, _blob = realized
    entries = h.root / "store" / "entries"
    bind = subprocess.run(["mount", "--bind", str(entries), str(entries)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({bind.stderr.strip()}): needs root or CAP_SYS_ADMIN")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(entries)], check=True)
        yield realized
    finally:
        subprocess.run(["umount", "-l", str(entries)], check=False)


def test_a_read_only_mount_over_the_entries_is_said_clearly(tmp_path: Path, index: LoopbackIndex,
                                                           readonly_entries: tuple[Hermetic, Path, Path]) -> None:
    """It used to be "internal error: Invalid cross-device link" with a traceback."""
    h, recipe, _blob = readonly_entries
    wheel = make_pkg(tmp_path / "whl2", "dmgtwo", "1.0")
    index.add(wheel.path)
    second = write_recipe(tmp_path / "r2", "dmgtwo", pip_lock_line(wheel))
    entries = h.root / "store" / "entries"
    res = _run(h, "realize", second)   # publishing an entry renames it into entries/
    assert res.rc in (1, 2) and res.err.startswith(f"error: {entries}: ") and "mount" in res.err, res.err
    assert "hint: " in res.err and json.loads(res.out.splitlines()[-1])["error"]["where"] == str(entries)
    assert _run(h, "verify").rc == 0   # reading works
    gc = _run(h, "gc", "--drop-root", "dmg")   # deleting renames into trash/
    assert gc.rc == 2 and gc.err.startswith(f"error: {entries}") and f"mount at {entries}" in gc.err, gc.err
    subprocess.run(["umount", "-l", str(entries)], check=True)
    assert _run(h, "realize", second).rc == 0 and _run(h, "realize", recipe).rc == 0
    assert _run(h, "verify").rc == 0


def test_a_pyc_cut_short_in_the_childrens_bytecode_cache_is_reported_and_cleared(
        tmp_path: Path, realized: tuple[Hermetic, Path, Path]) -> None:
    """What a disk that filled while a child wrote it leaves (tests/test_reliability_disk.py makes it for real)."""
    import py_compile
    import sys
    h, recipe, _blob = realized
    source = tmp_path / "mod.py"
    source.write_text("".join(f"X{i} = {'x' * 40!r}\n" for i in range(400)))
    pyc = h.root / "home" / ".cache" / "pycache" / str(tmp_path).lstrip("/") / \
        f"mod.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(parents=True)
    py_compile.compile(str(source), cfile=str(pyc))
    pyc.write_bytes(pyc.read_bytes()[:2000])   # the header and part of the body
    found = _run(h, "verify")
    assert found.rc == 1 and any(p["kind"] == "bytecode" and p["name"] == str(pyc) and "cut short" in p["what"]
                                 for p in found.result["problems"]), found.result["problems"]
    _healed(h, recipe)
    assert not pyc.exists()


def _same_size_elsewhere(blob: Path) -> None:
    decoy = blob.parents[3] / "same-size"
    decoy.write_bytes(b"x" * blob.stat().st_size)
    blob.unlink()
    os.symlink(decoy, blob)


def _short_elsewhere(blob: Path) -> None:
    decoy = blob.parents[3] / "short"
    decoy.write_bytes(b"not the blob")
    blob.unlink()
    os.symlink(decoy, blob)


def _flipped(blob: Path) -> None:
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))   # the same inode: the tree's file changes with it
    os.chmod(blob, 0o444)


@pytest.mark.parametrize("make", [_fifo, _short_elsewhere, _same_size_elsewhere, _flipped],
                         ids=["fifo", "link-to-a-short-file", "link-to-a-same-size-file", "flipped-byte"])
def test_export_reads_blobs_as_the_stores_own_files(make: Callable[[Path], None], tmp_path: Path,
                                                    realized: tuple[Hermetic, Path, Path]) -> None:
    """The outside attack on issue 35 (finding 4): export hung for ever on a FIFO blob, printed a Python
    traceback for a link to a shorter file, and wrote an archive (exit 0) holding a decoy's bytes for a link to a
    file of the same size. Now each is exit 1 naming the blob and `verify --repair`; no archive is written."""
    h, recipe, blob = realized
    if make is _fifo:
        blob.unlink()
    make(blob)
    archive = tmp_path / "out" / "closure.tar.zst"
    res = _run(h, "export", "--level", "1", archive)
    assert res.rc == 1 and res.err.startswith(f"error: {blob}: blob {blob.name} "), res.err
    assert "verify --repair" in res.err
    assert not archive.exists() and not list(archive.parent.glob("*.tmp"))
    _healed(h, recipe)
    assert _run(h, "export", "--level", "1", archive).rc == 0


@pytest.mark.parametrize("folder,record", [
    ("roots", {"format": 1, "name": "esc", "recipe": "/nowhere/esc.toml", "profile": "esc",
               "refs": ["entry:../../../outside/victim"]}),
    ("receipts", {"format": 1, "kind": "run", "refs": ["blob:../../../outside/victim/meta.json"]}),
    ("roots", {"format": 1, "name": "esc", "recipe": "/nowhere/esc.toml", "profile": "esc",
               "refs": ["wheel:1234"]})],
    ids=["root-entry-dotdot", "receipt-blob-dotdot", "root-unknown-kind"])
def test_a_gc_root_whose_refs_are_no_store_names_is_a_bad_record(
        folder: str, record: dict[str, object], tmp_path: Path, realized: tuple[Hermetic, Path, Path]) -> None:
    """The outside attack on issue 35 (finding 11): a gc root naming `entry:../../../../outside/victim` passed
    verify (all valid, --repair too), while gc read `meta.json` outside the root, called it a corrupt store entry
    and from then on deleted no blob; export's hint sent the user to a repair that found nothing. A reference is
    `entry:<entry name>` or `blob:<blob name>`, nothing else: anything else is a bad record."""
    h, recipe, _blob = realized
    victim = tmp_path / "outside" / "victim"
    victim.mkdir(parents=True)
    (victim / "meta.json").write_text('{"kind": "tree"}\n')
    bad = h.root / folder / ("esc.json" if folder == "roots" else "run-20260101T000000-esc.json")
    bad.write_text(json.dumps(record))
    found = _run(h, "verify")
    assert found.rc == 1 and any(p["name"] == str(bad) and "refs" in p["what"] for p in found.result["problems"]), \
        found.result["problems"]
    gc = _run(h, "gc")
    assert gc.rc == 2 and str(bad) in gc.err and "verify --repair" in gc.err, gc.err
    assert _run(h, "export", "--level", "1", tmp_path / "x.tar.zst").rc == 2
    assert _run(h, "show").rc == 0
    _healed(h, recipe)
    assert not bad.exists() and _run(h, "gc").rc == 0
    assert (victim / "meta.json").read_text() == '{"kind": "tree"}\n'


def test_a_folder_where_the_profile_belongs_is_named_by_its_path(realized: tuple[Hermetic, Path, Path]) -> None:
    """The outside attack on issue 35 (finding 10): `profiles/NAME` replaced by a folder made the next realize say
    `error: .fast.28702.tmp: .fast.28702.tmp is a folder, not a file (and fast)`, hint "give the path of a file":
    a temp name, relative, and a wrong hint. A profile that is a folder is a bad record: named, exit 2."""
    h, recipe, _blob = realized
    profile = h.root / "profiles" / "dmg"
    profile.unlink()
    (profile / "dmg").mkdir(parents=True)
    recipe.write_text(recipe.read_text() + "\n")   # not a no-op: the realize sets the profile again
    res = _run(h, "realize", recipe)
    assert res.rc == 2 and res.err.startswith(f"error: {profile}: the profile is a folder"), res.err
    assert ".tmp" not in res.err and "verify --repair" in res.err, res.err
    _healed(h, recipe)


@pytest.fixture
def readonly_profiles(realized: tuple[Hermetic, Path, Path]) -> Iterator[tuple[Hermetic, Path, Path]]:
    h, _recipe, _blob = realized
    profiles = h.root / "profiles"
    (profiles / "dmg").unlink()   # the next realize sets it: a write under the mount
    bind = subprocess.run(["mount", "--bind", str(profiles), str(profiles)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({bind.stderr.strip()}): needs root or CAP_SYS_ADMIN")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(profiles)], check=True)
        yield realized
    finally:
        subprocess.run(["umount", "-l", str(profiles)], check=False)


def test_a_read_only_mount_over_the_profiles_is_named_by_its_mount_point(
        readonly_profiles: tuple[Hermetic, Path, Path]) -> None:
    """The outside attack on issue 35 (finding 10): `.fast.1784.tmp is on a read-only file system (the mount at /)`
    where the mount was at ROOT/profiles."""
    h, recipe, _blob = readonly_profiles
    profiles = h.root / "profiles"
    res = _run(h, "realize", recipe)
    assert res.rc == 2 and res.err.startswith(f"error: {profiles / 'dmg'}: "), res.err
    assert f"(the mount at {profiles})" in res.err and ".tmp" not in res.err, res.err
    subprocess.run(["umount", "-l", str(profiles)], check=True)
    assert _run(h, "realize", recipe).rc == 0 and _run(h, "verify").rc == 0
