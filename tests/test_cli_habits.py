"""Habits users bring from uv, pip and nix (issue 38), through the real command line: `realize --check`, colour
and progress switches on a real pseudo-terminal, -vv and -qq, usage errors as a JSON record."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO, Hermetic, command
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe
from tests.support.terminal import PtyReader

SGR = re.compile(r"\x1b\[[0-9;]*m")   # colour
BAR = "━"                              # rich's bar


def _on_terminal(h: Hermetic, root: Path, *args: str | Path, env: dict[str, str] | None = None
                 ) -> tuple[int, str, str]:
    """hermetic with its stderr on a real pty (stdout a pipe, as `hermetic ... | cat`): rc, stdout, stderr."""
    pty = PtyReader()
    p = subprocess.run(command(root, *args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=pty.slave,
                       env={**h.env, **(env or {})}, cwd=REPO, text=True, timeout=300)
    return p.returncode, p.stdout, pty.finish()


def test_check_on_a_fresh_root_and_after_a_realize(tmp_path: Path, hermetic: Hermetic,
                                                   index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    r = hermetic("realize", recipe, "--check")
    assert r.rc == 4, r.err
    # the plan's summary; a pip hash lock gives no size and --check asks no index: unknown, and said so
    assert "check: env1 is not up to date" in r.out
    assert re.search(r"^  fetch +alpha==1\.0 +size unknown", r.out, re.M), r.out
    assert "would fetch 1 wheel (size unknown), unpack 1" in r.out
    assert index.state.requests == [], "--check asked the index"
    assert not (hermetic.root / "store").exists(), "--check wrote under the root"
    j = hermetic("realize", recipe, "--check", "--json")
    assert j.rc == 4 and [x.get("event") for x in j.records] == ["plan", None], j.out
    res = j.result
    assert (res["ok"], res["exit_code"], res["check"], res["changed"]) == (False, 4, True, True)
    assert [w["label"] for w in res["plan"]["wheels"] if w["action"] == "fetch"] == ["alpha==1.0"]
    assert res["plan"]["fetch_bytes_unknown"] == 1
    # it never fetches: offline it answers the same (not "3: must fetch")
    assert hermetic("realize", recipe, "--check", "--offline").rc == 4
    assert hermetic("realize", recipe, "--check", "--dry-run").rc == 2

    hermetic("realize", recipe, check=True)
    served = len(index.state.requests)
    r = hermetic("realize", recipe, "--check")
    assert (r.rc, r.out) == (0, "check: env1 is up to date\n"), r.err
    assert hermetic("realize", recipe, "--check", "--json").result["exit_code"] == 0
    assert len(index.state.requests) == served
    # as cheap as a no-op realize: the pipeline and the planners are not even imported
    probe = ("import sys\nfrom hermetic.cli.main import main\nrc = main(sys.argv[1:])\n"
             "print(rc, sorted(m for m in sys.modules if m.startswith(('hermetic.realize.', 'hermetic.wheels'))))")
    p = subprocess.run([sys.executable, "-c", probe, "--root", str(hermetic.root), "realize", str(recipe), "--check"],
                       capture_output=True, text=True, env=hermetic.env, cwd=REPO, timeout=60)
    assert p.stdout.splitlines()[-1] == "0 ['hermetic.realize.noop']", p.stdout + p.stderr


def test_colour_and_progress_on_a_real_terminal(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    # a terminal: bars, and colour (the bar's)
    rc, _out, err = _on_terminal(hermetic, tmp_path / "bars", "realize", recipe)
    assert rc == 0 and BAR in err and SGR.search(err), repr(err)
    # --no-progress: no bar on the terminal, the same plain lines a pipe gets
    rc, _out, err = _on_terminal(hermetic, tmp_path / "plain", "realize", recipe, "--no-progress")
    assert rc == 0 and BAR not in err and "fetched alpha-1.0-py3-none-any.whl" in err, repr(err)
    assert "\x1b[?25l" not in err   # the live display hides the cursor: it never started
    rc, _out, err = _on_terminal(hermetic, tmp_path / "plain2", "realize", recipe, "--no-progress", "--color", "never")
    assert rc == 0 and "\x1b" not in err, repr(err)
    rc, _out, err = _on_terminal(hermetic, tmp_path / "plain3", "realize", recipe,
                                 env={"HERMETIC_NO_PROGRESS": "1", "NO_COLOR": "1"})
    assert rc == 0 and "\x1b" not in err and "fetched" in err, repr(err)

    # an error: coloured on a terminal (auto), not under NO_COLOR or --color never, and --color always wins
    # over both a pipe and NO_COLOR (the command line over the environment)
    missing = tmp_path / "missing.toml"
    rc, _out, err = _on_terminal(hermetic, tmp_path / "e", "realize", missing)
    assert rc == 2 and "\x1b[1;31merror:\x1b[0m" in err, repr(err)
    for args, env in ((["--color", "never"], {}), ([], {"NO_COLOR": "1"}), (["--no-color"], {})):
        rc, _out, err = _on_terminal(hermetic, tmp_path / "e", "realize", missing, *args, env=env)
        assert rc == 2 and "\x1b" not in err and err.startswith("error: "), (args, env, repr(err))
    assert "\x1b" not in hermetic("realize", missing).err   # a pipe: no colour
    assert "\x1b[1;31merror:" in hermetic("realize", missing, env={"FORCE_COLOR": "1"}).err
    r = hermetic("realize", missing, "--color", "always", env={"NO_COLOR": "1"})
    assert r.err.startswith("\x1b[1;31merror:\x1b[0m "), repr(r.err)


def test_debug_and_errors_only(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    r = hermetic("realize", recipe, "-vv", root=tmp_path / "debug", check=True)
    debug = [line for line in r.err.splitlines() if line.startswith("debug: ")]
    # each child's command line, exit status and time, and each step's time
    assert any(re.search(r": exit \d+, \d+\.\d\d s$", line) for line in debug), r.err
    assert any(re.fullmatch(r"debug: qualify [\d.]+ s; fetch [\d.]+ s; .*total [\d.]+ s", line)
               for line in debug), r.err
    assert not [line for line in hermetic("realize", recipe, "-v", root=tmp_path / "v", check=True).err.splitlines()
                if line.startswith("debug: ")]
    # -qq: errors only; -q still says warnings
    r = hermetic("realize", recipe, "-qq", root=tmp_path / "silent", check=True)
    assert r.err == "", r.err
    r = hermetic("realize", tmp_path / "missing.toml", "-qq")
    assert r.rc == 2 and r.err.startswith("error: "), r.err


def test_usage_errors_under_json_are_one_record(tmp_path: Path, hermetic: Hermetic) -> None:
    recipe = tmp_path / "r.toml"
    for argv in (["realize", "--json", "--bogus", recipe], ["--json", "realize"],
                 ["realize", recipe, "--json", "-j", "0"], ["--json", "-q", "-v", "show"], ["--json", "frobnicate"],
                 ["--json"], ["realize", recipe, "--json", "--color", "purple"]):
        r = hermetic(*argv)
        assert r.rc == 2, (argv, r.err)
        lines = r.out.splitlines()
        assert len(lines) == 1, (argv, r.out)
        record = json.loads(lines[0])
        assert (record["ok"], record["exit_code"], record["error"]["kind"]) == (False, 2, "usage"), record
        assert record["error"]["what"] and "Traceback" not in r.err
        assert record["result"] == ("realize" if "realize" in argv else "show" if "show" in argv else "")
        without = hermetic(*[a for a in argv if a != "--json"])
        assert without.rc == 2 and without.out == "", (argv, without.out)
