"""The hand-written checks of records read back (hermetic/store/records.py, docs/layout.md "A bad record"):
every record hermetic writes passes its check, and a bad one is named, never used, and never hangs a reader."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from hermetic.errors import BadRecord
from hermetic.store.records import entry_problem, read_checked, receipt_problem, root_problem
from tests.support.builds import Project
from tests.support.trees import bad_records


def test_every_record_a_build_writes_passes_its_check(tmp_path: Path, shared_root: Path) -> None:
    """Unpacked wheels, trees (the toolchain's, a source tree, the environment's), objects (C++ and CUDA), a
    module, the gc root and the receipt of a real build: all pass, so a check never refuses an honest store."""
    Project(tmp_path / "p", "records", shared_root).realize()
    kinds = {json.loads(p.read_text())["kind"] for p in (shared_root / "store" / "entries").glob("*/meta.json")}
    assert kinds == {"unpacked", "tree", "object", "module"}
    assert bad_records(shared_root) == {}


ENTRY = {"format": 1, "name": "0" * 32 + "-x", "kind": "tree", "label": "x", "files": {}, "links": {}, "refs": []}


@pytest.mark.parametrize(("value", "why"), [
    ([], "JSON list, not an object"),
    ({**ENTRY, "kind": "planted"}, "kind 'planted' is none this store knows"),
    ({k: v for k, v in ENTRY.items() if k != "refs"}, "no 'refs'"),
    ({**ENTRY, "refs": "entry:x"}, "'refs' is malformed"),
    ({**ENTRY, "files": {"a": ["nothex", False]}}, "'files' is malformed"),
    ({**ENTRY, "links": {"a": 7}}, "'links' is malformed"),
    ({**ENTRY, "name": "1" * 32 + "-x"}, "names another entry"),
    ({**ENTRY, "format": True}, "'format' is malformed"),
])
def test_a_malformed_entry_record_is_said_why(value: object, why: str) -> None:
    found = entry_problem(value, str(ENTRY["name"]))
    assert found is not None and why in found, found
    assert entry_problem(ENTRY, str(ENTRY["name"])) is None


def test_roots_and_receipts_are_checked_for_what_gc_reads() -> None:
    entry = "entry:" + "0" * 32 + "-p2p"
    root = {"format": 1, "name": "p2p", "recipe": "/r/p2p.toml", "profile": "p2p", "refs": [entry, "blob:" + "a" * 64]}
    assert root_problem(root) is None
    assert "JSON list" in str(root_problem([[entry]]))          # the archive's root of the attack
    assert "'refs' is malformed" in str(root_problem({**root, "refs": [1]}))
    # a reference is an entry's or a blob's name, never a path (the outside attack on issue 35, finding 11)
    for ref in ("entry:x", "entry:../../../outside/victim", "entry:" + "0" * 32 + "-a/b", "blob:../x",
                "blob:" + "A" * 64, "wheel:" + "a" * 64, "entry:"):
        assert "'refs' is malformed" in str(root_problem({**root, "refs": [ref]})), ref
        assert "'refs' is malformed" in str(receipt_problem({"format": 1, "kind": "run", "refs": [ref]})), ref
    receipt = {"format": 1, "kind": "realize", "recipe": {"name": "p2p"}, "refs": []}
    assert receipt_problem(receipt) is None
    assert receipt_problem({"format": 1, "kind": "run", "refs": [entry]}) is None
    assert "names no recipe" in str(receipt_problem({"format": 1, "kind": "realize"}))
    assert "'kind'" in str(receipt_problem({"format": 1, "kind": "measurement"}))


def test_a_bad_record_is_named_and_no_reader_blocks_or_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"format": 1, "name": "n", "recipe": "r", "profile": "p", "refs": []}))
    cases = {"fifo.json": "a FIFO", "folder.json": "a folder", "link.json": "a symbolic link",
             "text.json": "not a readable JSON record", "list.json": "not an object", "big.json": "more than"}
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "link.json").symlink_to(outside)   # a sound record, but behind a link: never followed
    (tmp_path / "text.json").write_bytes(b"\x00\xff{")
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "big.json").write_text(" " * 5000 + "{}")
    for name, words in cases.items():
        done: list[BaseException] = []

        def read(path: Path = tmp_path / name, done: list[BaseException] = done) -> None:
            try:
                read_checked(path, root_problem, "gc root", limit=4096)
            except BaseException as e:  # handed to the test's thread
                done.append(e)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), f"reading {name} blocked"
        error = done[0]
        assert isinstance(error, BadRecord) and error.exit_code == 2, (name, error)
        assert error.where == str(tmp_path / name) and words in error.what, (name, error.what)
    with pytest.raises(FileNotFoundError):  # missing is not bad: the caller decides
        read_checked(tmp_path / "gone.json", root_problem, "gc root")
