"""The import check (extensions/importcheck.py) with its interpreter started early, on real torch: a profile laid
out (or switched to another tree) after the interpreter started is the one imported; a check not needed stops
the interpreter and leaves nothing behind; a module that does not import fails the check; and a realize killed
while the early interpreter waits leaves no process of it alive."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hermetic.errors import WorkFailed
from hermetic.extensions.context import build_env
from hermetic.extensions.importcheck import ImportCheck
from hermetic.root import Root
from tests.support import cli
from tests.support.builds import DATA, Project, joint_recipe
from tests.support.cli import REPO, hermetic_env
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, recipe_toml
from tests.support.reliability import kill_and_reap, live_commands, survivors


def _root(tmp_path: Path) -> Root:
    root = Root(tmp_path / "root")
    root.ensure()
    return root


def _check(root: Root, profile: Path) -> ImportCheck:
    return ImportCheck(root, sys.executable, profile, build_env(root, None))


def _tree(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "checkmod.py").write_text(body)
    return folder


def _wait_for(pred: Callable[[], object], limit_s: float = 60.0) -> None:
    end = time.monotonic() + limit_s
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_an_early_interpreter_imports_the_profile_as_it_is_when_asked(tmp_path: Path) -> None:
    root = _root(tmp_path)
    profile = root.profiles / "p"
    check = _check(root, profile)
    check.start()  # the profile does not exist yet
    old = _tree(tmp_path / "old", "raise ImportError('the old tree was imported')\n")
    os.symlink(old, profile)
    time.sleep(4)  # torch imported meanwhile (or nearly): the finder of the profile's path has been asked
    new = _tree(tmp_path / "new", "import torch\nVALUE = 3\n")
    os.unlink(profile)
    os.symlink(new, profile)
    result = check.run(["checkmod"], "tree-1", profile)
    assert result["modules"] == ["checkmod"] and result["started_early"] is True
    assert result["cuda_initialized"] is False and result["system_cuda"] == []
    assert result["torch_import_s"] > 0
    assert list(root.tmp.glob("import-check-*")) == [] and survivors(root.path) == []
    # once per tree: the same tree again starts nothing
    again = _check(root, profile)
    again.start()
    assert again.run(["checkmod"], "tree-1", profile) == result
    assert list(root.tmp.glob("import-check-*")) == [] and survivors(root.path) == []


def test_a_check_not_needed_stops_its_interpreter(tmp_path: Path) -> None:
    root = _root(tmp_path)
    check = _check(root, root.profiles / "p")
    check.start()
    _wait_for(lambda: survivors(root.path))  # the interpreter is importing torch
    began = time.monotonic()
    check.cancel()
    assert time.monotonic() - began < 5
    assert survivors(root.path) == [] and list(root.tmp.glob("import-check-*")) == []
    # cancelled before it ran at all: nothing to stop, nothing left
    idle = _check(root, root.profiles / "p")
    idle.cancel()
    assert survivors(root.path) == []


def test_a_module_that_does_not_import_fails_the_check(tmp_path: Path) -> None:
    root = _root(tmp_path)
    profile = root.profiles / "p"
    _tree(tmp_path / "t", "raise ImportError('undefined symbol: _ZN5hello')\n")
    os.symlink(tmp_path / "t", profile)
    with pytest.raises(WorkFailed) as e:
        _check(root, profile).run(["checkmod"], "tree-2", profile)
    assert "importing checkmod together failed" in str(e.value) and "undefined symbol: _ZN5hello" in str(e.value)
    assert root.cache("imports").get("tree-2") is None
    assert survivors(root.path) == [] and list(root.tmp.glob("import-check-*")) == []


def test_a_realize_killed_while_the_early_interpreter_waits_leaves_nothing_running(tmp_path: Path,
                                                                                  shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "jointk", shared_root, sources=DATA / "joint_src",
                   recipe=joint_recipe("jointk", heavy_parts=6))
    proc = cli.popen(shared_root, "realize", proj.recipe, "--json", env=dict(os.environ))
    assert proc.stdout is not None
    for line in proc.stdout:  # the compiles have started, the check's interpreter beside them
        if '"compiling"' in line and json.loads(line).get("phase") == "compiling":
            break
    gate = f"{shared_root}/tmp/import-check-".encode()
    _wait_for(lambda: any(gate in cmd for cmd in live_commands().values()))
    outlived, _waited = kill_and_reap(proc.pid, shared_root)
    proc.wait()
    assert outlived == []


PLAIN = """\
#include <Python.h>
static struct PyModuleDef plain_module = {PyModuleDef_HEAD_INIT, "plain_ext", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_plain_ext(void) { return PyModule_Create(&plain_module); }
"""


def test_a_profile_with_wheels_of_its_own_starts_the_check_after_them(tmp_path: Path, shared_root: Path,
                                                                       index: LoopbackIndex) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "plain.cpp").write_text(PLAIN)
    shutil.copy(REPO / "manifests" / "cuda-13.0-toolchain.txt", project)
    wheel = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(wheel.path)
    (project / "env.txt").write_text(pip_lock_line(wheel))
    recipe = project / "recipe.toml"
    recipe.write_text(recipe_toml("withwheels", locks=["env.txt"], toolchain=True, sources={"src": "src"}, jobs=2,
                                  extensions=['name = "plain_ext"\nsource = "src"\nsources = ["*.cpp"]']))
    res = cli.run(shared_root, "realize", recipe, "--json", env=hermetic_env(extra={"PIP_INDEX_URL": index.simple_url}))
    assert res.rc == 0, res.err[-3000:]
    check = json.loads(Path(str(res.result["receipt"])).read_text())["import_check"]
    assert check["modules"] == ["plain_ext"] and check["started_early"] is False
