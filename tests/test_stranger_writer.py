"""Issue 41 (outside attack, F4): the recipe ``recipe new`` writes holds text a stranger's setup.py chose (the
names of the variables it read, the URLs it tried, its cmdclass, its functions' names, its define names, the
sdist's file name). None of it can add a table or a key: every value and key goes through one encoder, every
comment is one line, and the text is parsed back and compared with what the writer meant."""

from __future__ import annotations

import os
import random
import tomllib
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.extensions.derive import RecipeText, check_written, comment, toml_key, toml_str
from hermetic.recipe import load_recipe
from tests.support import cli
from tests.support.cli import REPO
from tests.test_stranger import FILES, make_sdist

INJECT = '\n[limits]\nsandbox = "off"\n[remote]\nurl = "http://127.0.0.1:9/"\nmode = "rw"\n#'

HOSTILE_SETUP_PY = f"""\
import os
import urllib.request

from setuptools import Command, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

os.environ.get({"BUILD_OPT" + INJECT!r})
try:
    urllib.request.urlopen({"http://127.0.0.1:9/x" + INJECT!r})
except Exception:
    pass


def mk():
    return CUDAExtension("minipkg._ops_cuda", ["csrc/ops.cpp"], include_dirs=["csrc"],
                         define_macros=[("MINI_SCALE", "10")])


mk.__code__ = mk.__code__.replace(co_name={"mk" + INJECT!r})
Evil = type({"Evil" + INJECT!r}, (Command,), {{"run": lambda self: None}})
setup(name="minipkg", version="0.1", packages=["minipkg", "minipkg.util"],
      ext_modules=[mk()], cmdclass={{"build_ext": BuildExtension, {"evil" + INJECT!r}: Evil}})
"""


def _recipe_new(root: Path, sdist: Path, out: Path) -> cli.Result:
    out.parent.mkdir(parents=True, exist_ok=True)
    return cli.run(root, "recipe", "new", sdist, "--lock", "cuda-13.0-toolchain.txt", "-o", out,
                   env=dict(os.environ))


def test_text_from_setup_py_adds_no_table_or_key_to_the_recipe(tmp_path: Path, shared_root: Path) -> None:
    """Newlines and quotes in an environment variable's name, a refused URL, a cmdclass key and class name, a
    function's name and the sdist's file name stay inside their comments: the recipe has no [limits], no
    [remote], one extension, and loads."""
    made, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": HOSTILE_SETUP_PY})
    sdist = made.with_name("minipkg-0.1" + INJECT.replace("/", "_") + ".tar.gz")
    made.rename(sdist)
    recipe = tmp_path / "p" / "recipe.toml"
    r = _recipe_new(shared_root, sdist, recipe)
    assert r.rc == 0, r.err[-3000:]
    text = recipe.read_text()
    data = tomllib.loads(text)
    assert sorted(data) == ["extensions", "package", "recipe", "sources", "toolchain"], text
    assert [e["name"] for e in data["extensions"]] == ["minipkg._ops_cuda"]
    assert data["extensions"][0]["defines"] == {"MINI_SCALE": "10"}
    headers = [ln for ln in text.splitlines() if ln.startswith("[")]
    assert [h.split("#")[0].strip() for h in headers] == [
        "[recipe]", "[toolchain]", "[sources.minipkg]", "[package]", "[[extensions]]"], headers
    # each injected text is in the recipe, escaped, on a comment line
    for hostile in ("BUILD_OPT", "http://127.0.0.1:9/x", "Evil", "evil", "mk", "minipkg-0.1"):
        lines = [ln for ln in text.splitlines() if hostile + "\\n[limits]" in ln]
        assert lines and all("#" in ln and "\\n" in ln for ln in lines), (hostile, text)
    assert "as setup.py's process reported them" in text
    (recipe.parent / "cuda-13.0-toolchain.txt").write_bytes(
        (REPO / "manifests" / "cuda-13.0-toolchain.txt").read_bytes())
    rec = load_recipe(recipe)
    assert rec.limits.sandbox != "off" and rec.remote_url is None


DEFINE_SETUP_PY = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

bad = 'OK = "1" }\\n[limits]\\nsandbox = "off"\\n[[extensions]]\\nname = "minipkg._x"\\ndefines = { X'
setup(name="minipkg", version="0.1", packages=["minipkg", "minipkg.util"],
      ext_modules=[CUDAExtension("minipkg._ops_cuda", ["csrc/ops.cpp"], define_macros=[(bad, None)])],
      cmdclass={"build_ext": BuildExtension})
"""


@pytest.mark.parametrize(("setup_py", "words"), [
    (DEFINE_SETUP_PY, "define_macros name 'OK = \"1\" }\\n[limits]"),
    (DEFINE_SETUP_PY.replace("(bad, None)", "('B\"]\\n[remote]', None)"), "is not a C identifier"),
    (FILES["setup.py"].replace('name="minipkg"', 'name=".."'), "recipe name '..' is not a plain name"),
], ids=["define-injects-tables", "define-breaks-toml", "name-dot-dot"])
def test_recipe_new_refuses_what_it_cannot_write_as_meant(tmp_path: Path, shared_root: Path, setup_py: str,
                                                          words: str) -> None:
    """A define name that is no C identifier (written as a key it would add tables, or break the TOML) and a
    distribution named ``..`` (a recipe realize refuses) are refused by recipe new, exit 2, and no file is
    written."""
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": setup_py})
    recipe = tmp_path / "p" / "recipe.toml"
    r = _recipe_new(shared_root, sdist, recipe)
    assert r.rc == 2 and words in r.err and "Traceback" not in r.err, r.err[-3000:]
    assert not recipe.exists()


def test_the_encoders_round_trip_any_text() -> None:
    """Fixed-seed fuzz: any string (controls, quotes, backslashes, line separators, astral characters) reads
    back from toml_str and toml_key unchanged, and after comment() the next line is still a line of its own."""
    rng = random.Random(41)
    alphabet = ['"', "'", "\\", "\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u202e", "]", "[",
                "=", "#", "}", "{", " ", ".", "a", "Z", "_", "-", "é", "\U0001f600", "\ufeff"]
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert tomllib.loads(f"k = {toml_str(s)}") == {"k": s}, repr(s)
        assert tomllib.loads(f"{toml_key(s)} = 1") == {s: 1}, repr(s)
        assert tomllib.loads(f"{comment(s)}\nx = 1") == {"x": 1}, repr(s)
        assert toml_str(s).isascii()


def test_a_text_that_reads_back_otherwise_is_refused_naming_the_key() -> None:
    w = RecipeText()
    w.table(("recipe",))
    w.key("name", "x")
    check_written(w.text(), w.data, "r.toml")
    with pytest.raises(BadInput, match="key 'limits' is in the text, never written"):
        check_written(w.text() + '\n[limits]\nsandbox = "off"\n', w.data, "r.toml")
    with pytest.raises(BadInput, match="key 'recipe.name' reads back as 'y'"):
        check_written(w.text().replace('"x"', '"y"'), w.data, "r.toml")
    with pytest.raises(BadInput, match="is not TOML"):
        check_written(w.text() + "\nB\"] = 1\n", w.data, "r.toml")
