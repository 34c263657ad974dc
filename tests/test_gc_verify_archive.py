"""gc with roots, verify and repair, export and import (with a damaged archive)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.cli import Hermetic
from tests.support.index import LoopbackIndex, dead_url
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe
from tests.support.trees import tree_snapshot


def _two_recipes(tmp_path: Path, index: LoopbackIndex) -> tuple[Path, Path]:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    b = make_pkg(tmp_path / "whl", "beta", "1.0")
    c = make_pkg(tmp_path / "whl", "gamma", "1.0")
    index.add(a.path, b.path, c.path)
    r1 = write_recipe(tmp_path / "r1", "one", pip_lock_line(a) + pip_lock_line(b))
    r2 = write_recipe(tmp_path / "r2", "two", pip_lock_line(b) + pip_lock_line(c))
    return r1, r2


def _entries(root: Path) -> set[str]:
    return {p.name for p in (root / "store" / "entries").iterdir()}


def test_gc_drops_exactly_the_unreachable(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    r1, r2 = _two_recipes(tmp_path, index)
    hermetic("realize", r1, check=True)
    only_one = _entries(hermetic.root)
    hermetic("realize", r2, check=True)
    everything = _entries(hermetic.root)
    # entries of "two" that "one" does not share: its tree and gamma's unpacked entry
    expected = everything - only_one
    assert len(expected) == 2
    dry = hermetic("gc", "--drop-root", "two", "--dry-run", "--json", check=True)
    result = json.loads(dry.out.splitlines()[-1])
    assert set(result["dead_entries"]) == expected
    assert _entries(hermetic.root) == everything  # a dry run deletes nothing
    res = hermetic("gc", "--drop-root", "two", "--json", check=True)
    result = json.loads(res.out.splitlines()[-1])
    assert set(result["dead_entries"]) == expected and result["freed_bytes"] > 0
    assert _entries(hermetic.root) == only_one
    assert hermetic("verify", check=True).rc == 0
    assert not (hermetic.root / "profiles" / "two").exists()
    assert (hermetic.root / "profiles" / "one" / "alpha" / "__init__.py").exists()
    hermetic("gc", "--all", check=True)
    assert not hermetic.root.exists()


def test_a_realize_killed_before_its_receipt_after_gc_dropped_the_last_one_is_no_no_op(
        tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    """The crash lab's "receipt" phase on a root gc --drop-root emptied: the killed realize had put the entries
    and the root back, but neither its receipt nor its record of what it realized (the realize cache), so the
    record left is the one before gc, naming a receipt gc removed. The next realize is no no-op on that record
    (it would answer with a missing receipt): it realizes again and writes one."""
    r1, _ = _two_recipes(tmp_path, index)
    first = json.loads(hermetic("realize", r1, "--json", check=True).out.splitlines()[-1])
    records = hermetic.root / "state" / "realize-v1"
    before_gc = {p: p.read_bytes() for p in records.rglob("*") if p.is_file()}
    hermetic("gc", "--drop-root", "one", check=True)
    assert not Path(first["receipt"]).exists()
    killed = json.loads(hermetic("realize", r1, "--json", check=True).out.splitlines()[-1])
    os.unlink(killed["receipt"])  # the kill came before the receipt...
    for p in records.rglob("*"):  # ...and before its record: the one from before gc is what is left
        if p.is_file():
            p.unlink()
    for p, data in before_gc.items():
        p.write_bytes(data)
    again = json.loads(hermetic("realize", r1, "--json", check=True).out.splitlines()[-1])
    assert Path(again["receipt"]).is_file()
    assert json.loads(hermetic("realize", r1, "--json", check=True).out.splitlines()[-1])["receipt"] == \
        again["receipt"]  # and then a no-op again, naming that receipt


def test_drop_root_forgets_a_recipes_variants_and_no_other_recipe(tmp_path: Path, hermetic: Hermetic,
                                                                   index: LoopbackIndex) -> None:
    """`gc --drop-root NAME` forgets the recipe whole: its variants' roots, profiles and receipts too (roots of
    the same recipe file); a recipe of another file whose name starts with `NAME.` is left alone."""
    r1, r2 = _two_recipes(tmp_path, index)
    r1.write_text(r1.read_text() + '\n[variants.main]\n\n[variants.extra]\ndefault = false\n')
    r2.write_text(r2.read_text().replace('name = "two"', 'name = "one.other"'))
    hermetic("realize", r1, check=True)
    hermetic("realize", r1, "--variant", "extra", check=True)
    hermetic("realize", r2, check=True)
    other = _entries(hermetic.root)
    roots = hermetic.root / "roots"
    assert {p.name for p in roots.iterdir()} == {"one.json", "one.extra.json", "one.other.json"}
    res = hermetic("gc", "--drop-root", "one", "--json", check=True)
    assert {p.name for p in roots.iterdir()} == {"one.other.json"}
    assert json.loads(res.out.splitlines()[-1])["dropped"] == ["one", "one.extra", "one.toolchain"]
    assert os.listdir(hermetic.root / "profiles") == ["one.other"]
    receipts = [json.loads(p.read_text())["recipe"]["name"] for p in (hermetic.root / "receipts").iterdir()]
    assert receipts == ["one.other"]
    assert _entries(hermetic.root) < other and hermetic("verify").rc == 0
    assert (hermetic.root / "profiles" / "one.other" / "gamma" / "__init__.py").exists()


def test_gc_keeps_what_a_root_reaches(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    r1, _ = _two_recipes(tmp_path, index)
    hermetic("realize", r1, check=True)
    before = _entries(hermetic.root)
    res = hermetic("gc", "--json", check=True)
    assert json.loads(res.out.splitlines()[-1])["dead_entries"] == []
    assert _entries(hermetic.root) == before


def test_verify_finds_a_flipped_byte_and_repair_refetches(tmp_path: Path, hermetic: Hermetic,
                                                          index: LoopbackIndex) -> None:
    r1, _ = _two_recipes(tmp_path, index)
    hermetic("realize", r1, check=True)
    target = hermetic.root / "profiles" / "one" / "alpha" / "include" / "h1.h"
    os.chmod(target, 0o644)
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01
    target.write_bytes(bytes(data))
    os.chmod(target, 0o444)
    res = hermetic("verify", "--json")
    assert res.rc == 1
    problems = json.loads(res.out.splitlines()[-1])["problems"]
    assert any(p["kind"] == "blob" for p in problems)
    res = hermetic("verify", "--repair", "--json")
    assert res.rc == 0, res.err
    assert target.read_text().startswith("#define H1 1")


def test_export_import_air_gapped(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    r1, _ = _two_recipes(tmp_path, index)
    hermetic("realize", r1, check=True)
    archive = tmp_path / "closure.tar.zst"
    bad = hermetic("export", archive, "--level", "23")
    assert bad.rc == 2 and "zstd level" in bad.err and not archive.exists()
    hermetic("export", archive, "--level", "3", check=True)
    other = tmp_path / "other-root"
    offline = {"PIP_INDEX_URL": dead_url()}
    res = hermetic("import", archive, "--trust-unsigned", root=other, env=offline, check=True)
    assert "imported" in res.err
    served = len(index.state.requests)
    res = hermetic("realize", r1, "--json", root=other, env=offline, check=True)
    result = json.loads(res.out.splitlines()[-1])
    assert result["counts"]["fetched"] == 0 and result["counts"]["unpacked"] == 0
    assert len(index.state.requests) == served
    snap = tree_snapshot(other / "profiles" / "one")
    hermetic("realize", r1, root=other, env=offline, check=True)
    assert tree_snapshot(other / "profiles" / "one") == snap
    assert hermetic("verify", root=other, check=True).rc == 0


def test_export_stream_puts_similar_bytes_together() -> None:
    """The largest binaries first, largest first (cicc beside libnvvm, ptxas beside nvlink), then the
    small files grouped by extension and path: what zstd's window can match is what sits close."""
    from hermetic.store.archive import BIG_BLOB, stream_order
    blobs = {"c1": "nvvm/bin/cicc", "n1": "lib/libnvvm.so.4", "p1": "bin/ptxas", "h2": "include/b.h",
             "h1": "include/a.h", "x1": "include/c.hpp", "t1": "bin/tiny"}
    sizes = {"c1": 76 * BIG_BLOB, "n1": 63 * BIG_BLOB, "p1": 37 * BIG_BLOB, "h2": 10, "h1": 900, "x1": 5,
             "t1": 7}
    assert stream_order(blobs, sizes) == ["c1", "n1", "p1", "t1", "h1", "h2", "x1"]


def _flipped(data: bytes, pos: int) -> bytes:
    out = bytearray(data)
    out[pos] ^= 0x40
    return bytes(out)


def _decoded(data: bytes) -> bytes | None:
    """The archive's content as zstd decodes it whole (its checksum checked), None if it cannot."""
    import io

    import zstandard
    try:
        with zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(io.BytesIO(data)) as r:
            return r.read()
    except zstandard.ZstdError:
        return None


def test_import_refuses_a_flipped_byte(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    r1, _ = _two_recipes(tmp_path, index)
    hermetic("realize", r1, check=True)
    archive = tmp_path / "closure.tar.zst"
    hermetic("export", archive, check=True)
    good = archive.read_bytes()
    # the first byte from the middle on whose flip changes what the archive holds: some bits of a zstd frame
    # do not (a Huffman or FSE description that decodes alike), and an archive that holds the same bytes is
    # rightly imported (about 1 flip in 500 on this archive, the flaky case this loop excludes)
    pos = next(p for p in range(len(good) // 2, len(good)) if _decoded(_flipped(good, p)) != _decoded(good))
    archive.write_bytes(_flipped(good, pos))
    other = tmp_path / "other-root"
    res = hermetic("import", archive, root=other)
    assert res.rc == 2 and "Traceback" not in res.err and "closure.tar.zst" in res.err, (pos, res.err)
    entries = other / "store" / "entries"
    assert not entries.exists() or not any(entries.iterdir())
    blobs = other / "store" / "blobs"
    assert not blobs.exists() or not any(blobs.iterdir())
