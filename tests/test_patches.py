"""Patches (issue 34, item 3): a recipe's patch may create, change and delete regular files in the source tree
and set their executable bit; a symlink, another mode, a rename or copy, a binary patch is refused before GNU
patch runs, and the tree is checked again after it ran, before anything in it is hashed or chmodded.

The patches are made by real git from real repositories (``git diff --cached``), applied by the real GNU patch
into a real store."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.extensions.sources import check_patch, check_patched_tree, realize_source
from hermetic.recipe import Source
from hermetic.reporter import Reporter
from hermetic.root import Root
from hermetic.store import Store

GIT = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t", "-c", "core.symlinks=true"]


def _git_patch(folder: Path, change: str) -> str:
    """A repository holding a.cpp and b.h, one change staged by ``change`` (a shell line), its diff."""
    folder.mkdir(parents=True)
    (folder / "a.cpp").write_text("int a;\n")
    (folder / "b.h").write_text("#pragma once\n" + "int b;\n" * 40)
    subprocess.run([*GIT, "init", "-q"], cwd=folder, check=True)
    subprocess.run([*GIT, "add", "."], cwd=folder, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=folder, check=True)
    subprocess.run(["sh", "-c", change], cwd=folder, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=folder, check=True)
    diff = subprocess.run([*GIT, "diff", "--cached", "-M", "-C", "--find-copies-harder", "--binary"], cwd=folder,
                          check=True, capture_output=True, text=True).stdout
    assert diff.startswith("diff --git"), diff
    return diff


def _source(tmp_path: Path) -> tuple[Root, Store, Source]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cpp").write_text("int a;\n")
    (src / "b.h").write_text("#pragma once\n" + "int b;\n" * 40)
    root = Root(tmp_path / "root")
    root.ensure()
    return root, Store(root.store).open(), Source("s", path=src, where="recipe.toml:3: key sources.s")


def _realize(tmp_path: Path, patch_text: str) -> tuple[Root, Store, object]:
    root, store, src = _source(tmp_path)
    patch = tmp_path / "change.patch"
    patch.write_text(patch_text)
    return root, store, realize_source(root, store, src, (patch,), Reporter(quiet=True))


def test_a_git_patch_that_makes_a_symlink_out_of_the_root_is_refused_before_patch_runs(tmp_path: Path) -> None:
    """The attack of issue 34: git's `new file mode 120000` (GNU patch makes the link). Before the fix, the
    source tree was stored with the link as a blob (its target's bytes) and the target, outside the root, was
    chmodded 0444 by hermetic itself."""
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("the user's secret\n")
    os.chmod(secret, 0o640)
    text = _git_patch(tmp_path / "git", f"ln -s {secret} leak.h && chmod +x a.cpp")
    assert "new file mode 120000" in text
    with pytest.raises(BadInput) as caught:
        _realize(tmp_path, text)
    err = caught.value
    assert "makes a symlink" in err.what and err.where is not None and err.where.endswith(
        f"change.patch:{text.splitlines().index('new file mode 120000') + 1}")
    assert "regular files" in (err.hint or "")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o640 and secret.read_text() == "the user's secret\n"
    store = tmp_path / "root" / "store"
    assert not os.listdir(store / "entries") and not any(os.path.islink(p) for p in store.rglob("*"))
    assert not os.listdir(store / "tmp")


@pytest.mark.parametrize(("change", "why"), [
    ("git mv b.h c.h", "renames or copies a file"),
    ("cp b.h c.h", "renames or copies a file"),
    ("printf '\\000\\001\\002binary' > blob.bin", "binary patch"),
    ("ln -s a.cpp inner.h", "makes a symlink"),
])
def test_what_a_patch_may_not_do_is_refused_before_patch_runs(tmp_path: Path, change: str, why: str) -> None:
    text = _git_patch(tmp_path / "git", change)
    with pytest.raises(BadInput) as caught:
        _realize(tmp_path, text)
    assert why in caught.value.what, (caught.value.what, text)
    assert not os.listdir(tmp_path / "root" / "store" / "entries")


def test_a_patch_creates_changes_deletes_files_and_sets_the_executable_bit(tmp_path: Path) -> None:
    text = _git_patch(tmp_path / "git", "echo 'int c;' > c.cpp && echo 'int a2;' >> a.cpp && git rm -q b.h && "
                                        "chmod +x a.cpp && touch empty.h")
    assert "old mode 100644" in text and "new mode 100755" in text and "deleted file mode" in text
    _root, store, tree = _realize(tmp_path, text)
    files = tree.files  # type: ignore[attr-defined]
    assert set(files) == {"a.cpp", "c.cpp", "empty.h"} and files["a.cpp"][1] is True and files["c.cpp"][1] is False
    out = store.entry_path(tree.entry) / "out"  # type: ignore[attr-defined]
    assert (out / "a.cpp").read_text() == "int a;\nint a2;\n"


@pytest.mark.parametrize(("line", "why"), [
    ("new file mode 0120000", "a file of mode 0120000"),
    ("new file mode 100644 junk", "a file of mode junk"),
    ("index 0000000..17984f4 120000", "makes a symlink"),     # GNU patch makes a link from the index line alone
    ("index abc", "not git's"),
    ("new mode 160000", "a submodule"),
    ("old mode 100644", None),
    ("index 0000000..17984f4 100755", None),
    ("diff --git a/x b/y", "renames or copies a file"),
    ("rename from x", "renames a file"),
    ("copy to y", "copies a file"),
    ("diff --git a/x y b/x z", "cannot read as one file"),
    ('diff --git "a/x" "b/x"', "cannot read as one file"),
    ("diff --git a/../x b/../x", "outside the source tree"),
    ("+++ b/../x", "outside the source tree"),
])
def test_git_headers_are_read_strictly(line: str, why: str | None) -> None:
    if why is None:
        check_patch(line + "\n", Path("p.patch"))
        return
    with pytest.raises(BadInput) as caught:
        check_patch(f"some text\n{line}\n", Path("p.patch"))
    assert why in caught.value.what and caught.value.where == "p.patch:2"


def test_the_tree_is_checked_again_after_patch_ran(tmp_path: Path) -> None:
    """Whatever GNU patch made that the header check did not foresee (a link, a FIFO) stops the source
    before anything of it is hashed, chmodded or stored."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.cpp").write_text("int a;\n")
    check_patched_tree(tree, Path("p.patch"))
    os.symlink("/etc/passwd", tree / "sub" / "passwd")
    with pytest.raises(BadInput, match="sub/passwd in the source tree is a symlink"):
        check_patched_tree(tree, Path("p.patch"))
    os.unlink(tree / "sub" / "passwd")
    os.mkfifo(tree / "fifo")
    with pytest.raises(BadInput, match="fifo in the source tree is no regular file"):
        check_patched_tree(tree, Path("p.patch"))


def _context_diff(tmp_path: Path) -> str:
    """A real context diff (``diff -c a/data.txt b/data.txt``) of a source's data.txt."""
    work = tmp_path / "cdiff"
    for side, text in (("a", "one\ntwo\nthree\n"), ("b", "one\n2\nthree\nfour\n")):
        (work / side).mkdir(parents=True)
        (work / side / "data.txt").write_text(text)
    p = subprocess.run(["diff", "-c", "a/data.txt", "b/data.txt"], cwd=work, capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout.startswith("*** a/data.txt"), p
    return p.stdout


def test_a_legitimate_context_diff_applies(tmp_path: Path) -> None:
    """Attack on issue 34, smaller finding: a context diff's hunk range ``--- 1,4 ----`` was read as a file
    header, "the patch touches '1,4', outside the source tree" (a false refusal). Its ranges and separator are
    no headers; its ``***`` and ``---`` file headers are judged like a unified diff's."""
    text = _context_diff(tmp_path)
    assert "\n--- 1,4 ----\n" in text and "\n***************\n" in text
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.txt").write_text("one\ntwo\nthree\n")
    root = Root(tmp_path / "root")
    root.ensure()
    store = Store(root.store).open()
    patch = tmp_path / "ctx.patch"
    patch.write_text(text)
    tree = realize_source(root, store, Source("d", path=src, where="recipe.toml:3"), (patch,), Reporter(quiet=True))
    assert (tree.out(store) / "data.txt").read_text() == "one\n2\nthree\nfour\n"


@pytest.mark.parametrize("header", ["*** ../../outside/data.txt\t2024-01-01", "*** /etc/passwd", "--- a/../../x"])
def test_a_context_diff_leading_out_is_refused_at_its_header(tmp_path: Path, header: str) -> None:
    lines = _context_diff(tmp_path).splitlines()
    at = 0 if header.startswith("***") else 1
    lines[at] = header
    with pytest.raises(BadInput) as caught:
        check_patch("\n".join(lines) + "\n", Path("p.patch"))
    assert "outside the source tree" in caught.value.what and caught.value.where == f"p.patch:{at + 1}"


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap is not installed here")
def test_patch_in_the_sandbox_writes_its_staging_folder_though_the_store_is_read_only(tmp_path: Path) -> None:
    """Inside the sandbox the store is read-only (issue 41, F2); patch alone gets the staging folder of the
    entry it patches bound writable, and the patched tree is published as outside the sandbox. (Without that
    bind this failed: patch met EROFS in store/tmp.)"""
    from hermetic.sandbox import choose
    root, store, src = _source(tmp_path)
    patch = tmp_path / "change.patch"
    patch.write_text(_git_patch(tmp_path / "git", "echo 'int a2;' >> a.cpp"))
    sb = choose(root, "required", "--sandbox", tmp_path / "locks")
    assert sb.used and str(root.store) in sb.record()["read_only"]
    with sb.confined():
        tree = realize_source(root, store, src, (patch,), Reporter(quiet=True))
    out = store.entry_path(tree.entry) / "out"  # type: ignore[attr-defined]
    assert (out / "a.cpp").read_text() == "int a;\nint a2;\n"
