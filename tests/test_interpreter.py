"""The interpreter a recipe names (issue 19), with hermetic itself on the system 3.11: pyenv's 3.13 and
3.12 have no packaging installed, so every tag and marker they get comes from asking them with hermetic's.

Real wheels throughout: zstandard 0.25.0's binary wheels for cp311 and cp313 (``pip download`` from pip's
configured index, once per session, into .cache/), and small wheels built by the tests, served by the
loopback index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermetic.errors import PreconditionFailed
from hermetic.extensions.host import qualify
from hermetic.root import Root
from hermetic.store.archive import _check_hosts
from tests.support.cli import REPO, Hermetic
from tests.support.index import LoopbackIndex
from tests.support.recipes import pip_lock_line, recipe_toml
from tests.support.wheels import BuiltWheel, build_wheel

ZSTD = "0.25.0"
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def _pyenv(minor: str) -> Path:
    found = sorted(PYENV.glob(f"3.{minor}.*/bin/python3.{minor}"))
    if not found:
        pytest.skip(f"no pyenv CPython 3.{minor} under {PYENV}")
    return found[-1]


@pytest.fixture(scope="session")
def py313() -> Path:
    return _pyenv("13")


@pytest.fixture(scope="session")
def zstd_wheels() -> dict[str, Path]:
    """zstandard's cp311 and cp313 manylinux wheels, downloaded from pip's configured index."""
    out = REPO / ".cache" / "test-wheels" / "zstandard"
    wheels: dict[str, Path] = {}
    for v in ("311", "313"):
        have = sorted(out.glob(f"zstandard-{ZSTD}-cp{v}-cp{v}-*x86_64*.whl"))
        if not have:
            p = subprocess.run([sys.executable, "-m", "pip", "download", f"zstandard=={ZSTD}", "--no-deps",
                                "--only-binary=:all:", "--python-version", f"3.{v[1:]}", "--platform",
                                "manylinux_2_17_x86_64", "-d", str(out)], capture_output=True, text=True,
                               timeout=300)
            have = sorted(out.glob(f"zstandard-{ZSTD}-cp{v}-cp{v}-*x86_64*.whl"))
            if not have:
                pytest.skip(f"pip download of zstandard for cp{v} failed: {p.stderr[-500:]}")
        wheels[v] = have[0]
    return wheels


def _sha(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _recipe(folder: Path, name: str, lock: str, lock_text: str, python: Path | str | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / lock).write_text(lock_text)
    text = recipe_toml(name, locks=[lock])
    if python is not None:
        text = text.replace(f'name = "{name}"\n', f'name = "{name}"\npython = "{python}"\n', 1)
    recipe = folder / f"{name}.toml"
    recipe.write_text(text)
    return recipe


def _profile_files(root: Path, name: str) -> list[str]:
    profile = root / "profiles" / name
    return sorted(str(p.relative_to(profile)) for p in profile.rglob("*") if p.is_file())


def _backend(files: list[str]) -> list[str]:
    return [f for f in files if f.startswith("zstandard/backend_c.")]


def _import_zstandard(h: Hermetic, recipe: Path) -> tuple[str, str]:
    r = h("env", recipe, "--", "python", "-c",
          "import sys, zstandard; print('%d.%d' % sys.version_info[:2], zstandard.backend)")
    assert r.rc == 0, r.err
    version, backend = r.out.split()
    return version, backend


def test_pip_hash_lock_for_313_chooses_cp313_and_env_runs_313(hermetic: Hermetic, index: LoopbackIndex,
                                                               tmp_path: Path, py313: Path,
                                                               zstd_wheels: dict[str, Path]) -> None:
    index.add(*zstd_wheels.values())
    # one pin, both files' hashes: which file is meant depends on the interpreter
    lock = f"zstandard=={ZSTD} --hash=sha256:{_sha(zstd_wheels['311'])} --hash=sha256:{_sha(zstd_wheels['313'])}\n"
    r311 = _recipe(tmp_path / "r", "z311", "z.txt", lock, None)
    r313 = _recipe(tmp_path / "r", "z313", "z.txt", lock, py313)
    # the 3.11 realize first: its unpacked cp311 entry must not be reused for 3.13
    hermetic("realize", r311, check=True)
    hermetic("realize", r313, check=True)
    assert _backend(_profile_files(hermetic.root, "z311")) == ["zstandard/backend_c.cpython-311-x86_64-linux-gnu.so"]
    assert _backend(_profile_files(hermetic.root, "z313")) == ["zstandard/backend_c.cpython-313-x86_64-linux-gnu.so"]
    assert _import_zstandard(hermetic, r313) == ("3.13", "cext")
    assert _import_zstandard(hermetic, r311) == ("3.11", "cext")
    receipt = json.loads(sorted((hermetic.root / "receipts").glob("z313-*.json"))[-1].read_text())
    assert receipt["host"]["executable"] == str(py313) and receipt["host"]["python"].startswith("3.13")
    assert receipt["interpreter"]["best_tag"].startswith("cp313-cp313-")  # packaging 26.3+ ranks linux_x86_64 first
    # a second realize is a no-op: the interpreter's facts and the lock for it are trusted by fingerprint
    again = hermetic("--json", "realize", r313, check=True)
    assert again.result.get("changed") is False, again.out[-2000:]


def test_pylock_for_313_chooses_cp313(hermetic: Hermetic, tmp_path: Path, py313: Path,
                                      zstd_wheels: dict[str, Path]) -> None:
    entries = "".join(
        f'  {{ path = "{w}", hashes = {{ sha256 = "{_sha(w)}" }} }},\n' for w in zstd_wheels.values())
    lock = (f'lock-version = "1.0"\ncreated-by = "tests"\nrequires-python = ">=3.11"\n'
            f'environments = ["python_version >= \'3.11\'"]\n\n'
            f'[[packages]]\nname = "zstandard"\nversion = "{ZSTD}"\nwheels = [\n{entries}]\n')
    recipe = _recipe(tmp_path / "r", "zp313", "pylock.toml", lock, py313)
    hermetic("realize", recipe, check=True)
    assert _backend(_profile_files(hermetic.root, "zp313")) == [
        "zstandard/backend_c.cpython-313-x86_64-linux-gnu.so"]
    assert _import_zstandard(hermetic, recipe) == ("3.13", "cext")
    # requires-python and environments are evaluated for the named interpreter too
    (tmp_path / "r" / "pylock.toml").write_text(lock.replace('requires-python = ">=3.11"',
                                                             'requires-python = "<3.12"'))
    r = hermetic("realize", recipe)
    assert r.rc == 2 and "requires Python <3.12, but the interpreter is Python 3.13" in r.err, r.err


def test_markers_are_the_named_interpreters(hermetic: Hermetic, index: LoopbackIndex, tmp_path: Path,
                                            py313: Path) -> None:
    wheels = tmp_path / "wheels"
    old = build_wheel(wheels, "oldonly", "1.0", {"oldonly/__init__.py": "X = 1\n"})
    every = build_wheel(wheels, "every", "1.0", {"every/__init__.py": "X = 1\n"})
    index.add(old.path, every.path)
    lock = pip_lock_line(every) + pip_lock_line(old).replace(" \\\n", ' ; python_version < "3.12" \\\n', 1)
    r311 = _recipe(tmp_path / "r", "m311", "m.txt", lock, None)
    r313 = _recipe(tmp_path / "r", "m313", "m.txt", lock, py313)
    hermetic("realize", r311, check=True)
    hermetic("realize", r313, check=True)
    assert "oldonly/__init__.py" in _profile_files(hermetic.root, "m311")
    files313 = _profile_files(hermetic.root, "m313")
    assert "every/__init__.py" in files313 and "oldonly/__init__.py" not in files313


def test_cp313_wheel_for_a_311_recipe_is_refused(hermetic: Hermetic, tmp_path: Path,
                                                 zstd_wheels: dict[str, Path]) -> None:
    w = zstd_wheels["313"]
    recipe = _recipe(tmp_path / "r", "wrong", "w.txt", f"{w} --hash=sha256:{_sha(w)}\n", None)
    r = hermetic("realize", recipe)
    assert r.rc == 2, r.err
    assert w.name in r.err and "Python 3.11" in r.err and "cp311-cp311" in r.err, r.err
    assert "Traceback" not in r.err


@pytest.mark.parametrize("python, says", [
    ("/nonexistent/bin/python3.13", "does not exist"),
    ("no-such-python-3.99", "is not found on PATH"),
    ("NOT_EXECUTABLE", "is not an executable file"),
    ("PY27", "not CPython 3.11-3.14"),
])
def test_a_bad_interpreter_is_bad_input_naming_it(hermetic: Hermetic, tmp_path: Path, python: str,
                                                  says: str) -> None:
    if python == "NOT_EXECUTABLE":
        python = str(tmp_path / "python3")
        Path(python).write_text("#!/bin/sh\n")
    if python == "PY27":
        python = str(_pyenv_any("2.7"))
    recipe = _recipe(tmp_path / "r", "bad", "b.txt", "", python)
    # env runs the interpreter, it does not ask it: an existing one of the wrong version was refused at realize
    for command in ("realize",) if says.startswith("not CPython") else ("realize", "env"):
        r = hermetic(command, recipe)
        assert r.rc == 2, (command, r.err)
        assert python in r.err and says in r.err and "key recipe.python" in r.err, (command, r.err)
        assert "Traceback" not in r.err


def _pyenv_any(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no pyenv Python {version}")
    return found[-1]


def test_console_scripts_run_the_environments_interpreter(hermetic: Hermetic, index: LoopbackIndex,
                                                          tmp_path: Path, py313: Path) -> None:
    tool = build_wheel(tmp_path / "wheels", "thetool", "2.5", {
        "thetool/__init__.py": "",
        "thetool/cli.py": "import sys\n\ndef main():\n    assert sys.argv[1:] == ['--version']\n"
                          "    print('thetool 2.5 on %d.%d' % sys.version_info[:2])\n    return 0\n"},
        entry_points="[console_scripts]\nthe-script = thetool.cli:main\n")
    index.add(tool.path)
    lock = pip_lock_line(tool)
    r311 = _recipe(tmp_path / "r", "t311", "t.txt", lock, None)
    r313 = _recipe(tmp_path / "r", "t313", "t.txt", lock, py313)
    for recipe, minor in ((r311, "3.11"), (r313, "3.13")):
        hermetic("realize", recipe, check=True)
        r = hermetic("env", recipe, "--", "the-script", "--version")
        assert r.rc == 0, r.err
        assert r.out.strip() == f"thetool 2.5 on {minor}"
    # one unpacked entry serves both interpreters; each tree holds its own launchers
    entries = [p.name for p in (hermetic.root / "store" / "entries").iterdir()] \
        if (hermetic.root / "store" / "entries").is_dir() else []
    assert sum("thetool" in e for e in entries) <= 1
    s311 = (hermetic.root / "profiles" / "t311" / "bin" / "the-script").read_text()
    s313 = (hermetic.root / "profiles" / "t313" / "bin" / "the-script").read_text()
    assert s313.startswith(f"#!{py313}\n") and s311.startswith(f"#!{os.path.abspath(sys.executable)}\n")
    assert os.readlink(hermetic.root / "profiles" / "t311") != os.readlink(hermetic.root / "profiles" / "t313")


def test_qualification_records_triton_beside_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    triton = pytest.importorskip("triton")
    from importlib.metadata import version
    facts = qualify(Root(tmp_path / "root"), None, need_torch=True)
    assert facts.triton is not None and facts.torch is not None
    assert facts.triton.version == version("triton") == triton.__version__
    assert facts.torch.version
    record = facts.record()
    assert record["triton"] == facts.triton.version and record["torch"] == facts.torch.version
    # an imported closure built with another triton is refused, with both named
    other = {**record, "triton": "0.0.1"}
    with pytest.raises(PreconditionFailed) as info:
        _check_hosts(lambda: record, {"mod-x": {"host": other}}, tmp_path / "a.tar.zst")
    assert "triton=0.0.1" in info.value.render() and record["triton"] in info.value.render()
    _check_hosts(lambda: record, {"mod-x": {"host": dict(record)}}, tmp_path / "a.tar.zst")


# --- the tree's layout and the interpreter's scheme (docs/layout.md#the-environments-layout) ---------------
_KINDS_PROBE = ("import sys, importlib.metadata as md, allkinds, allkinds_pure, allkinds_plat\n"
                "files = sorted(str(f) for f in md.files('allkinds') if not str(f).endswith('.pyc'))\n"
                "print('%d.%d' % sys.version_info[:2], md.version('allkinds'), allkinds_pure.P, allkinds_plat.Q,\n"
                "      'bin/allkinds-py' in {str(f).replace('../', '') for f in files} or files)\n")


def _allkinds(folder: Path) -> BuiltWheel:
    """A wheel with a file in each of the scheme's kinds: purelib, platlib, data, headers, scripts (a
    ``#!python`` one and a shell one, neither executable in the zip) and a console_scripts entry point."""
    data = "allkinds-1.0.data"
    return build_wheel(folder, "allkinds", "1.0", {
        "allkinds/__init__.py": "import sys\n\ndef main():\n    print('entry point on %d.%d' % sys.version_info[:2])\n",
        f"{data}/purelib/allkinds_pure/__init__.py": "P = 'pure'\n",
        f"{data}/platlib/allkinds_plat/__init__.py": "Q = 'plat'\n",
        f"{data}/data/share/allkinds/thing.txt": "data\n",
        f"{data}/headers/allkinds.h": "#define ALLKINDS 1\n",
        f"{data}/scripts/allkinds-py": "#!python\nimport sys, allkinds_pure\n"
                                       "print('script on %d.%d' % sys.version_info[:2], allkinds_pure.P)\n",
        f"{data}/scripts/allkinds-sh": "#!/bin/sh\necho shell script\n"},
        entry_points="[console_scripts]\nallkinds = allkinds:main\n")


# Where pip's --target puts a distribution's headers, asked of pip (the scheme of a --target install is its
# ``home`` scheme): include/python/<dist> for a plain interpreter, include/site/python3.X/<dist> in a venv.
_PIP_HEADERS = """
import os, sys
from pip._internal.locations import get_scheme
home = os.path.abspath("target-home")
print(os.path.relpath(get_scheme(sys.argv[1], home=home).headers, home))
"""


def _pip_target(wheel: Path, target: Path) -> tuple[list[str], str]:
    """What ``pip install --target`` lays out for the wheel (pip's layout for a folder put on PYTHONPATH), and
    the folder pip says its headers go to."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(target), str(wheel)], check=True, capture_output=True, env=env, timeout=300)
    headers = subprocess.run([sys.executable, "-c", _PIP_HEADERS, wheel.name.split("-")[0]], check=True,
                             capture_output=True, text=True, env=env, cwd=target, timeout=60).stdout.strip()
    return sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()), headers


def test_the_tree_is_pips_target_layout_for_every_interpreter(hermetic: Hermetic, index: LoopbackIndex,
                                                              tmp_path: Path, py313: Path) -> None:
    wheel = _allkinds(tmp_path / "wheels")
    index.add(wheel.path)
    lock = pip_lock_line(wheel)
    spaced = tmp_path / "a python" / "python3.13"  # a path a #! line cannot hold: the /bin/sh form
    spaced.parent.mkdir()
    spaced.symlink_to(py313)
    recipes = {"3.11": _recipe(tmp_path / "r", "k311", "k.txt", lock, None),
               "3.13": _recipe(tmp_path / "r", "k313", "k.txt", lock, py313),
               "3.13 spaced": _recipe(tmp_path / "r", "k313s", "k.txt", lock, spaced)}
    trees = {}
    for label, recipe in recipes.items():
        minor = label.split()[0]
        hermetic("realize", recipe, check=True)
        r = hermetic("env", recipe, "--", "python", "-c", _KINDS_PROBE)
        assert r.rc == 0 and r.out.split() == [minor, "1.0", "pure", "plat", "True"], (label, r.out, r.err)
        for script, says in (("allkinds", f"entry point on {minor}"), ("allkinds-py", f"script on {minor} pure"),
                             ("allkinds-sh", "shell script")):
            r = hermetic("env", recipe, "--", script)
            assert r.rc == 0 and r.out.strip() == says, (label, script, r.out, r.err)
        trees[label] = hermetic.root / "profiles" / recipe.stem
    # the layout is pip's --target one, whatever the interpreter (headers aside: include/ as the wheel names
    # them, where pip's --target puts them in the folder its scheme names: include/python/<dist>/, or
    # include/site/python3.X/<dist>/ when pip runs in a venv)
    ours = {label: [f for f in _profile_files(hermetic.root, t.name) if f not in ("bin/python", "bin/python3")]
            for label, t in trees.items()}
    pip_files, pip_headers = _pip_target(wheel.path, tmp_path / "target")
    pips = [f for f in pip_files if not f.endswith(("/REQUESTED", "/direct_url.json"))]
    assert [f for f in ours["3.11"] if not f.startswith("include/")] == \
        [f for f in pips if not f.startswith("include/")]
    assert pip_headers.startswith("include/") and pip_headers.endswith("/allkinds")
    assert "include/allkinds.h" in ours["3.11"] and f"{pip_headers}/allkinds.h" in pips
    assert ours["3.11"] == ours["3.13"] == ours["3.13 spaced"]
    # the same paths and, but for the launchers, the same blobs: nothing else names an interpreter
    for f in ours["3.11"]:
        same = os.stat(trees["3.11"] / f).st_ino == os.stat(trees["3.13"] / f).st_ino
        assert same == (f not in ("bin/allkinds", "bin/allkinds-py")), f
    assert (trees["3.13"] / "bin/allkinds-py").read_bytes().startswith(f"#!{py313}\n".encode())
    assert (trees["3.13 spaced"] / "bin/allkinds-py").read_text().startswith("#!/bin/sh\n'''exec' ")
    # the unpacked entry keeps the wheel's #!python line: it is for any interpreter
    entry = next((hermetic.root / "store" / "entries").glob("*-allkinds"))
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["shebangs"] == ["bin/allkinds-py"]
    digest, executable = meta["files"]["bin/allkinds-py"]
    blob = hermetic.root / "store" / "blobs" / digest[:2] / (digest + ("x" if executable else ""))
    assert executable and blob.read_bytes().startswith(b"#!python\n")


def test_the_tree_goes_in_front_of_a_venvs_own_site_packages(hermetic: Hermetic, index: LoopbackIndex,
                                                             tmp_path: Path, py313: Path) -> None:
    venv = tmp_path / "venv313"
    subprocess.run([str(py313), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    assert site.is_relative_to(venv)
    for pkg, text in (("shadowed", "WHO = 'venv'\n"), ("venvonly", "WHO = 'venv'\n")):
        (site / pkg).mkdir()
        (site / pkg / "__init__.py").write_text(text)
    pinned = build_wheel(tmp_path / "wheels", "shadowed", "1.0", {"shadowed/__init__.py": "WHO = 'lock'\n"})
    index.add(pinned.path)
    recipe = _recipe(tmp_path / "r", "v313", "v.txt", pip_lock_line(pinned), python)
    hermetic("realize", recipe, check=True)
    # the scheme asked of the venv's python is the venv's (asked with -S, where site does not apply the venv)
    receipt = json.loads(sorted((hermetic.root / "receipts").glob("v313-*.json"))[-1].read_text())
    assert receipt["interpreter"]["purelib"] == receipt["interpreter"]["platlib"] == str(site)
    r = hermetic("env", recipe, "--", "python", "-c",
                 "import sys, os, shadowed, venvonly\n"
                 "path = [os.path.realpath(p) for p in sys.path]\n"
                 "tree = os.path.realpath(os.environ['HERMETIC_PROFILE'])\n"
                 f"print(sys.prefix, shadowed.WHO, venvonly.WHO, path.index(tree) < path.index({str(site)!r}))\n")
    assert r.rc == 0, r.err
    assert r.out.split() == [str(venv), "lock", "venv", "True"]


def test_a_shebang_record_that_names_no_python_script_is_refused(tmp_path: Path) -> None:
    """An unpacked record (from an imported archive, say) whose ``shebangs`` name a file that is not one of its
    #!python scripts is refused at layout, as a bad entry point is; a real one gets the interpreter's line."""
    from hermetic.errors import BadInput
    from hermetic.store import Store
    from hermetic.wheels.scripts import with_shebangs
    store = Store(tmp_path / "store").open()
    files = {"bin/tool": (store.put_blob_bytes(b"#!python\nprint(1)\n", executable=True), True),
             "bin/sh": (store.put_blob_bytes(b"#!/bin/sh\necho\n", executable=True), True),
             "pkg/x.py": (store.put_blob_bytes(b"#!python\n"), False)}
    out = with_shebangs(store, "entry", files, ["bin/tool"], "/opt/py/bin/python3.13")
    assert store.blob_path(*out["bin/tool"]).read_bytes() == b"#!/opt/py/bin/python3.13\nprint(1)\n"
    assert out["bin/sh"] == files["bin/sh"] and out["pkg/x.py"] == files["pkg/x.py"]
    for bad in ("bin/sh", "pkg/x.py", "bin/missing"):
        with pytest.raises(BadInput) as info:
            with_shebangs(store, "entry", files, [bad], "/opt/py/bin/python3.13")
        assert bad in info.value.render() and "verify --repair" in info.value.render()
