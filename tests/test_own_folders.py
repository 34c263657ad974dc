"""The root's and the store's own folders are real folders, never followed links (the outside attack on issue
35, findings 1, 2, 8 and 12): a link, a file or a FIFO where one of them belongs is never written, made or
deleted through. gc and realize refuse (exit 2, naming it, hint `verify --repair`); verify reports it; repair
replaces it with an empty real folder (what a link points at is left as it is) and realizes again; show says
it. Every decoy is a folder of the test's own tmp_path, outside the root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hermetic.store import Store
from tests.support.cli import REPO, Hermetic, Result
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe

LIMIT_S = 120


def _run(h: Hermetic, *args: str | Path) -> Result:
    try:
        res = h(*args, "--json", timeout=LIMIT_S)
    except subprocess.TimeoutExpired:  # pragma: no cover - the failure this guards against
        pytest.fail(f"hermetic {' '.join(map(str, args))} hung (over {LIMIT_S} s)")
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err[-3000:]
    return res


@pytest.fixture
def realized(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> tuple[Hermetic, Path]:
    """A root with a lock-only recipe realized: (hermetic, the recipe)."""
    wheel = make_pkg(tmp_path / "whl", "own", "1.0")
    index.add(wheel.path)
    recipe = write_recipe(tmp_path / "r", "own", pip_lock_line(wheel))
    assert _run(hermetic, "realize", recipe).rc == 0
    return hermetic, recipe


def _decoy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder of the user's outside the root, and what it holds."""
    decoy = tmp_path / "outside" / "decoy"
    (decoy / "photos").mkdir(parents=True)
    files = {"photos/cat.jpg": "precious\n", "notes.txt": "notes\n"}
    for rel, text in files.items():
        (decoy / rel).write_text(text)
    return decoy, files


def _unchanged(decoy: Path, files: dict[str, str]) -> None:
    found = {str(p.relative_to(decoy)) for p in decoy.rglob("*") if not p.is_dir()}
    assert found == set(files), f"the folder outside the root changed: {sorted(found)}"
    for rel, text in files.items():
        assert (decoy / rel).read_text() == text


def _replace_with_link(path: Path, target: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)
    os.symlink(target, path)


def _healed(h: Hermetic, recipe: Path, place: Path) -> None:
    """repair makes the folder again (exit 0), verify is clean after, the recipe realizes and gc runs."""
    fixed = _run(h, "verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert place.is_dir() and not place.is_symlink()
    assert _run(h, "verify").rc == 0
    assert _run(h, "realize", recipe).rc == 0
    assert _run(h, "gc").rc == 0


@pytest.mark.parametrize("where", ["store/trash", "store/tmp", "state", "state/realize-v1", "store/temproots",
                                   "roots", "store/index", "store/blobs", "store/entries"])
def test_a_link_where_an_own_folder_belongs_is_never_deleted_through(
        where: str, tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Before: gc emptied the folder outside the root that store/trash, store/tmp or state linked to (verify
    said "all valid" just before); realize wrote its caches into a linked state/."""
    h, recipe = realized
    decoy, files = _decoy(tmp_path)
    place = h.root / where
    if where == "store/index":
        place.mkdir(exist_ok=True)
    _replace_with_link(place, decoy)
    gc = _run(h, "gc")
    dropped = _run(h, "gc", "--drop-root", "own")
    again = _run(h, "realize", recipe, "--explain")
    _unchanged(decoy, files)
    assert gc.rc == 2 and gc.err.startswith(f"error: {place}: ") and "verify --repair" in gc.err, gc.err
    assert dropped.rc == 2
    assert again.rc == 2 and str(place) in again.err and "verify --repair" in again.err, again.err
    found = _run(h, "verify")
    assert found.rc == 1 and any(p["kind"] == "folder" and p["name"] == str(place) and "symbolic link" in p["what"]
                                 for p in found.result["problems"]), found.result["problems"]
    shown = _run(h, "show")
    assert shown.rc == 0 and str(place) in shown.result["bad_folders"] and str(place) in shown.err
    _healed(h, recipe, place)
    _unchanged(decoy, files)
    assert place.is_dir() and not place.is_symlink()


def test_a_blob_folder_linked_out_of_the_root_is_never_written_through(
        tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Before: a cold realize wrote the store's blobs into the folder outside that store/blobs/XY linked to, and
    verify and repair said "all valid" (a warning: "hermetic owns nothing of that name")."""
    h, recipe = realized
    store = Store(h.root / "store")
    assert _run(h, "gc", "--drop-root", "own").rc == 0 and _run(h, "gc").rc == 0
    assert not list(store.iter_blobs())
    decoy = tmp_path / "outside" / "empty-decoy"
    decoy.mkdir(parents=True)
    wheel_sha = (recipe.parent / "own.lock.txt").read_text().split("sha256:")[1].strip()
    shard = store.blobs / wheel_sha[:2]
    _replace_with_link(shard, decoy)
    res = _run(h, "realize", recipe)
    assert res.rc == 2 and res.err.startswith(f"error: {shard}: ") and "verify --repair" in res.err, res.err
    assert not list(decoy.iterdir()), "a blob was written outside the root"
    found = _run(h, "verify")
    assert found.rc == 1 and [p["name"] for p in found.result["problems"]] == [str(shard)]
    assert str(shard) not in found.result["strays"]
    _healed(h, recipe, shard)
    assert not list(decoy.iterdir())


def _fifo(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)
    os.mkfifo(path)


def _file(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)
    path.write_text("in the way\n")


@pytest.mark.parametrize("where,make", [
    ("store/blobs/SHARD", _file), ("state/hashes-v1", _file), ("store/temproots", _file), ("roots", _file),
    ("store/blobs", _fifo), ("store/tmp", _fifo)],
    ids=["shard-file", "state-bucket-file", "temproots-file", "roots-file", "blobs-fifo", "tmp-fifo"])
def test_a_file_or_fifo_where_an_own_folder_belongs_is_healed_by_repair(
        where: str, make: Callable[[Path], None], realized: tuple[Hermetic, Path]) -> None:
    """Before: verify exit 0 (or 1 for the blobs it then missed, with the false "owns nothing of that name"),
    repair exit 0 or 2 changing nothing, and realize exit 2 for ever ("is in the way: move it away")."""
    h, recipe = realized
    store = Store(h.root / "store")
    if "SHARD" in where:
        where = where.replace("SHARD", next(store.iter_blobs())[2].parent.name)
    place = h.root / where
    make(place)
    found = _run(h, "verify")
    assert found.rc == 1 and any(p["kind"] == "folder" and p["name"] == str(place)
                                 for p in found.result["problems"]), found.result["problems"]
    assert str(place) not in found.result["strays"]
    assert _run(h, "show").rc == 0
    assert _run(h, "gc").rc == 2
    _healed(h, recipe, place)
    assert (h.root / "profiles" / "own" / "own" / "__init__.py").read_text() == "VERSION = '1.0'\n"


def _seen_by_nobody(prefix: Path, mnt: Path) -> list[str]:
    """The site-packages hermetic's dependencies come from in this interpreter (a venv's, as the README's and CI's,
    or the base's), as the base interpreter bound at ``mnt`` sees them: it runs without the venv (whose python
    links into /root), and a fresh machine's base has none of them (its ``installer`` was missing there)."""
    import installer
    import zstandard
    folders = dict.fromkeys(Path(module.__file__ or "").resolve().parent.parent for module in (installer, zstandard))
    return [str(mnt / f.relative_to(prefix)) if f.is_relative_to(prefix) else str(f) for f in folders]


def _as_nobody(tmp_path: Path, h: Hermetic) -> Callable[..., Result]:
    """hermetic run as uid 65534 with no capability left, so that a mode of 000 stops it as it stops a user (the
    suite runs as root, which modes do not stop). The interpreter lives under /root (mode 700): a private mount
    namespace binds its prefix to a folder of tmp_path (gone with the process); the root becomes nobody's."""
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("setpriv and unshare (util-linux) are needed")
    prefix = Path(sys.base_prefix)
    exe = Path(sys.executable).resolve()
    mnt = tmp_path / "py"
    mnt.mkdir()
    mine = {key: tmp_path / "nobody" / key.lower() for key in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "MPLCONFIGDIR")}
    for folder in mine.values():
        folder.mkdir(parents=True)
    for path in (tmp_path.parent, tmp_path):
        os.chmod(path, 0o755)
    subprocess.run(["chown", "-R", "65534:65534", str(h.root), str(tmp_path / "nobody")], check=True)
    # its libpython too: the loader would take the system's from /usr/lib when the rpath under /root is closed
    env = {**h.env, **{k: str(v) for k, v in mine.items()}, "LD_LIBRARY_PATH": str(mnt / "lib"),
           "PYTHONPATH": os.pathsep.join(_seen_by_nobody(prefix, mnt))}

    def run(*args: str | Path) -> Result:
        inner = [str(mnt / exe.relative_to(prefix)), "-m", "hermetic", "--root", str(h.root), *map(str, args),
                 "--json"]
        script = 'mount --bind "$1" "$2" && shift 2 && exec setpriv --reuid=65534 --regid=65534 --clear-groups "$@"'
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(prefix),
                            str(mnt), *inner], capture_output=True, text=True, env=env, cwd=REPO, timeout=LIMIT_S)
        res = Result(p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in res.err and "internal error" not in res.err, res.err[-3000:]
        return res
    return run


@pytest.mark.parametrize("what", ["blob", "blob-folder"])
def test_a_blob_or_blob_folder_this_user_cannot_read_is_reported_and_repaired(
        what: str, tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """The outside attack on issue 35 (finding 12): a blob (or its folder store/blobs/XY) of mode 000 made verify
    and `verify --repair` exit 2 ("permission denied ... give this user access") and left it; show exited 2 for
    the folder. Now verify reports it (exit 1), show carries on (exit 0), repair mends it and realizes again."""
    h, recipe = realized
    nobody = _as_nobody(tmp_path, h)
    blob = next(Store(h.root / "store").iter_blobs())[2]
    place = blob if what == "blob" else blob.parent
    os.chmod(place, 0)
    found = nobody("verify")
    assert found.rc == 1, found.err[-3000:]
    assert any(p["name"] in (str(place), blob.name) for p in found.result["problems"]), found.result["problems"]
    assert nobody("show").rc == 0
    fixed = nobody("verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert nobody("verify").rc == 0
    assert nobody("realize", recipe).rc == 0
    assert (h.root / "profiles" / "own" / "own" / "__init__.py").read_text() == "VERSION = '1.0'\n"


def test_a_blobs_folder_linked_to_a_copy_outside_is_healed_in_one_repair(
        tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """The outside attack on issue 35 (repro-plumbing-links.sh): store/blobs replaced by a link to a copy of it
    outside the root. Before: `verify --repair` made store/blobs an empty folder, but its pass had looked at the
    entries' blobs through the link, so it removed no entry, realized nothing anew and exited 1 ("blob ... is
    missing" for every file); a second repair was needed. The copy outside is never changed."""
    h, recipe = realized
    blobs = h.root / "store" / "blobs"
    copy = tmp_path / "outside" / "blobs-copy"
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(blobs), str(copy)], check=True)
    before = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    _replace_with_link(blobs, copy)
    assert _run(h, "verify").rc == 1
    _healed(h, recipe, blobs)
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == before
    assert (h.root / "profiles" / "own" / "own" / "__init__.py").read_text() == "VERSION = '1.0'\n"


def test_show_carries_on_past_a_root_folder_this_user_cannot_search(
        tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Run as uid 65534: state/ of mode 000 (damage.py state_unreadable). Before: the check for links in the
    root's own folders lstat'ed state/<bucket> and failed, so show (and gc, export, import) exited 2 "permission
    denied"; show must report and carry on (layout.md, "A bad record"). What needs state/ still says it."""
    h, _recipe = realized
    nobody = _as_nobody(tmp_path, h)
    os.chmod(h.root / "state", 0)
    assert nobody("show").rc == 0
    assert nobody("gc").rc == 0


@pytest.mark.parametrize("where", ["store/entries", "store/temproots"])
def test_a_missing_own_folder_of_the_store_is_made_again(where: str, realized: tuple[Hermetic, Path]) -> None:
    """Before (the re-attack of 2026-12-04, finding 4): with store/entries gone every realize and repair
    exited 2 naming a staging folder, for good; the other own folders were made again."""
    h, recipe = realized
    subprocess.run(["rm", "-rf", str(h.root / where)], check=True)
    again = _run(h, "realize", recipe)
    assert again.rc == 0, again.err[-3000:]
    assert (h.root / where).is_dir() and not (h.root / where).is_symlink()
    assert _run(h, "verify").rc == 0


def _symlink_out(path: Path, target: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)
    os.symlink(target, path)


def _subfolder(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)
    path.mkdir()


@pytest.mark.parametrize("make", ["fifo", "link", "folder"])
def test_an_entry_lock_that_is_no_lock_file_is_reported_and_repaired(
        make: str, tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Outside attack r1, finding 2 (f_fifos.sh): store/locks/<entry>.lock a FIFO. Before: realize exit 2 for
    good (the entry's build cannot lock), while verify and `verify --repair` said "all valid" (exit 0) and left
    it. Now verify names it (exit 1), repair removes it (what a link points at is left) and the recipe realizes."""
    h, recipe = realized
    decoy, files = _decoy(tmp_path)
    locks = h.root / "store" / "locks"
    names = sorted(p.name for p in locks.iterdir())
    assert names, "a realize leaves its entries' lock files"
    places = [locks / n for n in names]
    for place in places:
        {"fifo": _fifo, "folder": _subfolder, "link": lambda p: _symlink_out(p, decoy / "notes.txt")}[make](place)
    assert _run(h, "gc", "--drop-root", "own").rc == 0
    res = _run(h, "realize", recipe)
    assert res.rc == 2 and any(str(p) in res.err for p in places) and "verify --repair" in res.err, res.err
    found = _run(h, "verify")
    assert found.rc == 1, found.err[-3000:]
    named = {p["name"] for p in found.result["problems"] if p["kind"] == "lock"}
    assert named == {str(p) for p in places}, found.result["problems"]
    fixed = _run(h, "verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert _run(h, "verify").rc == 0
    assert _run(h, "realize", recipe).rc == 0
    _unchanged(decoy, files)


@pytest.mark.parametrize("level", ["lookup", "shard"])
def test_an_index_folder_that_is_a_link_or_fifo_is_reported_and_repaired(
        level: str, tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Outside attack r1, finding 2 (t_index_link.sh): store/index/XY/<lookup> a link to a folder outside (or a
    FIFO). Before: verify and repair "all valid"; a build publishing under that key exited 2 for good, saying
    "a folder on the path is a file". Now verify names each (exit 1, never following it), repair removes each
    (what a link points at is left), verify is clean after."""
    h, _recipe = realized
    decoy, files = _decoy(tmp_path)
    index = h.root / "store" / "index"
    if level == "lookup":
        (index / "ab").mkdir(parents=True)
        planted = [index / "ab" / ("ab" + "0" * 62), index / "ab" / ("ab" + "1" * 62)]
    else:
        index.mkdir(exist_ok=True)
        planted = [index / "cd", index / "ef"]
    planted[0].symlink_to(decoy)
    os.mkfifo(planted[1])
    found = _run(h, "verify")
    assert found.rc == 1, found.err[-3000:]
    named = {p["name"]: p["what"] for p in found.result["problems"] if p["kind"] == "index"}
    assert set(named) == {str(p) for p in planted}, found.result["problems"]
    assert "symbolic link" in named[str(planted[0])] and "FIFO" in named[str(planted[1])]
    assert _run(h, "gc").rc == 0
    fixed = _run(h, "verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert not any(os.path.lexists(p) for p in planted)
    assert _run(h, "verify").rc == 0
    _unchanged(decoy, files)


def test_a_read_only_blob_folder_holding_a_damaged_blob_is_repaired(
        tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Outside attack r1, finding 7 (repro7_readonly_blobdir.sh), run as uid 65534: a blob folder of mode 555 (what
    `chmod -R a-w ROOT` leaves) holding a damaged blob. Before: verify exit 1, `verify --repair` exit 2
    ("permission denied ... blobs/XY/<blob>"), nothing healed. Now repair gives the folder its mode back (through
    a descriptor, never a link) and heals (exit 0); the recipe realizes after."""
    h, recipe = realized
    wheel_sha = (recipe.parent / "own.lock.txt").read_text().split("sha256:")[1].strip()
    blob = next(b for _d, _x, b in Store(h.root / "store").iter_blobs() if b.name.startswith(wheel_sha))
    os.chmod(blob, 0o644)
    blob.write_bytes(b"damaged\n")
    os.chmod(blob, 0o444)
    os.chmod(blob.parent, 0o555)
    nobody = _as_nobody(tmp_path, h)
    found = nobody("verify")
    assert found.rc == 1 and any(p["name"] == blob.name for p in found.result["problems"]), found.result["problems"]
    fixed = nobody("verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert os.stat(blob.parent).st_mode & 0o700 == 0o700
    assert nobody("verify").rc == 0
    assert nobody("gc", "--drop-root", "own").rc == 0
    assert nobody("realize", recipe).rc == 0
    assert (h.root / "profiles" / "own" / "own" / "__init__.py").read_text() == "VERSION = '1.0'\n"


def test_gc_deletes_under_state_only_hermetics_old_buckets(tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Outside attack r1, finding 8 (h_state_strays.sh): gc deleted everything under state/ that no current bucket
    names, a user's README, notes/ and mydata-v1/ among them. Now it deletes only an earlier version of one of
    hermetic's buckets (realize-v0, hashes-v7) and leaves the rest as it was."""
    h, _recipe = realized
    state = h.root / "state"
    mine = {"README": "mine\n", "notes/file.txt": "notes\n", "mydata-v1/file.txt": "data\n",
            "realize-vx/file.txt": "not a version\n", "zzz-v0/file.txt": "no bucket of that name\n"}
    for rel, text in mine.items():
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).write_text(text)
    old = [state / "realize-v0", state / "hashes-v7"]
    for folder in old:
        folder.mkdir()
        (folder / "record.json").write_text("{}")
    res = _run(h, "gc")
    assert res.rc == 0, res.err[-3000:]
    assert not any(os.path.lexists(f) for f in old)
    for rel, text in mine.items():
        assert (state / rel).read_text() == text, rel
    assert (state / "realize-v1").is_dir()


def _tree_entry(h: Hermetic) -> Path:
    """The recipe's tree entry (profiles/own names its out/)."""
    return (h.root / "profiles" / os.readlink(h.root / "profiles" / "own")).resolve().parent


def test_verify_never_follows_a_link_where_a_trees_out_folder_belongs(
        tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Outside attack r1, finding 9 (k_tree_damage.sh, outfolder-link): store/entries/<tree>/out replaced by a
    link to a folder outside. Before: verify walked through it, listing the outside folder's files ("f: a file
    not in the record"). Now it says out/ is a link (never followed); repair rebuilds the tree, the folder
    outside untouched."""
    h, recipe = realized
    decoy, files = _decoy(tmp_path)
    entry = _tree_entry(h)
    os.chmod(entry, 0o755)
    _replace_with_link(entry / "out", decoy)
    found = _run(h, "verify")
    assert found.rc == 1, found.err[-3000:]
    whats = [p["what"] for p in found.result["problems"] if p["name"] == entry.name]
    assert whats and all("out is a symbolic link" in w for w in whats), found.result["problems"]
    assert not any("notes.txt" in p["what"] or "photos" in p["what"] for p in found.result["problems"])
    fixed = _run(h, "verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert _run(h, "verify").rc == 0
    _unchanged(decoy, files)
    assert (h.root / "profiles" / "own" / "own" / "__init__.py").read_text() == "VERSION = '1.0'\n"


@pytest.mark.parametrize("case", ["dotdot", "absolute", "link-name", "through-link", "link-out"])
def test_a_tree_record_naming_a_path_outside_its_entry_is_a_bad_record(
        case: str, tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """Outside attack r1, finding 9 (k2_meta.sh): a tree's meta.json given a file `../../../outside/x/pwn` or an
    absolute one. Before: verify lstat'ed the path outside the root ("missing"): no bad record. Now the record is
    bad (a problem naming the entry, never a path looked at outside), repair removes the entry and realizes."""
    h, recipe = realized
    decoy, files = _decoy(tmp_path)
    entry = _tree_entry(h)
    meta_path = entry / "meta.json"
    meta = json.loads(meta_path.read_text())
    spec = next(iter(meta["files"].values()))
    if case == "dotdot":
        meta["files"]["../../../../../outside/decoy/pwn"] = spec
    elif case == "absolute":
        meta["files"][str(decoy / "pwn")] = spec
    elif case == "link-name":
        meta["links"]["../evil"] = "own"
    elif case == "through-link":
        meta["links"]["evil"] = "own"
        meta["files"]["evil/pwn"] = spec
    else:
        meta["links"]["evil"] = "../../../../../outside/decoy"
    os.chmod(entry, 0o755)
    os.chmod(meta_path, 0o644)
    meta_path.write_text(json.dumps(meta))
    found = _run(h, "verify")
    assert found.rc == 1, found.err[-3000:]
    named = [p for p in found.result["problems"] if p["name"] == entry.name]
    assert named and all(p["kind"] == "entry" for p in named), found.result["problems"]
    assert any(w in named[0]["what"] for w in ("leaves the entry", "leaves the tree", "through its symlink")), named
    fixed = _run(h, "verify", "--repair")
    assert fixed.rc == 0, fixed.err[-3000:]
    assert _run(h, "verify").rc == 0
    _unchanged(decoy, files)
    assert (h.root / "profiles" / "own" / "own" / "__init__.py").read_text() == "VERSION = '1.0'\n"


def test_an_index_lookup_linked_out_of_the_root_is_a_miss_never_listed(tmp_path: Path) -> None:
    """Outside attack r1, finding 2 (t_index_link.sh): store/index/XY/<lookup> a link to a folder outside. Before,
    index_list followed it (is_dir, listdir) and took the outside folder's names as candidate objects; now a link
    there lists nothing (a miss, as a stale link is), and the outside folder is never read."""
    store = Store(tmp_path / "root" / "store").open()
    decoy, files = _decoy(tmp_path)
    key = "ab" + "0" * 62
    (store.path / "index" / "ab").mkdir(parents=True)
    (store.path / "index" / "ab" / key).symlink_to(decoy)
    assert store.index_list(key) == []
    _unchanged(decoy, files)


def test_gc_removes_a_dead_fresh_home_whatever_its_child_left_in_it_and_never_follows_out(
        tmp_path: Path, realized: tuple[Hermetic, Path]) -> None:
    """The outside attack on today's sweep (attack47 rows 1, 2): a stranger's setup.py left 3000 nested folders
    in its fresh home (then every gc, recipe new and `gc --all` died of RecursionError, for good), or one folder of
    mode 000 (gc exit 0 left the home, without a word). As a user whom modes stop (uid 65534), gc now removes the
    dead home whole, a 555 folder, a FIFO and links out among it, leaves what the links point at, and keeps a live
    command's home."""
    import fcntl
    h, _recipe = realized
    boxes = h.root / "home" / ".sandboxed"
    dead = boxes / "once-999999-dead"
    dead.mkdir(parents=True)
    fd = os.open(dead, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):   # deeper than a path may name: made folder by folder, as setup.py made them
        os.mkdir("d", dir_fd=fd)
        fd, up = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(up)
    os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    for mode in (0o000, 0o555):
        folder = dead / f"mode{mode:o}"
        folder.mkdir()
        (folder / "inside").write_text("x")
        os.chmod(folder, mode)
    decoy = tmp_path / "outside"
    decoy.mkdir()
    (decoy / "keep").write_text("mine")
    (dead / "link-out").symlink_to(decoy)
    (dead / "file-link-out").symlink_to(decoy / "keep")
    os.mkfifo(dead / "fifo")
    closed = boxes / "once-999998-closed"   # its child made the home itself mode 000 (the re-attack's B1)
    (closed / "sub").mkdir(parents=True)
    live = boxes / "once-1-live"   # another live process's: locked, never touched
    live.mkdir()
    nobody = _as_nobody(tmp_path, h)   # the root (home/ with it) becomes nobody's
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    os.chmod(closed, 0)
    os.chmod(live, 0)   # a live home its child closed: still a live home (B2: gc --all removed the root)
    try:
        everything = nobody("gc", "--all")
        assert everything.rc == 3 and "another hermetic command is running" in everything.err, everything.err
        gc = nobody("gc")
        assert gc.rc == 0 and f"removed {dead}, the home of a command that was killed" in gc.out, gc.err[-3000:]
        assert f"removed {closed}, the home of a command that was killed" in gc.out, gc.out[-3000:]
        assert not dead.exists() and not closed.exists() and live.is_dir()
        assert sorted(p.name for p in decoy.iterdir()) == ["keep"] and (decoy / "keep").read_text() == "mine"
    finally:
        os.close(held)
