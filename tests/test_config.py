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
    other = tmp_path / "keys" / "other"   # real key files: `config` checks the files it shows
    assert h("key", "generate", user.parent / "team").rc == 0 and h("key", "generate", other).rc == 0
    user.write_text(f'trusted_keys = ["team.pub", "{other}.pub"]\nlock_dir = "locks"\n'
                    '[remote]\nurl = "https://me:secret@cache.example/c/"\nmode = "rw"\n')
    r = h(*args)
    s = r.result["settings"]
    assert s["trusted_keys"]["value"] == f"{user.parent / 'team.pub'}:{other}.pub", r.err
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
    from hermetic.root import lock_dir
    machine = str(lock_dir(None))   # a runner may name only the machine's lock folder (the re-attack on 38)
    runner.write_text(text.replace("\n[gpu]\n", f'\n[gpu]\nlock_dir = "{machine}"\nsandbox = "off"\n', 1))
    (repo / "hermetic.toml").write_text('sandbox = "required"\n')
    h = Hermetic(tmp_path / "root", hermetic_env(tmp_path / "home"))
    s = h("config", runner, "--json").result["settings"]
    line = runner.read_text().splitlines().index(f'lock_dir = "{machine}"') + 1
    assert s["lock_dir"] == {"value": machine, "level": "recipe or runner file",
                             "origin": f"{runner}:{line}: key gpu.lock_dir"}
    assert (s["sandbox"]["value"], s["sandbox"]["level"]) == ("off", "recipe or runner file")
    s = h("config", runner, "--json", env={"HERMETIC_LOCK_DIR": "/tmp/env-locks"}).result["settings"]
    assert (s["lock_dir"]["value"], s["lock_dir"]["level"]) == ("/tmp/env-locks", "environment")
    runner.write_text(text)
    s = h("config", runner, "--json").result["settings"]
    assert s["lock_dir"]["level"] == "default"
    assert (s["sandbox"]["value"], s["sandbox"]["level"]) == ("required", "project")


def test_a_project_file_may_not_trust_keys_the_user_file_may(tmp_path: Path) -> None:
    """A repository's hermetic.toml is at the recipe's trust: it cannot name trusted keys (they vouch for what
    enters every recipe's store); the user's file can."""
    h, recipe, args = _setup(tmp_path, set())
    project = tmp_path / "repo" / "hermetic.toml"
    project.write_text('jobs = 2\ntrusted_keys = ["evil.pub"]\n')
    for argv in (args, ["realize", str(recipe), "--json"]):
        r = h(*argv)
        assert r.rc == 2, (argv, r.err)
        assert f"{project}:2: key trusted_keys" in r.err and "cannot be set in a project's hermetic.toml" in r.err
        assert "Traceback" not in r.err
    project.write_text("jobs = 2\n")
    user = tmp_path / "xdg" / "hermetic" / "hermetic.toml"
    assert h("key", "generate", user.parent / "team").rc == 0
    user.write_text('trusted_keys = ["team.pub"]\n')
    s = h(*args).result["settings"]["trusted_keys"]
    assert (s["value"], s["level"]) == (str(user.parent / "team.pub"), "user"), s


def test_a_file_another_user_can_change_is_not_read(tmp_path: Path) -> None:
    """As git refuses a repository another user owns: a hermetic.toml of another owner, or one every user may
    write, is exit 2 naming it; a FIFO or a folder in its place is exit 2 at once, never a wait."""
    h, recipe, args = _setup(tmp_path, set())
    project = tmp_path / "repo" / "hermetic.toml"
    project.write_text('sandbox = "off"\n')
    os.chown(project, 65534, 65534)
    r = h(*args)
    assert r.rc == 2 and f"the project configuration {project} belongs to uid 65534" in r.err, r.err
    os.chown(project, os.geteuid(), os.getegid())
    project.chmod(0o666)
    r = h("realize", str(recipe), "--json")
    assert r.rc == 2 and f"{project} is writable by every user (mode 666)" in r.err, r.err
    project.chmod(0o644)
    assert h(*args).rc == 0
    project.unlink()
    os.mkfifo(project)
    r = h(*args, timeout=60)
    assert r.rc == 2 and "not a regular file (a FIFO)" in r.err and str(project) in r.err, r.err
    project.unlink()
    project.mkdir()
    r = h(*args)
    assert r.rc == 2 and "not a regular file (a folder)" in r.err, r.err


def test_a_build_cluster_is_a_setting_like_the_others(tmp_path: Path) -> None:
    """`dist` in the one order: a project's hermetic.toml names the cluster, the environment beats it, the
    command line beats both, and `off` anywhere above builds here."""
    h, recipe, args = _setup(tmp_path, set())
    (tmp_path / "repo" / "hermetic.toml").write_text('dist = "http://127.0.0.1:9"\n')
    s = h(*args).result["settings"]["dist"]
    assert (s["value"], s["level"]) == ("http://127.0.0.1:9", "project"), s
    s = h(*args, env={"HERMETIC_DIST": "http://127.0.0.2:9"}).result["settings"]["dist"]
    assert (s["value"], s["level"]) == ("http://127.0.0.2:9", "environment"), s
    s = h(*args, "--dist", "off", env={"HERMETIC_DIST": "http://127.0.0.2:9"}).result["settings"]["dist"]
    assert (s["value"], s["level"]) == ("off", "command line"), s
    # a realize that builds takes it from the project file, but the token goes only to a cluster the user
    # named: the repository's alone is not used (a warning); named in the user's file too, it is the user's
    from hermetic.config import load
    from hermetic.errors import BadInput
    from hermetic.extensions.dist import resolve_dist
    env = {"HOME": str(tmp_path / "home"), "HERMETIC_SYSTEM_CONFIG": "", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    alone = resolve_dist(None, {"HERMETIC_DIST_TOKEN": "t"}, None, config=load(recipe.parent, env))
    assert alone is not None and alone.withheld and not alone.token, alone
    (tmp_path / "xdg" / "hermetic" / "hermetic.toml").write_text('dist = "http://127.0.0.1:9/"\n')
    both = load(tmp_path / "repo" / "recipes", env)
    chosen = resolve_dist(None, {"HERMETIC_DIST_TOKEN": "t"}, None, config=both)
    assert chosen is not None and not chosen.withheld and chosen.token == "t", chosen
    with pytest.raises(BadInput, match=r"needs its client token") as e:
        resolve_dist(None, {}, None, config=both)
    assert e.value.where == f"{tmp_path / 'repo' / 'hermetic.toml'}:1: key dist"


def test_the_audit_watches_the_lock_folder_a_hermetic_toml_chose(tmp_path: Path, hermetic: Hermetic,
                                                                  index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "repo", "r", pip_lock_line(a))
    (tmp_path / "repo" / ".git").mkdir()
    user = tmp_path / "xdg" / "hermetic" / "hermetic.toml"
    user.parent.mkdir(parents=True)
    user.write_text('lock_dir = "team-locks"\n')
    r = hermetic("realize", recipe, "--json", env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}, check=True)
    audit = json.loads(Path(r.result["receipt"]).read_text())["outside_root_audit"]
    assert audit["excluded"] == [f"{user.parent / 'team-locks'}/*.lock"], audit["excluded"]


class _Recorder:
    """A loopback HTTP server standing in for a repository's remote cache: every request's method, path and
    Authorization header recorded; GET and HEAD are misses, PUT is taken."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, code: int) -> None:
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                self._answer(404)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(404)

            def do_PUT(self) -> None:  # noqa: N802
                self._answer(201)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cache"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_repositorys_remote_cache_gets_no_token_and_cannot_make_the_users_cache_writable(
        tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    """HERMETIC_REMOTE_CACHE_TOKEN goes only to a cache the user named: a repository's hermetic.toml (or recipe)
    naming its own server gets no token; a repository's mode = "rw" does not make the user's cache writable;
    credentials in a project's URL are refused."""
    recorder = _Recorder()
    try:
        a = make_pkg(tmp_path / "whl", "alpha", "1.0")
        index.add(a.path)
        repo = tmp_path / "repo"
        recipe = write_recipe(repo, "r", pip_lock_line(a))
        (repo / ".git").mkdir()
        project = repo / "hermetic.toml"
        project.write_text(f'[remote]\nurl = "{recorder.url}"\nmode = "rw"\n')
        token = {"HERMETIC_REMOTE_CACHE_TOKEN": "team-secret-1"}
        r = hermetic("realize", recipe, "--json", env=token)
        assert r.rc == 0, r.err
        assert recorder.seen and not any(auth for _m, _p, auth in recorder.seen), recorder.seen
        assert "HERMETIC_REMOTE_CACHE_TOKEN is not sent to" in r.err, r.err
        # nor is its own cache written: a repository never makes a cache writable (re-attack: 127.0.0.1 for the
        # user's localhost made it "the repository's" and writable)
        assert not [m for m, _p, _a in recorder.seen if m == "PUT"], recorder.seen
        assert "a repository cannot make a cache writable" in r.err, r.err
        # the user names the same server: the token goes there, and the repository's rw is still the repository's
        recorder.seen.clear()
        xdg = tmp_path / "xdg" / "hermetic"
        xdg.mkdir(parents=True)
        (xdg / "hermetic.toml").write_text(f'[remote]\nurl = "{recorder.url}"\n')
        hermetic("gc", "--drop-root", "r", check=True)
        r = hermetic("realize", recipe, "--json", env={**token, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
        assert r.rc == 0 and recorder.seen, r.err
        assert all(auth == "Bearer team-secret-1" for _m, _p, auth in recorder.seen), recorder.seen
        # the user's cache from the environment, the repository asking rw: read-only, said, nothing PUT
        recorder.seen.clear()
        project.write_text('[remote]\nmode = "rw"\n')
        hermetic("gc", "--drop-root", "r", check=True)
        r = hermetic("realize", recipe, "--json", env={**token, "HERMETIC_REMOTE_CACHE": recorder.url})
        assert r.rc == 0, r.err
        assert recorder.seen and not [m for m, _p, _a in recorder.seen if m == "PUT"], recorder.seen
        assert "a repository cannot make a cache writable" in r.err, r.err
        project.write_text('[remote]\nurl = "http://u:pw@127.0.0.1:9/c"\n')
        hermetic("gc", "--drop-root", "r", check=True)   # a no-op realize reads no configuration file
        r = hermetic("realize", recipe, "--json")
        assert r.rc == 2 and "carries credentials" in r.err and f"{project}:2" in r.err, r.err
    finally:
        recorder.server.shutdown()


def test_hostile_strings_in_a_file_are_bad_input_and_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    h, recipe, args = _setup(tmp_path, set())
    project = tmp_path / "repo" / "hermetic.toml"
    project.write_text("jobs = " + "[" * 20000 + "]" * 20000 + "\n")   # tomllib recursed: RecursionError, exit 1
    r = h(*args)
    assert r.rc == 2 and "nested too deeply" in r.err and "Traceback" not in r.err, r.err[-2000:]
    project.write_text('[remote]\nurl = "http://a\\u0000b/"\n')         # NUL: a traceback after the work
    r = h("realize", recipe, "--json")
    assert r.rc == 2 and "holds a control character" in r.err and f"{project}:2" in r.err, r.err
    project.write_text('sandbox = "auto"\n')
    r = h("realize", recipe, env={"HERMETIC_JOBS": "3_0"})
    assert r.rc == 2 and "HERMETIC_JOBS must be a whole number" in r.err, r.err
    # an escape sequence a repository puts where a message quotes it is written out, never sent raw
    project.write_text('[remote]\nurl = "http://127.0.0.1:9/\\u001b[2K\\u001b[1Gx"\n')
    r = h("config", str(recipe))
    assert "\x1b" not in r.out + r.err, (r.out + r.err)
    from hermetic.reporter import printable
    assert printable("sandbox \x1b[2K\x1b[1Gauto\r\x9b\x00") == "sandbox \\x1b[2K\\x1b[1Gauto\\x0d\\x9b\\x00"


def test_a_lock_folder_a_setting_names_is_never_made(tmp_path: Path) -> None:
    """hermetic makes only its default lock folders (1777): one a setting names (a repository's lock_dir
    among them) must exist, else exit 2; nothing is made there."""
    from hermetic.errors import BadInput
    from hermetic.reporter import Reporter
    from hermetic.run.devices import take_lock
    named = tmp_path / "victim" / ".local" / "bin"
    with pytest.raises(BadInput, match="does not exist: hermetic makes only its default lock folders"):
        take_lock(named, "cpu-x.lock", 1.0, Reporter(), "the CPU")
    assert not (tmp_path / "victim").exists()


def test_the_lock_folder_is_the_machines(tmp_path: Path) -> None:
    """A project's hermetic.toml may not name the lock folder (exit 2); a runner's gpu.lock_dir that differs
    from the one the user's or system's file names is exit 2 before any lock is taken (a repository's runs
    would skip the locks every other run takes)."""
    import shutil
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    for folder in ("runner", "manifests", "recipes"):
        shutil.copytree(REPO / folder, repo / folder)
    project = repo / "hermetic.toml"
    project.write_text('lock_dir = "/tmp/elsewhere"\n')
    h = Hermetic(tmp_path / "root", hermetic_env(tmp_path / "home", extra={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}))
    runner = repo / "runner" / "worker.toml"
    r = h("config", runner)
    assert r.rc == 2 and f"{project}:1: key lock_dir" in r.err and "the lock folder is the machine's" in r.err, r.err
    project.unlink()
    machine = tmp_path / "machine-locks"
    machine.mkdir()
    (tmp_path / "xdg" / "hermetic").mkdir(parents=True)
    (tmp_path / "xdg" / "hermetic" / "hermetic.toml").write_text(f'lock_dir = "{machine}"\n')
    runner.write_text(runner.read_text().replace("\n[gpu]\n", f'\n[gpu]\nlock_dir = "{tmp_path / "mine"}"\n', 1))
    r = h("config", runner)   # hermetic run takes the same check before any lock (its GPU run needs a GPU)
    assert r.rc == 2 and "is not the machine's" in r.err and "key gpu.lock_dir" in r.err, r.err[-3000:]
    assert not (tmp_path / "mine").exists() and not list(machine.iterdir())


def test_credentials_in_a_bad_value_are_never_echoed_and_dist_follows_no_redirect(tmp_path: Path) -> None:
    h, recipe, args = _setup(tmp_path, set())
    project = tmp_path / "repo" / "hermetic.toml"
    project.write_text('[remote]\nmode = "https://me:hunter2@cache.example/"\n')
    r = h(*args)
    assert r.rc == 2 and "remote.mode must be one of" in r.err and "hunter2" not in r.out + r.err, r.err
    r = h("realize", recipe, "--dist", "http://me:hunter2@127.0.0.1:9/x", env={"HERMETIC_DIST_TOKEN": "t"})
    assert r.rc == 2 and "hunter2" not in r.out + r.err, r.err
    project.write_text('[remote]\nurl = "http://127.0.0.1:9/c?token=hunter2"\n')
    r = h(*args)
    assert r.rc == 2 and "has a query or fragment" in r.err and "hunter2" not in r.out + r.err, r.err
    # a scheduler that redirects: the token is never sent to where it points
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _go(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/api/v1/scheduler/status"):
                body = b'{"num_cpus": 4, "num_servers": 1}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path.startswith("/elsewhere"):
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_response(302)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

        do_GET = do_POST = _go  # noqa: N815

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from hermetic.extensions.dist import DistSettings, preflight
        cluster = preflight(DistSettings(f"http://127.0.0.1:{server.server_address[1]}", "--dist", "tok"))
        assert not cluster.usable and "302" in cluster.why, cluster
        assert not [p for p, _a in seen if p.startswith("/elsewhere")], seen
    finally:
        server.shutdown()


def test_a_recipe_cannot_be_named_as_another_recipes_toolchain_profile(tmp_path: Path) -> None:
    from hermetic.errors import BadInput
    from hermetic.recipe import load_recipe
    (tmp_path / "r.lock.txt").write_text("")
    recipe = tmp_path / "r.toml"
    recipe.write_text(recipe_toml("exl3.toolchain", locks=["r.lock.txt"]))
    with pytest.raises(BadInput, match="ends in '.toolchain'"):
        load_recipe(recipe)


def test_check_and_dry_run_refuse_what_a_realize_refuses(tmp_path: Path) -> None:
    """Issue 38, attack findings 4 and 4b: `realize --check` said 4 ("work needed") and `--dry-run` 0 where the
    realize says 2. Now the three answer a bad setting alike (exit 2, the same words) and write nothing; on an
    up-to-date recipe all three give the no-op's answer, which no setting changes (docs/config.md)."""
    h, recipe, _args = _setup(tmp_path, set())
    project = tmp_path / "repo" / "hermetic.toml"
    root = tmp_path / "root"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("the user's\n")
    cases: list[tuple[str, dict[str, str], Path | None, str]] = [
        ("jobs = 1000000000\n", {}, None, f"{project}:1: key jobs"),
        ('[remote]\nurl = "http://127.0.0.1:9/c/"\nmode = "wr"\n', {}, None, f"{project}:3: key remote.mode"),
        ('[remote]\nurl = "ftp://127.0.0.1/c/"\n', {}, None, f"{project}:2: key remote.url"),
        ('lock_dir = ""\n', {}, None, f"{project}:1: key lock_dir"),
        ("", {"HERMETIC_SANDBOX": "maybe"}, None, "HERMETIC_SANDBOX"),
        ("", {"HERMETIC_JOBS": "abc"}, None, "HERMETIC_JOBS"),
        ("", {"MAX_JOBS": "0"}, None, "MAX_JOBS"),
        ("", {}, mine, str(mine)),   # a --root of the user's files, no marker: never made a root
    ]
    for text, env, other, where in cases:
        project.write_text(text)
        answers = []
        for mode in ([], ["--check"], ["--dry-run"]):
            r = h("realize", recipe, "--json", *mode, env=env, root=other)
            assert r.rc == 2, (text, env, mode, r.rc, r.err)
            assert r.result["error"]["kind"] == "bad-input" and "Traceback" not in r.err, r.err
            assert r.result["error"]["where"] == where, (text, env, mode, r.result["error"])
            answers.append(r.result["error"]["what"])
        assert len(set(answers)) == 1, answers   # the realize's words
        assert not root.exists(), (text, env)    # nothing written: no root made
        assert sorted(p.name for p in mine.iterdir()) == ["precious.txt"]
    # an up-to-date recipe: the no-op realize reads no setting (none changes what it makes), nor does --check
    project.write_text("jobs = 2\n")
    assert h("realize", recipe).rc == 0
    project.write_text("jobs = 1000000000\n")
    for mode in ([], ["--check"], ["--dry-run"]):
        r = h("realize", recipe, *mode, env={"HERMETIC_SANDBOX": "maybe"})
        assert r.rc == 0, (mode, r.err)
    # work to do again (a lock edited): the settings are checked, and bad input wins over "work needed"
    (recipe.parent / "r.lock.txt").write_text("# edited\n")
    for mode in ([], ["--check"], ["--dry-run"]):
        r = h("realize", recipe, "--json", *mode)
        assert r.rc == 2 and r.result["error"]["where"] == f"{project}:1: key jobs", (mode, r.err)


def test_config_and_realize_check_the_remote_and_the_keys_before_the_root(tmp_path: Path) -> None:
    """Attack finding 7: a bad [remote] url or mode in a hermetic.toml, and a trusted_keys file that is missing, a
    folder or a FIFO, were shown by `hermetic config` (exit 0) and refused by realize only after it made the root.
    Now both are exit 2 naming file, line and key, and the root is not made."""
    h, recipe, args = _setup(tmp_path, set())
    project = tmp_path / "repo" / "hermetic.toml"
    root = tmp_path / "root"
    for text, line, key in (('[remote]\nurl = "http://u:SECRETPW@127.0.0.1:notaport/c"\n', 2, "remote.url"),
                            ('[remote]\nurl = "ftp://127.0.0.1/c"\n', 2, "remote.url"),
                            ('[remote]\nurl = "http:///c"\n', 2, "remote.url"),
                            ('jobs = 2\n[remote]\nurl = "http://127.0.0.1:9/c"\nmode = "wr"\n', 4, "remote.mode")):
        project.write_text(text)
        for argv in (args, ["realize", str(recipe), "--json"]):
            r = h(*argv)
            assert r.rc == 2, (text, argv, r.rc, r.err)
            assert f"{project}:{line}: key {key}" in r.err and "Traceback" not in r.err, (text, r.err)
            assert "SECRETPW" not in r.out + r.err
            assert not root.exists(), (text, argv)
    project.unlink()
    user = tmp_path / "xdg" / "hermetic" / "hermetic.toml"
    keys = tmp_path / "keys"
    keys.mkdir()
    os.mkfifo(keys / "fifo.pub")
    for name in ("missing.pub", ".", "fifo.pub"):
        user.write_text(f'trusted_keys = ["{keys / name}"]\n')
        for argv in (args, ["realize", str(recipe), "--json"]):
            r = h(*argv, timeout=60)
            assert r.rc == 2, (name, argv, r.rc, r.err)
            assert f"{user}:1: key trusted_keys" in r.err and "Traceback" not in r.err, (name, r.err)
            assert not root.exists(), (name, argv)
        r = h(*args, env={"HERMETIC_TRUSTED_KEYS": str(keys / name)}, timeout=60)
        assert r.rc == 2 and r.result["error"]["where"] == "HERMETIC_TRUSTED_KEYS", (name, r.err)


def test_a_link_a_folder_or_a_git_of_another_user_chooses_nothing(tmp_path: Path) -> None:
    """(re-attack on 38) The owner check covers the link at the file's name, the folders holding the name and
    the file, and the .git that marks a repository's top: another user's empty .git in a shared folder makes no
    repository (git's dubious ownership), so her hermetic.toml there is never the victim's project file."""
    h, recipe, args = _setup(tmp_path, set())
    repo = tmp_path / "repo"
    target = tmp_path / "theirs.toml"
    target.write_text('sandbox = "off"\n')
    project = repo / "hermetic.toml"
    project.symlink_to(target)
    os.lchown(project, 65534, 65534)
    r = h(*args)
    assert r.rc == 2 and f"{project}: the link belongs to uid 65534" in r.err, r.err
    project.unlink()
    shared = tmp_path / "shared"
    (shared / "team").mkdir(parents=True)
    (shared / "team" / "hermetic.toml").write_text('sandbox = "off"\n')
    project.symlink_to(shared / "team" / "hermetic.toml")
    os.chown(shared / "team", 65534, 65534)
    r = h(*args)
    assert r.rc == 2 and f"its folder {shared / 'team'} belongs to uid 65534" in r.err, r.err
    project.unlink()
    # another user's .git above: no repository, the recipe's folder alone; her hermetic.toml is not read
    (repo / ".git").rmdir()
    top = tmp_path / "top"
    (top / ".git").mkdir(parents=True)
    os.chown(top / ".git", 65534, 65534)
    (top / "hermetic.toml").write_text('sandbox = "off"\n')
    inner = top / "victim"
    inner.mkdir()
    (inner / "r.lock.txt").write_text("")
    (inner / "r.toml").write_text(recipe_toml("r", locks=["r.lock.txt"]))
    r = h("config", str(inner / "r.toml"), "--json")
    assert r.rc == 0 and r.result["settings"]["sandbox"]["level"] == "default", r.out
    os.chown(top / ".git", 0, 0)
    assert h("config", str(inner / "r.toml"), "--json").result["settings"]["sandbox"]["level"] == "project"


def test_odd_numbers_names_and_runner_lock_folders_are_refused(tmp_path: Path) -> None:
    """(re-attack on 38) -j takes ASCII digits only, as HERMETIC_JOBS does; a variant may not be named
    toolchain (NAME.toolchain is the toolchain's profile); a runner's gpu.lock_dir that is not the machine's
    default lock folder is exit 2 when no user or system file names one either."""
    h, recipe, _args = _setup(tmp_path, set())
    for bad in ("1_0", "+3", "\u0663", "\uff13"):
        r = h("config", str(recipe), "-j", bad.encode().decode("unicode_escape"))
        assert r.rc == 2, (bad, r.err)
    text = recipe.read_text()
    recipe.write_text(text + '\n[variants.toolchain]\n')
    r = h("realize", str(recipe), "--dry-run")
    assert r.rc == 2 and "variant name 'toolchain'" in r.err, r.err
    import shutil
    repo = tmp_path / "runs"
    (repo / ".git").mkdir(parents=True)
    for folder in ("runner", "manifests", "recipes"):
        shutil.copytree(REPO / folder, repo / folder)
    runner = repo / "runner" / "worker.toml"
    runner.write_text(runner.read_text().replace("\n[gpu]\n", f'\n[gpu]\nlock_dir = "{tmp_path / "mine"}"\n', 1))
    r = h("config", str(runner))
    assert r.rc == 2 and "is not the machine's" in r.err, r.err
