"""The root's and the store's own folders are real folders, never followed links (the outside attack on issue
35, findings 1, 2, 8 and 12): a link, a file or a FIFO where one of them belongs is never written, made or
deleted through. gc and realize refuse (exit 2, naming it, hint `verify --repair`); verify reports it; repair
replaces it with an empty real folder (what a link points at is left as it is) and realizes again; show says
it. Every decoy is a folder of the test's own tmp_path, outside the root."""

from __future__ import annotations

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
    env = {**h.env, **{k: str(v) for k, v in mine.items()}, "LD_LIBRARY_PATH": str(mnt / "lib")}

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
