"""Containment by construction (issue 34, item 1): a tree is checked as a whole before anything of it is
written, and laid out through folder descriptors that never pass a symlink, so no archive's tree record can
make hermetic delete, replace or chmod a file outside the root. Honest trees keep their links.

The archives are crafted with consistent manifests and tree names (tests/support/archives.py): import judges
the tree's shape alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hermetic import fs
from hermetic.store.trees import tree_problem
from tests.support.archives import climbing_links, tree_archive
from tests.support.cli import Hermetic

DIGEST = "0" * 64


def _decoy(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, int, bytes]]]:
    """A folder outside the root with a file in it, and what it is now (mode, type, bytes) for each path."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "precious.txt").write_text("the user's file\n")
    return decoy, _state(decoy)


def _state(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for p in [folder, *sorted(folder.rglob("*"))]:
        st = os.lstat(p)
        out[str(p)] = (st.st_mode, st.st_ino, p.read_bytes() if stat.S_ISREG(st.st_mode) else b"")
    return out


def _nothing_imported(root: Path) -> None:
    entries = root / "store" / "entries"
    assert not entries.exists() or not any(entries.iterdir())
    assert not (root / "roots").exists() or not any((root / "roots").iterdir())


def test_an_archive_whose_links_chain_through_each_other_touches_nothing_outside(tmp_path: Path,
                                                                                 hermetic: Hermetic) -> None:
    """The attack of issue 34: ``a/b -> ..`` then a link laid out through it, ``a/b/a/b/a/b/a/c``, whose own
    ``..`` count stays below its depth and which climbs, physically, from the staging folder to this test's
    folder; a third link at ``…/a/c/decoy/precious.txt``. Before the fix, import (exit 0) deleted the decoy's
    file, put a symlink in its place and chmodded the folder 0555. The staging tree lies at
    ROOT/store/tmp/entry-*/out, six folders below tmp_path from out/a."""
    decoy, before = _decoy(tmp_path)
    archive = tree_archive(tmp_path / "chain.tar.zst", climbing_links(6, "decoy/precious.txt"))
    res = hermetic("import", archive, "--json")
    assert res.rc == 2, (res.rc, res.err)
    assert "Traceback" not in res.err and "chain.tar.zst" in res.err and "nothing was imported" in res.err
    assert "through its symlink 'a/b'" in res.err
    assert _state(decoy) == before
    assert stat.S_IMODE(os.lstat(tmp_path).st_mode) & 0o200
    _nothing_imported(hermetic.root)


def test_a_link_leading_out_through_another_link_is_refused(tmp_path: Path, hermetic: Hermetic) -> None:
    """Each link on its own stays inside (``..`` no more than its depth), and nothing is laid out through a
    link, but ``E -> L/../../..`` passes ``L``, which leads to the tree's top: E points three folders above it.
    Before the fix the tree was imported (exit 0) with E leading out of the store."""
    links = {"m/n/o/L": "../../..", "m/n/o/E": "L/../../.."}
    archive = tree_archive(tmp_path / "through.tar.zst", links)
    res = hermetic("import", archive)
    assert res.rc == 2, (res.rc, res.err)
    assert "m/n/o/E" in res.err and "leaves the tree through its other symlinks" in res.err
    assert "Traceback" not in res.err
    _nothing_imported(hermetic.root)


def test_honest_links_still_import_and_lie_inside_their_tree(tmp_path: Path, hermetic: Hermetic) -> None:
    """The toolchain's links (``lib64 -> lib``, ``libcudart.so -> libcudart.so.13``), a link to a folder
    through a sibling link and one to the tree's own top keep working."""
    links = {"nvidia/cu13/lib64": "lib", "nvidia/cu13/lib/libcudart.so": "libcudart.so.13",
             "nvidia/cu13/lib/up": "../../..", "nvidia/cu13/cudart": "lib64/libcudart.so"}
    archive = tree_archive(tmp_path / "honest.tar.zst", links,
                           {"nvidia/cu13/lib/libcudart.so.13": b"\x7fELF not really\n"})
    hermetic("import", archive, check=True)
    tree = next(p for p in (hermetic.root / "store" / "entries").iterdir() if p.name.endswith("-crafted")
                and (p / "out").is_dir())
    out = tree / "out"
    assert os.readlink(out / "nvidia/cu13/lib64") == "lib"
    assert (out / "nvidia/cu13/cudart").read_bytes() == b"\x7fELF not really\n"
    assert Path(os.path.realpath(out / "nvidia/cu13/lib/up")) == out.resolve()
    for d in ("", "nvidia", "nvidia/cu13", "nvidia/cu13/lib"):  # every folder read-only, the links untouched
        assert stat.S_IMODE(os.lstat(out / d).st_mode) == 0o555
    assert hermetic("verify").rc == 0


@pytest.mark.parametrize(("files", "links", "why"), [
    ({}, {"a/b": "..", "a/b/c": "x"}, "through its symlink 'a/b'"),
    ({"lib/x.h": DIGEST}, {"lib": "inc"}, "through its symlink 'lib'"),
    ({}, {"x": "y", "y": "x"}, "leaves the tree through"),                 # a loop
    ({}, {"x": "/etc"}, "leaves the tree"),
    ({}, {"d/x": "../.."}, "leaves the tree"),
    ({"a": DIGEST}, {"a": "b"}, "both a file and a symlink"),
    ({"a": DIGEST, "a/b": DIGEST}, {}, "both a file and a folder"),
    ({"a/../b": DIGEST}, {}, "not a plain relative path"),
    ({}, {"p/q/L": "../..", "p/q/E": "L/.."}, "leaves the tree through"),
])
def test_a_tree_is_judged_as_a_whole(files: dict[str, str], links: dict[str, str], why: str) -> None:
    assert why in (tree_problem(files, links) or "")


def test_a_hostile_shape_is_judged_in_bounded_time() -> None:
    """Deep paths, many links and long targets (what fits a record of an archive) are judged in about a second:
    no list of every ancestor, a trie of the links, a budget of steps."""
    import time
    deep = "/".join(["d"] * 1000)
    files = {f"{deep}/f{i}": DIGEST for i in range(2000)}
    links = {f"l{i}": "/".join(["x"] * 2000) for i in range(400)}
    links.update({"x": ".", "lp": "/".join(["x"] * 2047)})
    start = time.monotonic()
    why = tree_problem(files, links)
    assert time.monotonic() - start < 5, why
    chain = {f"c{i}": f"c{i + 1}" for i in range(2000)}
    start = time.monotonic()
    assert "leaves the tree through" in (tree_problem({}, chain) or "")   # past 40 hops: a loop to the kernel
    assert time.monotonic() - start < 5


def test_the_toolchains_links_pass() -> None:
    files = {"nvidia/cu13/lib/libcudart.so.13": DIGEST, "nvidia/cu13/bin/nvcc": DIGEST}
    assert tree_problem(files, {"nvidia/cu13/lib64": "lib", "nvidia/cu13/lib/libcudart.so": "libcudart.so.13"}) \
        is None


def test_the_tree_writer_never_passes_a_link_even_one_it_was_not_told_about(tmp_path: Path) -> None:
    """The second line of defence: below the checks, every folder is opened with O_NOFOLLOW, so a link that
    is already there (planted, or a check that missed one) stops the layout instead of leading it outside."""
    decoy, before = _decoy(tmp_path)
    top = tmp_path / "tree"
    top.mkdir()
    os.symlink(str(decoy), top / "a")
    blob = tmp_path / "blob"
    blob.write_bytes(b"x")
    with pytest.raises(OSError), fs.TreeWriter(top) as writer:
        writer.link("a/precious.txt", str(blob))
    with pytest.raises(OSError), fs.TreeWriter(top) as writer:
        writer.symlink("a/new", "pwned")
    fs.make_tree_readonly(top)
    assert _state(decoy) == before
    fs.remove_tree(top)
    assert _state(decoy) == before and not top.exists()
