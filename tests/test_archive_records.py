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
