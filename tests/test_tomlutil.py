"""The strict TOML helpers (hermetic.tomlutil): syntax errors, line numbers of keys, validators."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.tomlutil import check_keys, expect_type, get_key, load_toml


def write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).removeprefix("\n"))
    return path


def test_toml_syntax_errors_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'a = 1\n[t]\nb = "unterminated\nc = 2\n', "x.toml")
    with pytest.raises(BadInput) as info:
        load_toml(path)
    assert info.value.where == f"{path}:3" and "invalid TOML" in info.value.what
    assert "(at line" not in info.value.what and "column" in (info.value.hint or "")
    path = write(tmp_path, "a = [1,\n2,\n", "y.toml")
    with pytest.raises(BadInput) as info:
        load_toml(path)
    assert info.value.where is not None and info.value.where.startswith(f"{path}:")


def test_toml_missing_and_non_utf8(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="not found"):
        load_toml(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_bytes(b'a = 1\nb = "\xff"\n')
    with pytest.raises(BadInput, match="UTF-8") as info:
        load_toml(tmp_path / "bad.toml")
    assert info.value.where == f"{tmp_path / 'bad.toml'}:2"


def test_toml_where_follows_structure(tmp_path: Path) -> None:
    doc = load_toml(write(tmp_path, '''
        s = """
        [fake]
        x = 1
        """
        dotted.key = { inner = [1, 2], t = { u = 'v' } }
        "quoted key" = 1

        [[p]]
        name = "first"
        [[p]]
        name = "second"   # comment
        arr = [
          { k = 1 },
          { k = 2 },
        ]
        [p.sub]
        deep = 1
        [[p.items]]
        z = 1
        [[p.items]]
        z = 2
        [other]
        ''', "w.toml"))
    lines = {k: doc.line_of(*k) for k in [("s",), ("fake",), ("dotted", "key", "t", "u"), ("quoted key",),
                                         ("p", 0, "name"), ("p", 1, "name"), ("p", 1, "arr", 1, "k"),
                                         ("p", 1, "sub", "deep"), ("p", 1, "items", 1, "z"), ("other",),
                                         ("p", 1, "missing")]}
    assert lines == {("s",): 1, ("fake",): None, ("dotted", "key", "t", "u"): 5, ("quoted key",): 6,
                     ("p", 0, "name"): 9, ("p", 1, "name"): 11, ("p", 1, "arr", 1, "k"): 14,
                     ("p", 1, "sub", "deep"): 17, ("p", 1, "items", 1, "z"): 21, ("other",): 22,
                     ("p", 1, "missing"): 10}
    assert doc.where("p", 1, "arr", 0) == f"{tmp_path / 'w.toml'}:13: key p[1].arr[0]"
    assert doc.where("nowhere", "x") == f"{tmp_path / 'w.toml'}: key nowhere.x"


def test_toml_validators(tmp_path: Path) -> None:
    doc = load_toml(write(tmp_path, '[t]\nname = "x"\ncount = "3"\nflag = true\ntypo = 1\n', "v.toml"))
    table = doc.data["t"]
    with pytest.raises(BadInput) as info:
        check_keys(doc, table, {"name", "count", "flag"}, ("t",))
    assert info.value.where == f"{doc.path}:5: key t.typo" and "'typo'" in info.value.what
    assert "count, flag, name" in (info.value.hint or "")
    with pytest.raises(BadInput) as info:
        expect_type(doc, table["count"], int, ("t", "count"))
    assert info.value.where == f"{doc.path}:3: key t.count"
    assert "must be an integer, found a string" in info.value.what
    with pytest.raises(BadInput, match="must be an integer, found a boolean"):
        expect_type(doc, table["flag"], int, ("t", "flag"))
    assert expect_type(doc, table["name"], str, ("t", "name")) == "x"
    with pytest.raises(BadInput, match="missing required key 'size' in \\[t\\]") as info:
        get_key(doc, table, "size", int, ("t",), required=True)
    assert info.value.where == f"{doc.path}:1: key t.size"
    assert get_key(doc, table, "size", int, ("t",)) is None
