"""Settings and hermetic.toml (docs/config.md): one order, each step of it shown by setting two places at once;
strict files; the docs' table checked against the code; a realize taking its jobs from the winner and its
receipt saying which won."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from hermetic.config import PRECEDENCE, SETTINGS
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, recipe_toml, write_recipe

# one value of jobs per place, so the winner is read off the number
PLACES = {"command line": 11, "environment": 12, "recipe or runner file": 13, "project": 14, "user": 15,
          "system": 16}


def _setup(tmp_path: Path, places: set[str]) -> tuple[Hermetic, Path, list[str]]:
    """A recipe inside a repository (its project file a folder above it), a user and a system file: jobs set
    in ``places`` only; the arguments for `hermetic config`."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    folder = repo / "recipes" / "team"
    folder.mkdir(parents=True)
    recipe = folder / "r.toml"
    (folder / "r.lock.txt").write_text("")
    recipe.write_text(recipe_toml("r", locks=["r.lock.txt"], jobs=PLACES["recipe or runner file"]
                                  if "recipe or runner file" in places else None))
    (tmp_path / "hermetic.toml").write_text("jobs = 99\n")   # above the repository: never read
    if "project" in places:
        (repo / "hermetic.toml").write_text(f"# the team's\njobs = {PLACES['project']}\n")
    user = tmp_path / "xdg" / "hermetic" / "hermetic.toml"
    user.parent.mkdir(parents=True)
    if "user" in places:
        user.write_text(f"jobs = {PLACES['user']}\n")
    system = tmp_path / "etc" / "hermetic.toml"
    system.parent.mkdir()
    if "system" in places:
        system.write_text(f'sandbox = "off"\njobs = {PLACES["system"]}\n')
    env = hermetic_env(tmp_path / "home", extra={"XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                                                 "HERMETIC_SYSTEM_CONFIG": str(system)})
    if "environment" in places:
        env["HERMETIC_JOBS"] = str(PLACES["environment"])
    args = ["config", str(recipe), "--json"]
    if "command line" in places:
        args += ["-j", str(PLACES["command line"])]
    return Hermetic(tmp_path / "root", env), recipe, args


@pytest.mark.parametrize("upper", PRECEDENCE[:-1])
def test_each_step_of_the_order_beats_the_next(tmp_path: Path, upper: str) -> None:
    lower = PRECEDENCE[PRECEDENCE.index(upper) + 1]
    h, _recipe, args = _setup(tmp_path, {upper, lower})
    r = h(*args)
    assert r.rc == 0, r.err
    jobs = r.result["settings"]["jobs"]
    assert (jobs["level"], jobs["value"]) == (upper, PLACES[upper]), (upper, lower, jobs)
    if upper != "system" and lower != "default":
        # the loser is there: alone, it wins
        alone = _setup(tmp_path / "alone", {lower})
        r = alone[0](*alone[2])
        assert r.result["settings"]["jobs"]["value"] == PLACES.get(lower, os.cpu_count()), r.out


def test_where_each_value_came_from_is_said(tmp_path: Path) -> None:
    h, recipe, args = _setup(tmp_path, {"project", "system"})
    r = h(*args)
    s = r.result["settings"]
    assert s["jobs"]["origin"] == f"{tmp_path / 'repo' / 'hermetic.toml'}:2: key jobs"
    assert s["sandbox"] == {"value": "off", "level": "system", "origin": f"{tmp_path / 'etc' / 'hermetic.toml'}:1: "
                                                                        "key sandbox"}
    assert s["remote.mode"] == {"value": "ro", "level": "default", "origin": "the default"}
    assert [(f["level"], f["found"]) for f in r.result["files"]] == [("project", True), ("user", False),
                                                                      ("system", True)]
    # the environment: the first variable named wins (HERMETIC_JOBS over torch's MAX_JOBS); MAX_JOBS alone counts
    both = h(*args, env={"HERMETIC_JOBS": "5", "MAX_JOBS": "6"}).result["settings"]["jobs"]
    assert (both["value"], both["origin"]) == (5, "HERMETIC_JOBS")
    assert h(*args, env={"MAX_JOBS": "6"}).result["settings"]["jobs"]["origin"] == "MAX_JOBS"
    # paths in a file are the file's folder's; a URL's credentials are never shown
    user = tmp_path / "xdg" / "hermetic" / "hermetic.toml"
    user.write_text('trusted_keys = ["team.pub", "/keys/other.pub"]\nlock_dir = "locks"\n'
                    '[remote]\nurl = "https://me:secret@cache.example/c/"\nmode = "rw"\n')
    r = h(*args)
    s = r.result["settings"]
    assert s["trusted_keys"]["value"] == f"{user.parent / 'team.pub'}:/keys/other.pub"
    assert s["lock_dir"] == {"value": str(user.parent / "locks"), "level": "user", "origin": f"{user}:2: key lock_dir"}
    assert s["remote.url"]["value"] == "https://***@cache.example/c/" and "secret" not in r.out + r.err
    assert (s["remote.mode"]["value"], s["remote.mode"]["origin"]) == ("rw", f"{user}:5: key remote.mode")
    user.unlink()
    # for people: a line per setting with its origin
    text = h("config", recipe).out
    assert re.search(r"^jobs +14 +\(project: .*hermetic\.toml:2: key jobs\)$", text, re.M), text
    assert re.search(r"^remote\.mode +ro +\(default: ro\)$", text, re.M), text


def test_a_bad_file_names_its_file_and_line(tmp_path: Path) -> None:
    h, recipe, args = _setup(tmp_path, {"project"})
    project = tmp_path / "repo" / "hermetic.toml"
    cases = {"jobs = 4\njbos = 3\n": (2, "unknown key 'jbos' at the top level"),
             'jobs = "many"\n': (1, "jobs must be a whole number from 1 to 1024"),
             "[remote]\nurl = 'http://c.example/'\nmod = 'rw'\n": (3, "unknown key 'mod' in [remote]"),
             'sandbox = "sometimes"\n': (1, "sandbox must be one of auto, required, off"),
             "jobs = [\n": (1, "invalid TOML")}
    for text, (line, what) in cases.items():
        project.write_text(text)
        for argv in (args, ["realize", str(recipe), "--json"]):
            r = h(*argv)
            assert r.rc == 2, (text, r.err)
            assert f"{project}:{line}" in r.err and what in r.err, (text, r.err)
            assert r.result["error"]["kind"] == "bad-input" and "Traceback" not in r.err
    assert not (tmp_path / "root" / "store").exists()   # the realize stopped before it made a store
    project.unlink()
    r = h(*args, env={"HERMETIC_JOBS": "lots"})
    assert r.rc == 2 and "HERMETIC_JOBS must be a whole number" in r.err, r.err


def test_the_docs_table_is_the_code() -> None:
    doc = (REPO / "docs" / "config.md").read_text()
    order = re.findall(r"^\d\. (.+)$", doc, re.M)
    assert tuple(order) == PRECEDENCE
    rows = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    assert sorted(rows) == sorted(SETTINGS)
    for key, (_k, option, env, file_key, default) in rows.items():
        spec = SETTINGS[key]
        assert option == (f"`{spec.option}`" if spec.option else "-"), key
        assert env == ", ".join(f"`{v}`" for v in spec.env), key
        assert file_key.replace("`", "") == (spec.file_key or "-"), key
        assert default == spec.default_text, key


def test_jobs_from_the_command_line_beat_the_recipe_and_the_receipt_says_so(tmp_path: Path, hermetic: Hermetic,
                                                                            index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    pinned = write_recipe(tmp_path / "repo", "pinned", pip_lock_line(a))
    pinned.write_text(recipe_toml("pinned", locks=["pinned.lock.txt"], jobs=2))
    (tmp_path / "repo" / ".git").mkdir()
    r = hermetic("realize", pinned, "-j", "3", "--json", check=True)
    receipt = json.loads(Path(r.result["receipt"]).read_text())
    assert receipt["jobs"] == {"value": 3, "level": "command line", "from": "-j/--jobs"}
    # a recipe that says nothing: the project's hermetic.toml over the user's
    (tmp_path / "repo" / "hermetic.toml").write_text("jobs = 5\n")
    xdg = tmp_path / "xdg" / "hermetic"
    xdg.mkdir(parents=True)
    (xdg / "hermetic.toml").write_text("jobs = 7\n")
    free = write_recipe(tmp_path / "repo", "free", pip_lock_line(a))
    r = hermetic("realize", free, "--json", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}, check=True)
    receipt = json.loads(Path(r.result["receipt"]).read_text())
    assert receipt["jobs"] == {"value": 5, "level": "project", "from": f"{tmp_path / 'repo' / 'hermetic.toml'}:1: "
                                                                       "key jobs"}


def test_a_remote_cache_and_a_sandbox_from_the_project_reach_the_realize(tmp_path: Path) -> None:
    h, recipe, _args = _setup(tmp_path, set())
    (tmp_path / "repo" / "hermetic.toml").write_text('sandbox = "required"\n[remote]\nurl = "http://127.0.0.1:9/c/"\n')
    r = h("realize", recipe, "--offline", "--json", env={"HERMETIC_BWRAP": str(tmp_path / "no-bwrap")})
    # the project's sandbox = "required" where no bwrap can be had: exit 3, naming the file that asked for it
    assert r.rc == 3 and f"{tmp_path / 'repo' / 'hermetic.toml'}:1: key sandbox" in r.err, r.err
    r = h("realize", recipe, "--offline", "--json", "--sandbox", "off")
    (remote,) = [x for x in r.records if x.get("event") == "remote"]
    assert remote["message"] == "offline: the remote cache http://127.0.0.1:9/c is not used", remote


def test_a_runner_file_sits_between_the_environment_and_the_project(tmp_path: Path) -> None:
    import shutil
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    for folder in ("runner", "manifests", "recipes"):
        shutil.copytree(REPO / folder, repo / folder)
    runner = repo / "runner" / "worker.toml"
    text = runner.read_text()
    assert "\n[gpu]\n" in text
    runner.write_text(text.replace("\n[gpu]\n", '\n[gpu]\nlock_dir = "/run/lock/team"\nsandbox = "off"\n', 1))
    (repo / "hermetic.toml").write_text('lock_dir = "/var/lock/project"\nsandbox = "required"\n')
    h = Hermetic(tmp_path / "root", hermetic_env(tmp_path / "home"))
    s = h("config", runner, "--json").result["settings"]
    line = runner.read_text().splitlines().index('lock_dir = "/run/lock/team"') + 1
    assert s["lock_dir"] == {"value": "/run/lock/team", "level": "recipe or runner file",
                             "origin": f"{runner}:{line}: key gpu.lock_dir"}
    assert (s["sandbox"]["value"], s["sandbox"]["level"]) == ("off", "recipe or runner file")
    s = h("config", runner, "--json", env={"HERMETIC_LOCK_DIR": "/tmp/env-locks"}).result["settings"]
    assert (s["lock_dir"]["value"], s["lock_dir"]["level"]) == ("/tmp/env-locks", "environment")
    runner.write_text(text)
    s = h("config", runner, "--json").result["settings"]
    assert (s["lock_dir"]["value"], s["lock_dir"]["level"]) == ("/var/lock/project", "project")
    assert (s["sandbox"]["value"], s["sandbox"]["level"]) == ("required", "project")
