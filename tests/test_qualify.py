"""The host's qualification guessed from torch's files while the probe imports torch (extensions/host.py), on real
torch: the guess is what the probe says on this host; a realize in a root that never qualified the interpreter
goes on with the guess and records the probe's confirmation; a probe that contradicts the guess (here a
sitecustomize that changes what torch reports, only in the probe's interpreter) starts the realize again with
the probe's answer; and a torch that does not import in the probe is the precondition error it always was,
with no object recorded."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from hermetic.extensions.host import HostFacts, _run_probe, guess_facts
from hermetic.root import Root
from tests.support import cli
from tests.support.cli import REPO, hermetic_env
from tests.support.recipes import recipe_toml

PLAIN = """\
#include <Python.h>
static struct PyModuleDef plain_module = {PyModuleDef_HEAD_INIT, "qual_ext", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_qual_ext(void) { return PyModule_Create(&plain_module); }
"""

# Runs at the start of every interpreter that has its folder on PYTHONPATH and site enabled; acts only in the
# qualification probe (the one child hermetic starts with `-c` and CUDA_HOME naming no-cuda).
SITECUSTOMIZE = """\
import os, sys
if sys.argv == ["-c"] and os.environ.get("CUDA_HOME", "").endswith("no-cuda"):
    {action}
"""


def _project(tmp_path: Path, name: str) -> Path:
    project = tmp_path / name
    (project / "src").mkdir(parents=True)
    (project / "src" / "plain.cpp").write_text(PLAIN)
    shutil.copy(REPO / "manifests" / "cuda-13.0-toolchain.txt", project)
    recipe = project / "recipe.toml"
    recipe.write_text(recipe_toml(name, toolchain=True, sources={"src": "src"}, jobs=2,
                                  extensions=['name = "qual_ext"\nsource = "src"\nsources = ["*.cpp"]']))
    return recipe


def _forget_the_host(root: Path) -> None:
    """The root has not qualified its interpreter (the session's shared root may have, in another test)."""
    shutil.rmtree(Root(root).cache_dir("interpreters"), ignore_errors=True)


def _site(tmp_path: Path, action: str) -> dict[str, str]:
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(action=action))
    return hermetic_env(extra={"PYTHONPATH": str(folder)})


def _objects(root: Path, name: str) -> list[str]:
    return sorted(p.name for p in (root / "store" / "entries").glob(f"*-obj-{name}*"))


def test_the_guess_is_what_the_probe_says(tmp_path: Path) -> None:
    root = Root(tmp_path / "root")
    root.ensure()
    exe = Path(os.path.abspath(sys.executable))
    guess = guess_facts(exe)
    found, output = _run_probe(root, exe)
    assert guess is not None and found is not None, output[-2000:]
    probed = HostFacts.from_json(found)
    assert guess.differences(probed) == [] and guess == probed and guess.to_json() == found
    assert guess.torch is not None and guess.torch.include and guess.torch.common_nvcc_flags
    # another interpreter than hermetic's own: no guess (its sysconfig is not this process's)
    other = shutil.which("python3.12") or shutil.which("python3.13")
    assert other is not None
    assert guess_facts(Path(other)) is None


def test_a_root_that_never_qualified_goes_on_with_the_guess(tmp_path: Path, shared_root: Path) -> None:
    _forget_the_host(shared_root)
    recipe = _project(tmp_path, "qualguess")
    res = cli.run(shared_root, "realize", recipe, "--json", env=hermetic_env())
    assert res.rc == 0, res.err[-3000:]
    receipt = json.loads(Path(str(res.result["receipt"])).read_text())
    assert receipt["qualification"]["from"] == "guess" and receipt["qualification"]["probe_s"] > 0
    assert "realizing again" not in res.err
    found, _output = _run_probe(Root(shared_root), Path(receipt["host"]["executable"]))
    assert found == receipt["host"]  # what the build used is what the probe says
    # the probe's answer is cached: the next build in this root neither guesses nor probes
    (recipe.parent / "src" / "plain.cpp").write_text(PLAIN + "// changed\n")
    again = cli.run(shared_root, "realize", recipe, "--json", env=hermetic_env())
    assert again.rc == 0, again.err[-3000:]
    assert json.loads(Path(str(again.result["receipt"])).read_text())["qualification"] == \
        {"from": "cache", "probe_s": None}


def test_a_guess_the_probe_contradicts_starts_the_realize_again(tmp_path: Path, shared_root: Path) -> None:
    _forget_the_host(shared_root)
    recipe = _project(tmp_path, "qualwrong")
    env = _site(tmp_path, 'os.environ["CXX"] = "g++-from-sitecustomize"')  # torch's get_cxx_compiler() says it
    try:
        res = cli.run(shared_root, "realize", recipe, "--json", env=env)
        assert res.rc == 0, res.err[-3000:]
        assert "differed from what torch's files said (torch.cxx): realizing again with the probe's answer" \
            in res.err
        receipt = json.loads(Path(str(res.result["receipt"])).read_text())
        assert receipt["qualification"]["from"] == "cache"  # the refuted attempt cached the probe's answer
        assert receipt["host"]["torch"]["cxx"] == "g++-from-sitecustomize"
        assert receipt["counts"]["objects_compiled"] == 1 and len(_objects(shared_root, "plain")) >= 1
    finally:
        _forget_the_host(shared_root)  # the answer holds only with that sitecustomize


def test_torch_that_does_not_import_in_the_probe_is_a_failed_precondition(tmp_path: Path,
                                                                        shared_root: Path) -> None:
    _forget_the_host(shared_root)
    recipe = _project(tmp_path, "qualnotorch")
    (recipe.parent / "src" / "plain.cpp").write_text(PLAIN + "// qualnotorch\n")
    before = _objects(shared_root, "plain")
    env = _site(tmp_path, 'sys.modules["torch"] = None')
    try:
        res = cli.run(shared_root, "realize", recipe, "--json", env=env)
        assert res.rc == 3, (res.rc, res.err[-3000:])
        assert "torch does not import in the host interpreter" in res.err
        assert _objects(shared_root, "plain") == before  # nothing recorded with the guess
    finally:
        _forget_the_host(shared_root)
