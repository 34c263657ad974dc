"""The command line's conventions, as pip, uv and nix users expect them (issue 20): ``realize --dry-run`` (a plan
decided from the keys and the store, with nothing written under the root), ``--offline`` (nothing fetched; exit
3 naming what would have to be), ``-q``/``-v``, data on stdout (``hermetic show | cat``), every record a JSON
line on stdout with ``--json``, shell completion, and CI's rule that a test whose tool is missing fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.builds import Project
from tests.support.cli import REPO, Hermetic, command
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe


def snapshot(top: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under ``top`` and ``top`` itself, files and folders alike: (mode, size, mtime_ns, ctime_ns).
    A file made and removed again still moves its folder's mtime, so this sees any write at all."""
    out: dict[str, tuple[int, int, int, int]] = {}
    if not os.path.lexists(top):
        return out
    for dirpath, dirs, files in os.walk(top):
        for name in ["", *dirs, *files]:
            p = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(p)
            out[os.path.relpath(p, top)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def _two_wheels(tmp_path: Path, index: LoopbackIndex) -> tuple[Path, list[Path]]:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    b = make_pkg(tmp_path / "whl", "beta", "2.0")
    index.add(a.path, b.path)
    return write_recipe(tmp_path / "r", "env1", pip_lock_line(a) + pip_lock_line(b)), [a.path, b.path]


# realize --dry-run ----------------------------------------------------------------------------------------------
def test_dry_run_on_an_empty_root_plans_every_fetch_with_its_bytes_and_creates_nothing(
        tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    recipe, wheels = _two_wheels(tmp_path, index)
    plain = hermetic("realize", recipe, "--dry-run")
    assert plain.rc == 0, plain.err
    sizes = [p.stat().st_size for p in wheels]
    assert f"fetch    alpha==1.0  {sizes[0]} bytes" in plain.out and f"fetch    beta==2.0  {sizes[1]} bytes" \
        in plain.out, plain.out
    assert f"would fetch 2 wheels ({sum(sizes)} bytes), unpack 2, reuse 0" in plain.out
    res = hermetic("realize", recipe, "--dry-run", "--json")
    assert res.rc == 0, res.err
    assert not hermetic.root.exists()  # not even the root's folder, its marker, a lock or a cache
    plan = res.result
    assert plan["result"] == "realize" and plan["dry_run"] is True and plan["changed"] is True
    assert [(w["label"], w["action"], w["bytes"]) for w in plan["plan"]["wheels"]] == \
        [("alpha==1.0", "fetch", sizes[0]), ("beta==2.0", "fetch", sizes[1])]
    assert all(w["url"].startswith(index.url) and w["where"].endswith(f"env1.lock.txt:{2 * i + 1}")
               for i, w in enumerate(plan["plan"]["wheels"]))
    # what it said is what the realize then does
    done = hermetic("realize", recipe, "--json", check=True).result
    for key in ("wheels", "fetched", "fetched_bytes", "unpacked", "reused"):
        assert done["counts"][key] == plan["counts"][key], key


def test_dry_run_on_a_built_root_changes_no_file_folder_or_mtime(tmp_path: Path, hermetic: Hermetic,
                                                                 index: LoopbackIndex) -> None:
    recipe, _wheels = _two_wheels(tmp_path, index)
    hermetic("realize", recipe, check=True)
    before = snapshot(hermetic.root)
    res = hermetic("realize", recipe, "--dry-run", "--json")
    assert res.rc == 0 and res.result["plan"]["up_to_date"] is True and res.result["changed"] is False, res.err
    assert res.result["counts"]["reused"] == 2 and res.result["counts"]["fetched"] == 0
    assert "is up to date: nothing would be fetched" in hermetic("realize", recipe, "--dry-run").out
    assert snapshot(hermetic.root) == before
    # past the no-op record (the lock changed): locks parsed again, the store asked, nothing written still
    gamma = make_pkg(tmp_path / "whl", "gamma", "3.0")
    index.add(gamma.path)
    lock = tmp_path / "r" / "env1.lock.txt"
    lock.write_text(lock.read_text() + pip_lock_line(gamma))
    res = hermetic("realize", recipe, "--dry-run", "--json", "-v")
    assert res.rc == 0, res.err
    assert {w["label"]: w["action"] for w in res.result["plan"]["wheels"]} == \
        {"alpha==1.0": "reuse", "beta==2.0": "reuse", "gamma==3.0": "fetch"}
    assert res.result["counts"]["fetched_bytes"] == gamma.path.stat().st_size
    assert snapshot(hermetic.root) == before


def test_dry_run_of_a_build_says_which_objects_compile_and_the_realize_agrees(tmp_path: Path,
                                                                            shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "dryrun", shared_root)
    env = dict(os.environ)

    def dry(*args: str) -> dict[str, object]:
        p = subprocess.run(command(shared_root, "realize", proj.recipe, "--dry-run", "--json", *args),
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        assert p.returncode == 0, p.stderr
        return dict(json.loads(p.stdout.splitlines()[-1]))

    before = snapshot(shared_root)
    first = dry()
    plan = first["plan"]
    assert isinstance(plan, dict) and plan["toolchain"]["action"] == "assemble"
    [module] = plan["modules"]
    assert {o["decision"] for o in module["objects"]} == {"compiled"} and len(module["objects"]) == 6
    assert snapshot(shared_root) == before
    base = proj.realize()
    counts = base.result["counts"]
    assert isinstance(counts, dict)  # clock.cpp uses __TIME__: compiled, and not stored ("compiled-uncacheable")
    assert counts["objects_compiled"] + counts.get("objects_compiled-uncacheable", 0) == \
        first["counts"]["objects_compiled"]  # type: ignore[index]

    # another variant: its decisions come from the keys and the records in the store, exactly
    before = snapshot(shared_root)
    feature = dry("--variant", "feature")
    assert snapshot(shared_root) == before
    [module] = feature["plan"]["modules"]  # type: ignore[index]
    planned = {o["source"]: o["decision"] for o in module["objects"]}
    assert planned["host.cpp"] == "compiled" and planned["bindings.cpp"] == "reused-variant", planned
    done = proj.realize("--variant", "feature", "-v")
    assert {k: v.replace("compiled-uncacheable", "compiled") for k, v in done.decisions.items()} == planned
    objects = [json.loads(line) for line in done.out.splitlines() if '"event": "object"' in line]
    assert len(objects) == 6 and all(o["message"].startswith("fixture_ext: ") for o in objects)
    # and once it is built: up to date, nothing written
    before = snapshot(shared_root)
    assert dry("--variant", "feature")["plan"]["up_to_date"] is True  # type: ignore[index]
    assert snapshot(shared_root) == before


# --offline -------------------------------------------------------------------------------------------------------
def test_offline_fetches_nothing_and_exits_3_naming_each_missing_wheel(tmp_path: Path, hermetic: Hermetic,
                                                                      index: LoopbackIndex) -> None:
    recipe, _wheels = _two_wheels(tmp_path, index)
    res = hermetic("realize", recipe, "--offline")
    assert res.rc == 3, res.err
    assert "offline" in res.err and "alpha==1.0" in res.err and "beta==2.0" in res.err, res.err
    assert "env1.lock.txt:1" in res.err and "env1.lock.txt:3" in res.err and "Traceback" not in res.err
    blobs = hermetic.root / "store" / "blobs"
    assert index.state.requests == [] and (not blobs.exists() or not any(blobs.iterdir()))
    hermetic("realize", recipe, check=True)
    asked = len(index.state.requests)
    assert hermetic("realize", recipe, "--offline").rc == 0                   # a no-op
    full = hermetic("realize", recipe, "--offline", "--explain", "--json")    # every step, still nothing fetched
    assert full.rc == 0 and full.result["counts"]["reused"] == 2, full.err
    assert len(index.state.requests) == asked
    # one more wheel in the lock: named alone, by name==version, lock file and line; the environment says it too
    gamma = make_pkg(tmp_path / "whl", "gamma", "3.0")
    index.add(gamma.path)
    lock = tmp_path / "r" / "env1.lock.txt"
    lock.write_text(lock.read_text() + pip_lock_line(gamma))
    for res in (hermetic("realize", recipe, "--offline", "--json"),
                hermetic("realize", recipe, "--json", env={"HERMETIC_OFFLINE": "1"})):
        assert res.rc == 3 and res.result["exit_code"] == 3 and res.result["error"]["kind"] == "precondition"
        assert "gamma==3.0" in res.err and "env1.lock.txt:5" in res.err and "alpha" not in res.err, res.err
    before = snapshot(hermetic.root)
    dry = hermetic("realize", recipe, "--dry-run", "--offline")
    assert dry.rc == 3 and "fetch    gamma==3.0" in dry.out and "gamma==3.0" in dry.err, (dry.out, dry.err)
    assert snapshot(hermetic.root) == before
    assert len(index.state.requests) == asked


# -q, -v, stdout and stderr, --json -------------------------------------------------------------------------------
def test_quiet_verbose_and_json_say_what_they_should_where_they_should(tmp_path: Path, hermetic: Hermetic,
                                                                       index: LoopbackIndex) -> None:
    recipe, _wheels = _two_wheels(tmp_path, index)
    quiet = hermetic("-q", "realize", recipe)
    assert quiet.rc == 0 and quiet.out == "" and quiet.err == "", quiet.err
    normal = hermetic("realize", recipe, root=hermetic.root.parent / "root-normal")
    assert normal.rc == 0 and "fetched alpha-1.0-" in normal.err and "fetching alpha" not in normal.err
    verbose = hermetic("realize", recipe, "-v", root=hermetic.root.parent / "root-verbose")
    assert verbose.rc == 0 and f"fetching alpha-1.0-py3-none-any.whl from {index.url}/files/" in verbose.err, \
        verbose.err
    noop = hermetic("realize", recipe, "--verbose")
    assert "no input changed since its last realize" in noop.err and "up to date: env1" in noop.err
    assert "no input changed" not in hermetic("realize", recipe).err
    both = hermetic("-q", "-v", "show")
    assert both.rc == 2 and "exclude each other" in both.err
    # --json: every record is a line of JSON on stdout, events and the closing result alike; stderr has none
    other = hermetic.root.parent / "root-json"
    res = hermetic("realize", recipe, "--json", "-v", root=other)
    records = [json.loads(line) for line in res.out.splitlines()]
    assert res.rc == 0 and "result" in records[-1] and all("result" not in r for r in records[:-1])
    kinds = {r.get("event") for r in records}
    assert {"fetched", "unpacked", "progress", "fetch-from"} <= kinds, kinds
    assert not any(line.lstrip().startswith("{") for line in res.err.splitlines()), res.err


def test_show_prints_its_listing_on_stdout_through_a_pipe(tmp_path: Path, hermetic: Hermetic,
                                                          index: LoopbackIndex) -> None:
    recipe, _wheels = _two_wheels(tmp_path, index)
    hermetic("realize", recipe, check=True)
    line = " ".join(f"'{a}'" for a in command(hermetic.root, "show")) + " | cat"
    p = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=hermetic.env, cwd=REPO,
                       timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.startswith(f"scratch root {hermetic.root}\n") and "roots: env1" in p.stdout
    assert "profile env1 -> " in p.stdout and "receipt env1-" in p.stdout, p.stdout
    assert hermetic("-q", "status").out == p.stdout  # data, whatever the level
    # gc's listing too: data on stdout, its summary on stderr
    hermetic("gc", "--drop-root", "env1", check=True)
    hermetic("realize", recipe, check=True)
    listed = hermetic("gc", "--dry-run")
    assert listed.rc == 0 and "would delete" in listed.err
    assert all(line.startswith("would delete entry ") for line in listed.out.splitlines())


def test_help_says_where_records_go() -> None:
    p = subprocess.run([sys.executable, "-m", "hermetic", "--help"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert "with --json every record (events and the closing result) is one JSON line on stdout" in text
    assert "progress on stderr" not in text.split("--json")[-1].split("-q")[0]
    for flag in ("-q, --quiet", "-v, --verbose", "--offline", "completion"):
        assert flag in p.stdout, flag
    realize = subprocess.run([sys.executable, "-m", "hermetic", "realize", "--help"], capture_output=True, text=True,
                             cwd=REPO)
    assert "--dry-run" in realize.stdout
    # everything under the root but the run's device lock, whose folder --help names
    assert "but for `run`'s lock on its device" in text and "$HERMETIC_LOCK_DIR" in text and \
        "/run/lock/hermetic" in text


def test_each_commands_help_says_what_it_takes_and_what_offline_does_there() -> None:
    import argparse

    from hermetic.cli.parser import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    env = " ".join(sub.choices["env"].format_usage().split())
    assert env.startswith("usage: hermetic env ") and env.endswith(" RECIPE [-- CMD [ARG ...]]"), env
    offline = {name: next(a.help for a in p._actions if a.dest == "offline") for name, p in sub.choices.items()}
    assert "exits 3 naming each missing wheel by name==version with its lock file and line" in offline["realize"]
    assert offline["run"].startswith("realize what the runner needs without fetching")
    assert offline["verify"].startswith("with --repair, realize the roots again without fetching")
    for name in ("gc", "show", "status", "export", "import", "env", "completion"):
        assert f"changes nothing: {name} fetches nothing" in str(offline[name]), offline[name]
    assert len(set(offline.values())) == len(offline)  # no command repeats another's wording


# shell completion ------------------------------------------------------------------------------------------------
def test_completion_scripts_generate_for_bash_and_zsh_and_bash_completes_commands_and_files(tmp_path: Path) -> None:
    scripts = {}
    for shell in ("bash", "zsh"):
        p = subprocess.run([sys.executable, "-m", "hermetic", "completion", shell], capture_output=True, text=True,
                           cwd=REPO, timeout=60)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        scripts[shell] = p.stdout
    assert scripts["zsh"].startswith("#compdef hermetic")
    for name in ("realize", "gc", "verify", "show", "export", "import", "env", "run", "completion", "--dry-run",
                 "--offline"):
        assert name in scripts["zsh"] and name in scripts["bash"], name
    path = tmp_path / "hermetic.bash"
    path.write_text(scripts["bash"])
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    (tmp_path / "work" / "recipes").mkdir(parents=True)
    (tmp_path / "work" / "recipes" / "p2p.toml").write_text("")

    def complete(*words: str) -> list[str]:
        script = (f"source {path}; COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
                  f"_shtab_hermetic hermetic {words[-1]} {words[-2]}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path / "work")
        return p.stdout.split()

    assert complete("hermetic", "rea") == ["realize"]
    assert complete("hermetic", "realize", "--dry") == ["--dry-run"]
    assert "recipes/p2p.toml" in complete("hermetic", "realize", "recipes/p")
    assert complete("hermetic", "completion", "z") == ["zsh"]


# CI runs every test --------------------------------------------------------------------------------------------
def test_a_test_whose_tool_is_missing_skips_here_and_fails_in_ci(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_setup  # noqa: F401\n")
    (tmp_path / "test_tool.py").write_text(
        "import pytest\n\n@pytest.mark.needs('frobnicator', False, 'apt-get install frobnicator')\n"
        "def test_it():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HERMETIC_REQUIRE_ALL")}
    env["PYTHONPATH"] = str(REPO)

    def pytest_run(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-W",
                               "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
                              capture_output=True, text=True, env={**env, **extra}, cwd=tmp_path, timeout=120)

    here = pytest_run({})
    assert here.returncode == 0 and "1 skipped" in here.stdout and "apt-get install frobnicator" in here.stdout
    for extra in ({"HERMETIC_REQUIRE_ALL": "1"}, {"CI": "true"}):
        ci = pytest_run(extra)
        assert ci.returncode == 1 and "skipped" not in ci.stdout, ci.stdout
        assert "frobnicator is not installed" in ci.stdout and "runs every test" in ci.stdout


def test_the_readme_set_up_installs_what_the_tests_need() -> None:
    readme = (REPO / "README.md").read_text()
    assert "tools/install-test-deps && python3 -m pip install -e '.[dev]' torch==2.14.1 && python3 -m pytest -q" \
        in readme
    script = (REPO / "tools" / "install-test-deps").read_text()
    assert "nginx-light" in script and "bubblewrap" in script and os.access(REPO / "tools" / "install-test-deps",
                                                                             os.X_OK)
    ci = (REPO / ".ci" / "run").read_text()
    assert "tools/install-test-deps" in ci and "HERMETIC_REQUIRE_ALL=1" in ci
    assert subprocess.run(["bash", "-n", str(REPO / "tools" / "install-test-deps")]).returncode == 0
