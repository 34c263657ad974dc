"""The root marker (issue 34, item 4): a command makes a scratch root only in a missing or empty folder; a
folder with files and no HERMETIC_ROOT marker is refused (exit 2) and left as it was. `gc --all` removes only
a marked root and never /, the home folder, the current folder or a checkout; `export` writes nothing inside
the root. An earlier hermetic's marker is upgraded to name the format on the next write.

The mistyped path is a real folder of a user's files (a decoy), the commands the real CLI."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from hermetic.root import MARKER_TEXT, ROOT_MARKER, Root
from tests.support.archives import honest_records, write_archive
from tests.support.cli import Hermetic
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe

OLD_MARKER = b"This folder is a hermetic scratch root. `hermetic gc --all` removes it.\n"


def _user_folder(path: Path) -> dict[str, bytes]:
    """A folder of someone's files (the path a --root was mistyped as), and its contents."""
    (path / "notes").mkdir(parents=True)
    (path / "thesis.tex").write_text("\\chapter{One}\n")
    (path / "notes" / "todo.txt").write_text("back up the thesis\n")
    return _contents(path)


def _contents(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else b"/") for p in sorted(path.rglob("*"))}


def _archive(tmp_path: Path) -> Path:
    return write_archive(tmp_path / "closure.tar.zst", *honest_records())


def test_a_folder_with_files_and_no_marker_is_not_made_a_root(tmp_path: Path, hermetic: Hermetic) -> None:
    """Before the fix, import (exit 0) wrote its store, roots and the marker into the user's folder, and the
    next `gc --all` there deleted the user's files with it."""
    folder = tmp_path / "Documents"
    before = _user_folder(folder)
    res = hermetic("import", _archive(tmp_path), root=folder)
    assert res.rc == 2, (res.rc, res.err)
    assert "not a hermetic scratch root" in res.err and str(folder) in res.err and "hint:" in res.err
    assert "Traceback" not in res.err
    assert _contents(folder) == before


def test_gc_all_removes_only_a_marked_root(tmp_path: Path, hermetic: Hermetic) -> None:
    """`hermetic --root DIR gc --all` where DIR is an ordinary folder: before the fix, DIR and the user's
    files in it were deleted (exit 0)."""
    folder = tmp_path / "photos"
    before = _user_folder(folder)
    for args in (("gc", "--all"), ("gc", "--all", "--dry-run")):
        res = hermetic(*args, root=folder)
        assert res.rc == 2 and "not a hermetic scratch root" in res.err, (args, res.rc, res.err)
        assert _contents(folder) == before
    # a real root goes whole; an empty folder is no root and is left
    hermetic("import", _archive(tmp_path), root=tmp_path / "real", check=True)
    assert hermetic("gc", "--all", root=tmp_path / "real").rc == 0 and not (tmp_path / "real").exists()
    (tmp_path / "empty").mkdir()
    assert hermetic("gc", "--all", root=tmp_path / "empty").rc == 0 and (tmp_path / "empty").is_dir()


def test_gc_all_never_removes_home_the_current_folder_or_a_checkout(tmp_path: Path, hermetic: Hermetic) -> None:
    """Each one marked the way an earlier hermetic marked any folder it wrote to (its marker proved nothing):
    before the fix, gc --all removed each of them."""
    home = Path(hermetic.env["HOME"])
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    for folder, why in ((home, "home folder"), (checkout, "repository checkout")):
        (folder / ROOT_MARKER).write_bytes(OLD_MARKER)
        (folder / "keep.txt").write_text("keep me\n")
        res = hermetic("gc", "--all", root=folder)
        assert res.rc == 2 and why in res.err, (folder, res.rc, res.err)
        assert (folder / "keep.txt").read_text() == "keep me\n"


def test_an_earlier_hermetics_marker_is_upgraded_on_the_next_write(tmp_path: Path, hermetic: Hermetic) -> None:
    root = tmp_path / "old-root"
    root.mkdir()
    (root / ROOT_MARKER).write_bytes(OLD_MARKER)
    (root / "store").mkdir()  # not empty: it was a root already
    assert Root(root).marker_format() == 0
    hermetic("import", _archive(tmp_path), root=root, check=True)
    assert (root / ROOT_MARKER).read_bytes() == MARKER_TEXT and Root(root).marker_format() == 1


def test_a_root_copied_without_its_marker_is_refused_until_an_empty_marker_is_made(tmp_path: Path,
                                                                                   hermetic: Hermetic) -> None:
    """Only the marker makes a root (outside attack r1, finding 3: a folder holding only a root's own folder names
    and a store/FORMAT was taken as a root whose marker was lost, so a planted FORMAT made one of someone's
    files). A root copied without its marker is refused, the hint saying to create an empty one; with it, it is
    a root again (an earlier marker, upgraded)."""
    copied = tmp_path / "copied"
    hermetic("import", _archive(tmp_path), root=copied, check=True)
    (copied / ROOT_MARKER).unlink()
    before = _contents(copied)
    res = hermetic("import", _archive(tmp_path), root=copied)
    assert res.rc == 2 and "not a hermetic scratch root" in res.err and f"empty {ROOT_MARKER}" in res.err, res.err
    assert _contents(copied) == before
    (copied / ROOT_MARKER).write_bytes(b"")
    assert hermetic("import", _archive(tmp_path), root=copied).rc == 0 and Root(copied).marker_format() == 1
    lookalike = tmp_path / "lookalike"
    before = _user_folder(lookalike)
    (lookalike / "store").mkdir()
    before = _contents(lookalike)
    res = hermetic("import", _archive(tmp_path), root=lookalike)
    assert res.rc == 2 and "not a hermetic scratch root" in res.err and _contents(lookalike) == before


def _planted_store(folder: Path) -> dict[str, bytes]:
    """The attacker's folder (repro3_gc_nonroot.sh): a user's files in folders named as a root's, under a
    planted store/FORMAT, back-dated past every grace period."""
    for d in ("state/models-v0", "state/realize-v0", "state/notes", "store/tmp/drafts", "store/tmp/entry-1",
              "store/trash/t"):
        (folder / d).mkdir(parents=True)
        (folder / d / "file.txt").write_text("precious\n")
    (folder / "store" / "FORMAT").write_text("hermetic-store 1\n")
    old = time.time() - 3 * 86400
    for p in folder.rglob("*"):
        os.utime(p, (old, old))
    return _contents(folder)


def _lock_only_recipe(tmp_path: Path) -> Path:
    wheel = make_pkg(tmp_path / "whl", "lk", "1.0")
    return write_recipe(tmp_path / "recipe", "lk", pip_lock_line(wheel))


@pytest.mark.parametrize("marker", ["none", "fifo", "folder", "symlink"])
def test_no_command_adopts_or_collects_in_a_folder_without_a_marker(marker: str, tmp_path: Path,
                                                                    hermetic: Hermetic) -> None:
    """Outside attack r1, finding 3: realize took such a folder as a root (writing its marker and state), and
    plain gc, gc --drop-root and verify --repair deleted the user's state/*-v0 and store/tmp folders (only
    gc --all checked the marker). Now each is exit 2 with gc --all's words, and the folder is left as it was,
    whatever stands where the marker belongs: nothing, a FIFO, a folder, a link to a real root's marker."""
    folder = tmp_path / "project"
    _planted_store(folder)
    real = tmp_path / "real-root"
    hermetic("import", _archive(tmp_path), root=real, check=True)
    where = folder / ROOT_MARKER
    if marker == "fifo":
        os.mkfifo(where)
    elif marker == "folder":
        where.mkdir()
    elif marker == "symlink":
        where.symlink_to(real / ROOT_MARKER)
    before = _contents(folder)
    recipe = _lock_only_recipe(tmp_path)
    for args in (("realize", recipe), ("gc",), ("gc", "--drop-root", "lk"), ("verify",), ("verify", "--repair"),
                 ("gc", "--all"), ("env", recipe)):
        res = hermetic(*args, root=folder, timeout=60)
        assert res.rc == 2, (args, res.rc, res.err)
        assert "not a hermetic scratch root" in res.err and str(folder) in res.err, (args, res.err)
        assert "Traceback" not in res.err, res.err
        assert _contents(folder) == before, args


@pytest.mark.parametrize("text", [b"", OLD_MARKER, b"hello\n"])
def test_an_earlier_marker_is_a_marker_for_every_command(text: bytes, tmp_path: Path, hermetic: Hermetic) -> None:
    """An earlier marker, a regular HERMETIC_ROOT naming no format (empty, an earlier hermetic's text, any text),
    is a root of format 0 for gc, verify and repair as for realize and gc --all (docs/layout.md)."""
    root = tmp_path / "old"
    hermetic("import", _archive(tmp_path), root=root, check=True)
    (root / ROOT_MARKER).write_bytes(text)
    assert Root(root).marker_format() == 0
    for args in (("verify",), ("gc",), ("verify", "--repair")):
        res = hermetic(*args, root=root)
        assert res.rc == 0, (args, res.rc, res.err)
    assert hermetic("gc", "--all", root=root).rc == 0 and not root.exists()


def test_roots_made_at_once_in_one_empty_folder_all_succeed(tmp_path: Path) -> None:
    """The marker is written first, so a second process making the same root sees a root, not a folder of
    someone else's files."""
    for i in range(20):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        errors: list[BaseException] = []

        def make(folder: Path = folder, errors: list[BaseException] = errors) -> None:
            try:
                Root(folder).ensure()
            except BaseException as e:  # collected for the assertion below
                errors.append(e)

        threads = [threading.Thread(target=make) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert (folder / ROOT_MARKER).read_bytes() == MARKER_TEXT


def test_export_refuses_an_output_inside_the_root(tmp_path: Path, hermetic: Hermetic) -> None:
    """Before the fix, `export ROOT/roots/crafted.json` overwrote that gc root with the archive (exit 0)."""
    hermetic("import", _archive(tmp_path), check=True)
    gc_root = hermetic.root / "roots" / "crafted.json"
    before = gc_root.read_bytes()
    for target in (gc_root, hermetic.root / "closure.tar.zst", hermetic.root / "receipts" / "x.tar.zst"):
        res = hermetic("export", target)
        assert res.rc == 2 and "inside the scratch root" in res.err, (target, res.rc, res.err)
        assert not os.path.lexists(target) or target == gc_root
    assert gc_root.read_bytes() == before
    assert hermetic("export", tmp_path / "out.tar.zst").rc == 0


def test_gc_drop_root_takes_only_a_roots_name(tmp_path: Path, hermetic: Hermetic) -> None:
    """Attack on issue 34, finding 5: `gc --drop-root ../../outside/victim` deleted outside/victim.json (any file)
    and outside/victim when it was a symlink; an absolute name worked too (exit 0, no warning). Now a name that
    is not a root's is exit 2 naming it, and nothing outside the root is touched; a real name still drops."""
    hermetic("import", _archive(tmp_path), check=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("victim.json", "abs.json", "lnk.json"):
        (outside / name).write_text("precious")
    (outside / "lnk").symlink_to(outside / "victim.json")
    before = _contents(outside)
    for name in ("../../outside/victim", str(outside / "abs"), "../../outside/lnk", "..", ".", "a/b", ""):
        res = hermetic("gc", "--drop-root", name)
        assert res.rc == 2 and f"{name!r} is not a root's name" in res.err and "--drop-root" in res.err, \
            (name, res.rc, res.err)
        assert "Traceback" not in res.err
    assert _contents(outside) == before and os.path.islink(outside / "lnk")
    assert (hermetic.root / "roots" / "crafted.json").exists()
    hermetic("gc", "--drop-root", "crafted", check=True)
    assert not (hermetic.root / "roots" / "crafted.json").exists()


def test_export_onto_a_folder_names_the_folder(tmp_path: Path, hermetic: Hermetic) -> None:
    """Before the fix the error named the temp file beside it (".adir.PID....tmp is a folder, not a file")."""
    hermetic("import", _archive(tmp_path), check=True)
    folder = tmp_path / "adir"
    folder.mkdir()
    res = hermetic("export", folder)
    assert res.rc == 2 and f"the output {folder} is a folder" in res.err and ".tmp" not in res.err, res.err
    assert not any(folder.iterdir())


def test_gc_all_refuses_a_root_holding_a_checkout_below_its_top(tmp_path: Path, hermetic: Hermetic) -> None:
    """A marked root into which someone cloned a repository, a folder below its top: hermetic never makes a
    checkout outside its store, so `gc --all` (which removed it before the fix) refuses, naming it. A source
    folder copied into the store with its .git is hermetic's own copy: that root goes whole."""
    hermetic("import", _archive(tmp_path), check=True)
    checkout = hermetic.root / "home" / "work" / "project"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "main.c").write_text("int main(void) { return 0; }\n")
    res = hermetic("gc", "--all")
    assert res.rc == 2 and "holds a repository checkout" in res.err and str(checkout) in res.err, res.err
    assert (checkout / "main.c").exists()
    other = tmp_path / "other"
    hermetic("import", _archive(tmp_path), root=other, check=True)
    (other / "store" / "entries" / "copied-src" / ".git").mkdir(parents=True)
    assert hermetic("gc", "--all", root=other).rc == 0 and not other.exists()
