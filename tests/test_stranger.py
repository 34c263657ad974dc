"""A stranger's extension package (issue 41): an sdist made here, as a setup.py with torch's CUDAExtension
would build it, realized from its recipe and imported through ``hermetic env`` as its users import it.

The sdist holds a package that loads its operator library from its own folder (as torch-scatter does), a
CUDA extension with no .cu file whose C++ unit includes <cuda.h> (``kind = "cuda"``: CUDA's includes for
every unit), a torch operator library (``python_module = false``: TORCH_LIBRARY, no PyInit_), settings
shared through ``[shared.NAME]``, and a ``[package]`` section installing its Python files beside the
module. One compile (a C++ unit), in the session's shared toolchain root.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.recipe import load_recipe
from tests.support import cli
from tests.support.cli import REPO

OPS_CPP = """\
#include <cuda.h>            // a C++ unit of a CUDA extension: found through the extension's kind
#include <ATen/ATen.h>
#include <torch/library.h>

#ifdef _WIN32                // as torch-scatter: a PyInit_ only where Windows' linker wants one
PyMODINIT_FUNC PyInit__ops_cuda(void) { return NULL; }
#endif

int64_t cuda_version() { return CUDA_VERSION; }
at::Tensor add_k(const at::Tensor& x, int64_t k) { return x + k * MINI_SCALE; }

TORCH_LIBRARY(minipkg, m) {
  m.def("cuda_version() -> int", &cuda_version);
  m.def("add_k(Tensor x, int k) -> Tensor", &add_k);
}
"""

INIT_PY = """\
import importlib.machinery
import json
import os

import torch

_here = os.path.dirname(__file__)
_spec = importlib.machinery.PathFinder().find_spec("_ops_cuda", [_here])  # its library, from its own folder
torch.ops.load_library(_spec.origin)
META = json.load(open(os.path.join(_here, "meta.json")))


def cuda_version():
    return torch.ops.minipkg.cuda_version()


def add_k(x, k):
    return torch.ops.minipkg.add_k(x, k)
"""

SETUP_PY = """\
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="minipkg", version="0.1", packages=find_packages(), package_data={"minipkg": ["*.json"]},
      ext_modules=[CUDAExtension("minipkg._ops_cuda", ["csrc/ops.cpp"], include_dirs=["csrc"],
                                 define_macros=[("MINI_SCALE", "10")])],
      cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)})
"""

FILES = {"setup.py": SETUP_PY, "csrc/ops.cpp": OPS_CPP, "minipkg/__init__.py": INIT_PY,
         "minipkg/meta.json": '{"name": "minipkg"}\n', "minipkg/notes.txt": "not package data\n",
         "minipkg/util/__init__.py": "def double(x):\n    return 2 * x\n"}


def make_sdist(folder: Path, files: dict[str, str] = FILES) -> tuple[Path, str]:
    """minipkg-0.1.tar.gz, one top folder as every sdist has, and its sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "minipkg-0.1.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"minipkg-0.1/{rel}")
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def stranger_recipe(sdist: Path, sha: str, *, python_module: bool = False, extra: str = "") -> str:
    return f"""\
[recipe]
name = "minipkg"

[toolchain]
cuda = "13.0"
lock = "cuda-13.0-toolchain.txt"
archs = ["9.0"]

[sources.minipkg]
url = "{sdist.as_uri()}"
sha256 = "{sha}"

[limits]
jobs = 2

[shared.ops]
source = "minipkg"
kind = "cuda"
{"" if python_module else "python_module = false"}
include_dirs = ["csrc"]
defines = {{ MINI_SCALE = "10" }}

[[extensions]]
name = "minipkg._ops_cuda"
shared = "ops"
sources = ["csrc/ops.cpp"]

[package]
source = "minipkg"
packages = ["minipkg", "minipkg.util"]
data = ["*.json"]
{extra}"""


def _project(folder: Path, recipe: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cuda-13.0-toolchain.txt").write_bytes((REPO / "manifests" / "cuda-13.0-toolchain.txt").read_bytes())
    path = folder / "recipe.toml"
    path.write_text(recipe)
    return path


def test_a_strangers_package_builds_and_imports_through_hermetic_env(tmp_path: Path, shared_root: Path) -> None:
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha))
    env = dict(os.environ)
    r = cli.run(shared_root, "realize", recipe, "--json", env=env)
    assert r.rc == 0, r.err[-4000:]
    receipt = json.loads(Path(r.result["receipt"]).read_text())
    [module] = receipt["modules"]
    assert module["module"] == "minipkg._ops_cuda"
    assert module["file"].startswith("minipkg/_ops_cuda.") and module["file"].endswith(".so")
    # the operator library was loaded as torch loads one, and registered its operators
    assert receipt["import_check"]["operators"] == {module["file"]: ["minipkg::add_k", "minipkg::cuda_version"]}
    # the package's files, recorded: .py files of both packages and the data pattern, nothing else
    assert sorted(receipt["package"]["files"]) == ["minipkg/__init__.py", "minipkg/meta.json",
                                                    "minipkg/util/__init__.py"]
    profile = shared_root / "profiles" / "minipkg"
    assert (profile / module["file"]).is_file() and not (profile / "minipkg" / "notes.txt").exists()
    assert not (profile / "csrc").exists() and not (profile / "setup.py").exists()
    # as its users would: import the package, which loads its library from its own folder
    probe = ("import torch, minipkg, minipkg.util; "
             "print(minipkg.cuda_version(), minipkg.add_k(torch.ones(2), 3).tolist(), minipkg.util.double(4), "
             "minipkg.META['name'], torch.cuda.is_initialized())")
    p = cli.run(shared_root, "env", recipe, "--", "python", "-c", probe, env=env)
    assert p.rc == 0, p.err[-3000:]
    assert p.out.split() == ["13000", "[31.0,", "31.0]", "8", "minipkg", "False"]


def test_an_operator_library_checked_as_a_python_module_says_python_module_false(
        tmp_path: Path, shared_root: Path) -> None:
    """Without ``python_module = false`` the import check fails as torch-scatter's did before this issue, and
    says what to write (the object and link are the test above's: nothing compiles). The same tree checked
    as a library first: the check's cache must not answer for the other question."""
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha).replace(
        'name = "minipkg"\n', 'name = "minipkg-flip"\n', 1))
    assert cli.run(shared_root, "realize", recipe, env=dict(os.environ)).rc == 0
    recipe.write_text(recipe.read_text().replace("python_module = false\n", ""))
    r = cli.run(shared_root, "realize", recipe, env=dict(os.environ))
    assert r.rc != 0 and "Traceback" not in r.err.split("failed:")[0]
    assert "python_module = false" in r.err, r.err[-3000:]


def test_shared_settings_merge_and_errors_name_their_lines(tmp_path: Path) -> None:
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha) + """
[[extensions]]
name = "minipkg._other"
shared = "ops"
sources = ["csrc/ops.cpp"]
kind = "cpp"
python_module = true
""")
    rec = load_recipe(recipe)
    ops, other = rec.extensions
    assert (ops.kind, ops.python_module, ops.include_dirs, ops.defines) == \
        ("cuda", False, ("csrc",), (("MINI_SCALE", "10"),))
    assert (other.kind, other.python_module, other.include_dirs) == ("cpp", True, ("csrc",))   # own keys win
    assert rec.package is not None and rec.package.packages == ("minipkg", "minipkg.util")
    text = recipe.read_text()
    bad_kind = text.replace('kind = "cuda"', 'kind = "hip"')
    line = bad_kind.splitlines().index('kind = "hip"') + 1
    recipe.write_text(bad_kind)
    with pytest.raises(BadInput) as caught:
        load_recipe(recipe)
    assert "kind 'hip'" in caught.value.what and f"recipe.toml:{line}" in (caught.value.where or "")
    recipe.write_text(text.replace('shared = "ops"\nsources', 'shared = "opz"\nsources', 1))
    with pytest.raises(BadInput, match="shared settings 'opz'"):
        load_recipe(recipe)
    recipe.write_text(text.replace('packages = ["minipkg", "minipkg.util"]', 'packages = ["minipkg.util"]'))
    with pytest.raises(BadInput, match="package minipkg, which package.packages does not list"):
        load_recipe(recipe)
    recipe.write_text(text.replace('sources = ["csrc/ops.cpp"]', 'sources = ["csrc/ops.cu"]')
                      .replace('kind = "cuda"', 'kind = "cpp"'))
    with pytest.raises(BadInput, match="kind cpp but names CUDA sources"):
        load_recipe(recipe)


def test_without_kind_cuda_a_cpp_unit_does_not_see_cuda_h(tmp_path: Path, shared_root: Path) -> None:
    """The rule kind = "cuda" changes: decided by the file's suffix (hermetic before issue 41), the C++ unit
    of a CUDA extension gets no CUDA include folder, and its #include <cuda.h> fails as the issue saw with
    torch-scatter's csrc/version.cpp. The progress never says done for the failed compile."""
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha).replace('kind = "cuda"\n', "").replace(
        'name = "minipkg"\n', 'name = "minipkg-by-suffix"\n', 1))
    r = cli.run(shared_root, "realize", recipe, "--json", env=dict(os.environ))
    assert r.rc != 0
    assert "cuda.h" in r.err + r.out, (r.err + r.out)[-3000:]
    closing = [rec for rec in r.records if str(rec.get("label", "")).startswith("compiling")
               and "seconds" in rec]
    assert [(rec["done"], rec["total"]) for rec in closing] == [(0, 1)]   # 1 of 1 before: a failure, counted


OPTIONED_SETUP_PY = """\
import os
import urllib.request

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

scale = os.getenv("MINI_SCALE", "1")
try:
    urllib.request.urlopen("https://example.invalid/prebuilt.whl")   # as causal-conv1d tries a prebuilt wheel
except Exception:
    pass
ext = CUDAExtension("minipkg._ops_cuda", ["csrc/ops.cpp"], include_dirs=["csrc"],
                    define_macros=[("MINI_SCALE", scale)],
                    extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O3", "-gencode", "arch=compute_80,code=sm_80"]})
setup(name="minipkg", version="0.1", packages=find_packages(), package_data={"minipkg": ["*.json"]},
      ext_modules=[ext], cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)})
"""


def test_recipe_new_derives_a_recipe_that_builds_and_imports(tmp_path: Path, shared_root: Path) -> None:
    """``recipe new`` runs the sdist's setup.py (in the sandbox, nothing compiled) and writes a recipe that
    realizes and imports as written: options it read recorded and set with --env, arch flags dropped for
    [toolchain] archs, the operator library found, the package and its data listed, each value's lines named."""
    sdist, sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": OPTIONED_SETUP_PY})
    before = sorted(p.name for p in sdist.parent.iterdir())
    project = tmp_path / "p"
    project.mkdir()
    (project / "cuda-13.0-toolchain.txt").write_bytes((REPO / "manifests" / "cuda-13.0-toolchain.txt").read_bytes())
    recipe = project / "recipe.toml"
    r = cli.run(shared_root, "recipe", "new", sdist, "--env", "MINI_SCALE=10", "--lock", "cuda-13.0-toolchain.txt",
                "-o", recipe, env=dict(os.environ))
    assert r.rc == 0, r.err[-3000:]
    text = recipe.read_text()
    assert f'sha256 = "{sha}"' in text and f'url = "{sdist.as_uri()}"' in text
    assert "#   MINI_SCALE = '10' (default '1')  setup.py:7" in text            # the option, its line
    assert "# setup.py:9 tried the network, refused: urllib.request.urlopen(https://example.invalid/" in text
    assert 'defines = { MINI_SCALE = "10" }   # setup.py:7,13' in text
    assert "dropped for [toolchain] archs: -gencode arch=compute_80,code=sm_80" in text
    assert 'kind = "cuda"' in text and "python_module = false" in text and "no .cu file" in text
    assert 'packages = ["minipkg", "minipkg.util"]' in text and 'data = ["meta.json"]' in text
    assert sorted(p.name for p in sdist.parent.iterdir()) == before        # nothing written beside the sdist
    rec = load_recipe(recipe)
    [ext] = rec.extensions
    assert (ext.name, ext.kind, ext.python_module, ext.defines) == ("minipkg._ops_cuda", "cuda", False,
                                                                     (("MINI_SCALE", "10"),))
    assert "-O2" in ext.cflags and "-DNDEBUG" in ext.cflags and ext.cuda_cflags == ("-O3",)
    done = cli.run(shared_root, "realize", recipe, env=dict(os.environ))
    assert done.rc == 0, done.err[-3000:]
    probe = "import torch, minipkg; print(minipkg.add_k(torch.ones(1), 2).tolist())"
    p = cli.run(shared_root, "env", recipe, "--", "python", "-c", probe, env=dict(os.environ))
    assert p.rc == 0 and p.out.split() == ["[21.0]"], p.err[-2000:]


def test_recipe_new_says_why_a_setup_py_fails(tmp_path: Path, shared_root: Path) -> None:
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": "import os\nraise SystemExit("
                                                 "'set MINI_FORCE' if not os.getenv('MINI_FORCE') else 1)\n"})
    r = cli.run(shared_root, "recipe", "new", sdist, env=dict(os.environ))
    assert r.rc == 2 and "setup.py" in r.err and "--env KEY=VALUE" in r.err, r.err[-2000:]
    assert "Traceback (most recent call last)" not in r.err
    no_setup, _ = make_sdist(tmp_path / "d2", {"minipkg/__init__.py": ""})
    r = cli.run(shared_root, "recipe", "new", no_setup, env=dict(os.environ))
    assert r.rc == 2 and "no setup.py at its top" in r.err


@pytest.mark.parametrize(("argv", "jobs", "threads"), [
    (["/t/bin/nvcc", "-O3", "--threads", "4", "-c", "x.cu"], 8, 4),     # flash-attn's, mamba's setup.py
    (["/t/bin/nvcc", "--threads=2"], 8, 2),
    (["/t/bin/nvcc", "-t", "3"], 8, 3),
    (["/t/bin/nvcc", "-t4"], 2, 2),                                      # never more than the whole limit
    (["/t/bin/nvcc", "--threads", "0"], 6, 6),                            # 0: one per CPU, the whole limit
    (["/t/bin/nvcc", "-O3"], 8, 1),
    (["c++", "--threads", "4"], 8, 1),                                    # not nvcc's option
])
def test_nvcc_threads_count_against_the_jobs_limit(argv: list[str], jobs: int, threads: int) -> None:
    from hermetic.extensions.graph import nvcc_threads
    assert nvcc_threads(argv, jobs) == threads


def test_a_subdir_naming_the_sdists_top_folder_says_it_is_stripped(tmp_path: Path, shared_root: Path) -> None:
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha).replace(
        f'sha256 = "{sha}"\n', f'sha256 = "{sha}"\nsubdir = "minipkg-0.1"\n', 1).replace(
        'name = "minipkg"\n', 'name = "minipkg-subdir"\n', 1))
    r = cli.run(shared_root, "realize", recipe, env=dict(os.environ))
    assert r.rc == 2 and "no files under minipkg-0.1" in r.err, r.err[-2000:]
    assert "top folder, which hermetic strips" in r.err


def test_recipe_new_refuses_a_setup_py_that_forges_the_record(tmp_path: Path, shared_root: Path) -> None:
    """The capture's record is a line of its output: a setup.py printing one of its own is named, never a
    traceback."""
    forged = 'import atexit\natexit.register(print, "hermetic-capture-result: [1, 2]")\n' + OPTIONED_SETUP_PY
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": forged})
    r = cli.run(shared_root, "recipe", "new", sdist, env=dict(os.environ))
    assert r.rc == 2 and "Traceback" not in r.err, r.err[-2000:]
    assert "gave 2 records" in r.err or "not JSON" in r.err


def test_recipe_new_runs_setup_py_only_in_the_sandbox(tmp_path: Path, shared_root: Path) -> None:
    """Without a working sandbox (here: HERMETIC_BWRAP names no program) a stranger's setup.py is not run
    unless --sandbox off says so; it runs confined otherwise (the tests above)."""
    sdist, _sha = make_sdist(tmp_path / "dist", {**FILES, "setup.py": "raise SystemExit(1)\n"})
    env = {**os.environ, "HERMETIC_BWRAP": str(tmp_path / "no-bwrap")}
    env.pop("HERMETIC_SANDBOX", None)
    r = cli.run(shared_root, "recipe", "new", sdist, env=env)
    assert r.rc == 3 and "no sandbox for the package's setup.py" in r.err and "--sandbox off" in r.err, r.err


@pytest.mark.parametrize("package", ["minipkg._ops_cuda", "minipkg._ops_cuda.inner"])
def test_a_package_named_as_a_built_module_is_refused_at_load(tmp_path: Path, package: str) -> None:
    """(issue 41, attack F6) A package folder with a built module's dotted name is what Python imports instead
    of the module: refused when the recipe is read, naming the file, line, key and both names."""
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha).replace(
        'packages = ["minipkg", "minipkg.util"]', f'packages = ["minipkg", "minipkg.util", "{package}"]'))
    with pytest.raises(BadInput) as e:
        load_recipe(recipe)
    assert f"package {package} has the dotted name of the built module minipkg._ops_cuda" in str(e.value)
    line = recipe.read_text().splitlines().index(
        f'packages = ["minipkg", "minipkg.util", "{package}"]') + 1
    assert e.value.where is not None and f"recipe.toml:{line}" in e.value.where and "package.packages" in \
        e.value.where, e.value.where


@pytest.mark.parametrize(("package", "what"), [("json", "the standard library"), ("torch", "torch"),
                                             ("os.path", "the standard library")])
def test_a_package_that_would_shadow_the_standard_library_or_torch_is_refused(tmp_path: Path, package: str,
                                                                              what: str) -> None:
    """(issue 41, attack F7) The environment is on PYTHONPATH, ahead of the standard library: a package named
    json (or torch) would shadow the real one in every `hermetic env` process, where pip's site-packages would
    not. Refused when the recipe is read, naming the file, line and key."""
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha).replace(
        'packages = ["minipkg", "minipkg.util"]', f'packages = ["minipkg", "minipkg.util", "{package}"]'))
    with pytest.raises(BadInput) as e:
        load_recipe(recipe)
    assert f"package {package} would shadow {what}'s" in str(e.value), str(e.value)
    assert e.value.where is not None and "package.packages" in e.value.where


def test_the_import_check_refuses_a_module_that_is_not_the_built_file(tmp_path: Path) -> None:
    """(F6, the check behind the load's) The import check confirms each built module's ``__file__`` is the
    built file: a package folder beside it, which Python's importer prefers, fails the check."""
    import importlib.machinery
    import sys

    from hermetic.errors import WorkFailed
    from hermetic.extensions.context import build_env
    from hermetic.extensions.importcheck import ImportCheck
    from hermetic.root import Root
    root = Root(tmp_path / "root")
    root.ensure()
    tree = tmp_path / "tree"
    (tree / "shadow" / "_ext").mkdir(parents=True)
    (tree / "shadow" / "__init__.py").write_text("X = 1\n")
    (tree / "shadow" / "_ext" / "__init__.py").write_text("def add1(x):\n    return x + 1000\n")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tree / "shadow" / f"_ext{suffix}").write_bytes(Path(json.__file__).parent.joinpath(
        "..", "lib-dynload", f"_json{suffix}").resolve().read_bytes())   # a real module file, never imported
    profile = root.profiles / "p"
    os.symlink(tree, profile)
    check = ImportCheck(root, sys.executable, profile, build_env(root, None))
    with pytest.raises(WorkFailed) as e:
        check.run(["shadow._ext", "shadow"], "tree-shadow", profile)
    assert f"import shadow._ext ran {profile}/shadow/_ext/__init__.py, not the built module shadow/_ext{suffix}" \
        in str(e.value), str(e.value)
    assert root.cache("imports").get("tree-shadow") is None


def test_a_header_included_by_absolute_path_outside_the_root_is_an_input_of_the_noop(tmp_path: Path,
                                                                                      shared_root: Path) -> None:
    """(issue 41, attack F9) A unit #includes a header by its absolute path, outside every tree and the root. The
    object's record lists it as an input; the no-op record fingerprints it as well, so after the header changes
    neither the no-op nor ``--check`` says "up to date": the unit compiles again and the module says so."""
    from tests.support.builds import Project
    from tests.support.recipes import recipe_toml
    header = tmp_path / "outside" / "evil.h"
    header.parent.mkdir()
    header.write_text("#define OUTSIDE_VALUE 41\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "ext.cpp").write_text(f'#include <torch/extension.h>\n#include "{header}"\n'
                                 "int value() { return OUTSIDE_VALUE; }\n"
                                 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("value", &value); }\n')
    proj = Project(tmp_path / "p", "outh", shared_root, sources=src, recipe=recipe_toml(
        "outh", toolchain=True, archs=["9.0"], sources={"src": "src"}, jobs=2,
        extensions=['name = "outh_ext"\nsource = "src"\nsources = ["ext.cpp"]']))
    first = proj.realize()
    assert first.decisions == {"ext.cpp": "compiled"}
    assert proj.realize().result.get("changed") is False          # nothing changed: a no-op
    header.write_text("#define OUTSIDE_VALUE 42\n")
    check = cli.run(shared_root, "realize", proj.recipe, "--check", env=dict(os.environ))
    assert check.rc == 4 and "is not up to date" in check.out, (check.rc, check.out, check.err[-2000:])
    again = proj.realize()
    assert again.decisions == {"ext.cpp": "compiled"}, again.decisions
    p = cli.run(shared_root, "env", proj.recipe, "--", "python", "-c", "import torch, outh_ext; "
                "print(outh_ext.value())", env=dict(os.environ))
    assert p.rc == 0 and p.out.split() == ["42"], (p.out, p.err[-2000:])


def test_an_absolute_package_dir_is_refused_at_load(tmp_path: Path) -> None:
    """(issue 41, attack: minor) ``package_dir = "/abs"`` was made relative before the check and taken inside
    the tree, failing only after the compile with no recipe line: refused at load as ``../..`` is."""
    sdist, sha = make_sdist(tmp_path / "dist")
    recipe = _project(tmp_path / "p", stranger_recipe(sdist, sha, extra='package_dir = "/home/x/.config"\n'))
    with pytest.raises(BadInput) as e:
        load_recipe(recipe)
    assert "package_dir '/home/x/.config' leaves the source tree" in str(e.value)
    assert e.value.where is not None and "package.package_dir" in e.value.where, e.value.where


def test_a_zip_sdist_with_its_top_folder_is_read_as_the_tar_is(tmp_path: Path) -> None:
    """(issue 41, attack F11) A zip sdist (shutil.make_archive, zip -r: every file in one top folder) was
    refused by `recipe new` ("no setup.py at its top"); its top folder is stripped as a tar's is. A zip of files
    at its top is taken as it is."""
    import shutil
    import zipfile

    from hermetic.extensions.sources import extract
    from hermetic.recipe import Source
    tree = tmp_path / "zz-1.0"
    (tree / "zz").mkdir(parents=True)
    (tree / "setup.py").write_text("from setuptools import setup\nsetup(name='zz')\n")
    (tree / "zz" / "__init__.py").write_text("X = 1\n")
    archive = Path(shutil.make_archive(str(tmp_path / "zz-1.0"), "zip", tmp_path, "zz-1.0"))
    out = tmp_path / "out"
    out.mkdir()
    extract(archive, Source("zz", url=archive.as_uri(), sha256="0" * 64, where="t"), out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["setup.py", "zz/__init__.py"]
    flat = tmp_path / "flat.zip"
    with zipfile.ZipFile(flat, "w") as zf:
        zf.writestr("setup.py", "x = 1\n")
        zf.writestr("pkg/a.py", "y = 2\n")
    out2 = tmp_path / "out2"
    out2.mkdir()
    extract(flat, Source("f", url=flat.as_uri(), sha256="0" * 64, where="t"), out2)
    assert sorted(str(p.relative_to(out2)) for p in out2.rglob("*") if p.is_file()) == ["pkg/a.py", "setup.py"]


def test_an_import_that_never_ends_is_stopped_at_the_import_checks_deadline(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """(issue 41, attack F3) A package whose __init__ waits forever held realize's import check (and realize)
    until killed from outside. The check has a deadline (importcheck.IMPORT_TIMEOUT, 600 s; 20 s here): the
    interpreter is stopped and the realize fails, naming the modules."""
    import sys
    import time

    from hermetic.errors import WorkFailed
    from hermetic.extensions import importcheck
    from hermetic.extensions.context import build_env
    from hermetic.root import Root
    monkeypatch.setattr(importcheck, "IMPORT_TIMEOUT", 20.0)
    root = Root(tmp_path / "root")
    root.ensure()
    tree = tmp_path / "tree"
    (tree / "stuck").mkdir(parents=True)
    (tree / "stuck" / "__init__.py").write_text("import time\ntime.sleep(10 ** 6)\n")
    profile = root.profiles / "p"
    os.symlink(tree, profile)
    check = importcheck.ImportCheck(root, sys.executable, profile, build_env(root, None))
    began = time.monotonic()
    with pytest.raises(WorkFailed, match=r"importing stuck did not finish within 20 s"):
        check.run(["stuck"], "tree-stuck", profile)
    assert time.monotonic() - began < 120
