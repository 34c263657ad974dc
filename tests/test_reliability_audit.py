"""The outside-root audit (hermetic/audit.py): honest about what it sees (planted writes are reported, the
root is not), bounded, JSON-ready in a stable order; in every realize receipt, where a realize with HOME and
TMPDIR watched creates nothing outside the root and a child's real leak (a compiler flag writing into HOME)
is reported."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import hermetic.audit as audit_mod
from hermetic.audit import OutsideRootAudit
from tests.support import cli
from tests.support.cli import REPO
from tests.support.recipes import TOOLCHAIN_LOCK, recipe_toml
from tests.support.reliability import child_env


def _places(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    home, tmp, cwd, root = (tmp_path / n for n in ("home", "tmp", "cwd", "work/root"))
    for d in (home / ".cache" / "pip", home / ".config", tmp / "old", cwd, root):
        d.mkdir(parents=True)
    (home / ".config" / "tool.ini").write_text("a = 1\n")
    (home / ".bashrc").write_text("# rc\n")
    (tmp / "old" / "gone.txt").write_text("x")
    return home, tmp, cwd, root


def test_planted_writes_are_reported_and_the_root_is_not(tmp_path: Path) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd)
    audit.start()
    (home / ".cache" / "pip" / "http").mkdir()
    (home / ".cache" / "pip" / "http" / "blob").write_text("cached")  # a new folder: reported at its top
    (home / ".nv" / "ComputeCache").mkdir(parents=True)                # a watched folder that did not exist
    (home / ".leaky-tool").write_text("x")                              # a new top-level entry of HOME
    (home / ".config" / "tool.ini").write_text("a = 2\n")               # an existing file rewritten
    (tmp / "tmpxft_0001").write_text("nvcc")
    (tmp / "old" / "gone.txt").unlink()
    (cwd / "__pycache__").mkdir()
    (root / "store").mkdir()                                            # inside the root: not outside
    (root / "store" / "blob").write_text("fine")
    result = audit.finish()
    assert json.loads(json.dumps(result)) == result
    assert result["created"] == sorted([str(cwd / "__pycache__"), str(home / ".cache" / "pip" / "http"),
                                        str(home / ".leaky-tool"), str(home / ".nv" / "ComputeCache"),
                                        str(tmp / "tmpxft_0001")])
    assert result["changed"] == [str(home / ".config" / "tool.ini")]
    assert result["removed"] == [str(tmp / "old" / "gone.txt")]
    assert result["clean"] is False and result["complete"] is True
    assert result["counts"]["created"] == 5 and result["truncated"] == []
    assert str(home) in result["watched"] and str(root) not in " ".join(result["created"])


def test_nothing_written_is_clean_and_a_root_inside_a_watched_place_is_skipped(tmp_path: Path) -> None:
    home, tmp, _cwd, _root = _places(tmp_path)
    root = home / ".hermetic"  # a root inside HOME (and the current folder is HOME): it is not outside
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=home)
    audit.start()
    (root / "store" / "deep").mkdir(parents=True)  # creating the root itself is not a leak either
    (root / "store" / "deep" / "f").write_text("x")
    result = audit.finish()
    assert result["clean"] is True, result
    assert result["created"] == result["changed"] == result["removed"] == []
    assert result["watched"].count(str(home)) == 1  # HOME and the current folder are one place


def test_a_place_past_the_entry_budget_is_reported_as_truncated(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    for i in range(50):
        (tmp / f"f{i}").write_text("x")
    monkeypatch.setattr(audit_mod, "MAX_ENTRIES", 20)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd)
    audit.start()
    (cwd / "new").write_text("x")
    result = audit.finish()
    assert result["truncated"] == [str(tmp)] and result["complete"] is False
    assert result["created"] == [str(cwd / "new")]  # the places within budget are still seen whole


def test_the_default_places_and_the_cost(tmp_path: Path) -> None:
    audit = OutsideRootAudit(tmp_path / "root")
    audit.start()
    result = audit.finish()
    home = os.environ.get("HOME") or os.path.expanduser("~")
    for place in (os.path.realpath(home), "/tmp", os.path.realpath(os.getcwd())):
        assert place in result["watched"]
    assert result["counts"]["entries_walked"] <= 2 * len(result["watched"]) * audit_mod.MAX_ENTRIES
    print(f"default audit: {len(result['watched'])} places, {result['counts']['entries_walked']} entries, "
          f"{result['seconds']} s")


MODULE = """#include <Python.h>
static PyModuleDef d = {PyModuleDef_HEAD_INIT, "audit_ext", 0, -1, 0};
PyMODINIT_FUNC PyInit_audit_ext(void) { return PyModule_Create(&d); }
"""


def _realize_build(tmp_path: Path, root: Path, name: str, cflags: str) -> tuple[dict[str, object], Path, Path]:
    folder = tmp_path / name
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "m.cpp").write_text(MODULE)
    shutil.copy(TOOLCHAIN_LOCK, folder)
    (folder / "recipe.toml").write_text(recipe_toml(
        name, toolchain=True, sources={"s": "src"}, jobs=2,
        extensions=[f'name = "audit_ext"\nsource = "s"\nsources = ["*.cpp"]\ncflags = [{cflags}]']))
    home, tmp = tmp_path / f"{name}-home", tmp_path / f"{name}-tmp"
    env = child_env(home, tmp)
    cwd = tmp_path / f"{name}-cwd"
    cwd.mkdir()
    p = cli.run(root, "realize", folder / "recipe.toml", "--json", env=env, cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    receipt = json.loads(Path(json.loads(p.stdout.splitlines()[-1])["receipt"]).read_text())
    return receipt["outside_root_audit"], home, tmp


def test_a_build_writes_nothing_outside_and_a_leaking_flag_is_reported(tmp_path: Path, shared_root: Path) -> None:
    audit, home, tmp = _realize_build(tmp_path, shared_root, "auditclean", "")
    assert str(home) in audit["watched"] and str(tmp) in audit["watched"]  # type: ignore[operator]
    mine = [p for p in audit["created"] + audit["changed"] + audit["removed"]  # type: ignore[operator]
            if p.startswith((str(home), str(tmp), str(tmp_path)))]
    assert mine == [], mine  # compilers, the import check and their caches all wrote inside the root
    # a recipe flag that makes g++ write its temporaries into HOME: a real child leaking; the receipt says so
    leak_home = tmp_path / "auditleak-home"
    audit, home, _tmp = _realize_build(tmp_path, shared_root, "auditleak",
                                       f'"-save-temps", "-dumpdir", "{leak_home}/leak-"')
    assert sorted(p for p in audit["created"] if p.startswith(str(home))) == [  # type: ignore[union-attr]
        str(home / "leak-m.ii"), str(home / "leak-m.s")]
    assert audit["clean"] is False
    assert (home / "leak-m.ii").exists() and REPO.exists()
