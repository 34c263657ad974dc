"""Bad records in archives (issue 34, item 5): every record an archive brings is checked against its TypedDict
(store/records.py's hand-written checks) before anything is published: a gc root that is no root record, an
entry record of the wrong shape, is exit 2 naming the archive and the member, and nothing is imported. A bad
gc root in the root is refused by export, naming the file (docs/layout.md: "A bad record")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermetic import fs
from tests.support.archives import ROOT, honest_records, write_archive
from tests.support.cli import Hermetic
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe


def _nothing_imported(root: Path) -> None:
    entries = root / "store" / "entries"
    assert not entries.exists() or not any(entries.iterdir())
    assert not (root / "roots").exists() or not any((root / "roots").iterdir())


def test_an_archives_gc_root_that_is_a_json_list_is_refused(tmp_path: Path, hermetic: Hermetic) -> None:
    """Before the fix it imported (exit 0) and every later `gc` ended in an internal error."""
    entries, blobs, _roots = honest_records()
    refs = [f"entry:{n}" for n in entries]
    archive = write_archive(tmp_path / "list-root.tar.zst", entries, blobs, {ROOT: json.dumps(refs).encode()})
    res = hermetic("import", archive)
    assert res.rc == 2, (res.rc, res.err)
    assert "list-root.tar.zst" in res.err and f"roots/{ROOT}.json" in res.err and "not an object" in res.err
    assert "nothing was imported" in res.err and "Traceback" not in res.err
    _nothing_imported(hermetic.root)
    assert hermetic("gc").rc == 0


def _drop(key: str) -> Any:
    def change(meta: dict[str, Any]) -> None:
        del meta[key]
    return change


@pytest.mark.parametrize(("kind", "change", "why"), [
    ("unpacked", _drop("filename"), "no 'filename'"),
    ("tree", lambda m: m.update(source={"name": 3}), "'source' is malformed"),
    ("tree", lambda m: m.update(refs="entry:x"), "'refs' is malformed"),
])
def test_an_entry_record_of_the_wrong_shape_is_refused(tmp_path: Path, hermetic: Hermetic, kind: str,
                                                       change: Any, why: str) -> None:
    entries, blobs, roots = honest_records()
    name = next(n for n, m in entries.items() if m["kind"] == kind)
    change(entries[name])
    archive = write_archive(tmp_path / "shape.tar.zst", entries, blobs, roots)
    res = hermetic("import", archive)
    assert res.rc == 2, (res.rc, res.err)
    assert why in res.err and name in res.err and "nothing was imported" in res.err, res.err
    _nothing_imported(hermetic.root)


def test_export_refuses_a_bad_gc_root_naming_it(tmp_path: Path, hermetic: Hermetic) -> None:
    """Before the fix a root that is a JSON list made export an internal error (a traceback)."""
    hermetic("import", write_archive(tmp_path / "ok.tar.zst", *honest_records()), check=True)
    bad = hermetic.root / "roots" / "broken.json"
    fs.atomic_write(bad, b'["entry:x"]\n')
    res = hermetic("export", tmp_path / "out.tar.zst")
    assert res.rc == 2, (res.rc, res.err)
    assert str(bad) in res.err and "gc root is bad" in res.err and "Traceback" not in res.err
    assert not (tmp_path / "out.tar.zst").exists()


def test_an_archives_gc_root_cannot_choose_what_repair_realizes(tmp_path: Path, hermetic: Hermetic,
                                                                index: LoopbackIndex) -> None:
    """Attack on issue 34, finding 6: an unsigned archive's gc root names any recipe path (here a real recipe
    the user never named), and `verify --repair` realized it after one blob was damaged. Now an imported root is
    marked with the archive it came from; repair warns that its recipe is the exporter's and realizes nothing of
    it. A realize of the recipe on this machine makes the root local again, and repair follows it then."""
    w = make_pkg(tmp_path / "whl", "evilpkg", "1.0")
    index.add(w.path)
    evil = write_recipe(tmp_path / "evilrepo", ROOT, pip_lock_line(w))
    entries, blobs, roots = honest_records()
    record = json.loads(roots[ROOT])
    record["recipe"] = str(evil)
    archive = write_archive(tmp_path / "evil.tar.zst", entries, blobs, {ROOT: fs.pretty_json(record)})
    hermetic("import", archive, check=True)

    def damage_a_blob() -> None:
        blob = next(p for p in (hermetic.root / "store" / "blobs").rglob("*") if p.is_file())
        blob.chmod(0o644)
        with blob.open("ab") as f:
            f.write(b"corrupt\n")

    def receipts_naming_evil() -> list[Path]:
        return [p for p in (hermetic.root / "receipts").glob("*.json") if str(evil) in p.read_text()]

    damage_a_blob()
    res = hermetic("verify", "--repair")
    assert not receipts_naming_evil(), res.err   # before the fix: the repair's receipt named evil.toml
    assert f"root {ROOT} came from an archive ({archive})" in res.err and "realize its recipe yourself" in res.err, \
        res.err
    assert "Traceback" not in res.err
    imported = json.loads((hermetic.root / "roots" / f"{ROOT}.json").read_text())
    assert imported["imported_from"] == str(archive) and imported["recipe"] == str(evil)
    # the user realizes it: the root is this machine's now, and repair follows it
    hermetic("realize", evil, check=True)
    assert "imported_from" not in json.loads((hermetic.root / "roots" / f"{ROOT}.json").read_text())
    before = len(receipts_naming_evil())
    damage_a_blob()
    res = hermetic("verify", "--repair")
    assert "came from an archive" not in res.err and len(receipts_naming_evil()) == before + 1, res.err
