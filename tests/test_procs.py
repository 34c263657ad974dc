"""Children under the reaper with a time limit: a real GNU patch that hangs (blocked opening a FIFO nobody
will write again) and a real tool that never answers are stopped at their limit, and nothing of them
survives; patch is the system's, whatever PATH says. The session's limit and a program that cannot start
behave the same inside the sandbox (bubblewrap, where it is installed). A background probe (the qualification,
the import check) cancelled stops at once, even one whose process had not started yet."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermetic import procs, sandbox
from hermetic.errors import BadInput, PreconditionFailed
from hermetic.extensions import toolchain
from hermetic.extensions.sources import apply_patch
from hermetic.procs import BackgroundProbe, Limits, TimedOut, exec_failure, run_limited
from hermetic.root import Root
from tests.support.reliability import live_commands, survivors

DIFF = """\
--- a/a.txt
+++ b/a.txt
@@ -1 +1 @@
-old
+new
"""


def _alive_with(needle: str) -> list[str]:
    """Live processes whose command line holds ``needle`` (zombies are dead)."""
    return [f"{pid}: " + cmd.replace(b"\0", b" ").decode(errors="replace")
            for pid, cmd in live_commands().items() if needle.encode() in cmd]


Where = Callable[[], contextlib.AbstractContextManager[object]]


@pytest.fixture(params=["bare", "sandbox"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    """Children started bare, or inside the sandbox of a root of the test's own."""
    if request.param == "bare":
        yield contextlib.nullcontext
        return
    if sandbox.bwrap_path()[0] is None:
        pytest.skip("bubblewrap is not installed here")
    root = Root(tmp_path / "sandbox-root")
    root.ensure()
    yield sandbox.choose(root, "required", "--sandbox", tmp_path / "locks").confined


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("old\n")
    return tree


def test_a_patch_that_hangs_is_stopped_at_its_limit(tmp_path: Path) -> None:
    """A FIFO as a patch (the way a patch hung before: hermetic read it once, patch's open then waited for a
    writer forever) is refused before patch runs, naming it (attack34 finding 4); the session's limit itself is
    test_run_limited_stops_the_whole_session_at_the_limit's."""
    tree = _tree(tmp_path)
    fifo = tmp_path / "stuck.diff"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(BadInput) as caught:
        apply_patch(fifo, tree, {"PATH": "/usr/bin:/bin"}, timeout=1.5)
    assert time.monotonic() - t0 < 5
    assert "not a regular file (a FIFO)" in caught.value.what and str(fifo) in str(caught.value.where)
    assert _alive_with(str(fifo)) == []
    assert (tree / "a.txt").read_text() == "old\n"


def test_patch_is_the_systems_whatever_path_says(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tmp_path / "p.diff").write_text(DIFF)
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "fake-ran"
    (fake / "patch").write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    os.chmod(fake / "patch", 0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{fake}:{old}"
    try:
        apply_patch(tmp_path / "p.diff", tree, {"PATH": f"{fake}:/usr/bin:/bin"})
    finally:
        os.environ["PATH"] = old
    assert (tree / "a.txt").read_text() == "new\n" and not marker.exists()


def test_a_tool_that_never_answers_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Root(tmp_path / "root")
    root.ensure()
    monkeypatch.setattr(toolchain, "TOOL_TIMEOUT_S", 1.0)
    # a real program that never answers, asked the way nvcc --version is asked
    t0 = time.monotonic()
    with pytest.raises(PreconditionFailed) as caught:
        toolchain._cached_output(root, Path("/bin/sleep"), ["3583"], str.strip)
    assert "did not answer within 1 s" in caught.value.what
    assert time.monotonic() - t0 < 10
    assert survivors(root.path) == [] and _alive_with("sleep\x003583") == []


def test_run_limited_stops_the_whole_session_at_the_limit(tmp_path: Path, where: Where) -> None:
    # the child starts a grandchild in the background: the limit stops both (the session, not one pid)
    script = f"sleep 3571 & echo started; wait # {tmp_path}"
    with where(), pytest.raises(TimedOut) as caught:
        run_limited(["sh", "-c", script], cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}, limits=Limits(),
                    on_line=lambda _line: None, timeout=1.0)
    assert caught.value.tail == ["started"]
    assert _alive_with(str(tmp_path)) == [] and _alive_with("sleep\x003571") == []
    rc, tail = run_limited(["sh", "-c", "echo quick"], cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"},
                           limits=Limits(), on_line=lambda _line: None, timeout=30)
    assert (rc, tail) == (0, ["quick"])


def test_a_patch_that_does_not_apply_says_so_in_patchs_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(tmp_path)
    (tree / "a.txt").write_text("other\n")
    (tmp_path / "p.diff").write_text(DIFF)
    monkeypatch.chdir(tmp_path)  # relative paths: patch runs inside the tree
    with pytest.raises(BadInput) as caught:
        apply_patch(Path("p.diff"), Path("tree"), {"PATH": "/usr/bin:/bin"})
    assert "Hunk #1 FAILED" in caught.value.what and (tree / "a.txt").read_text() == "other\n"


def test_a_program_that_cannot_start_is_said_plainly(tmp_path: Path, where: Where) -> None:
    with where():
        rc, tail = run_limited([str(tmp_path / "no-such-nvcc"), "--version"], cwd=str(tmp_path),
                               env={"PATH": "/usr/bin:/bin"}, limits=Limits(), on_line=lambda _line: None)
    assert exec_failure(rc, tail) == f"cannot run {tmp_path / 'no-such-nvcc'}: No such file or directory"
    root = Root(tmp_path / "root")
    root.ensure()
    with where(), pytest.raises(PreconditionFailed, match="cannot run .*no-such-nvcc"):
        toolchain._cached_output(root, tmp_path / "no-such-nvcc", ["--version"], str.strip)


SLOW_PROBE = "import sys, time; time.sleep(30); print('hermetic-probe-result: {}')"


@pytest.mark.parametrize("moment", ["before its process starts", "while its process runs"])
def test_a_cancelled_background_probe_stops_at_once(tmp_path: Path, moment: str) -> None:
    # a realize that fails while the qualification probe (or the import check) imports torch must not wait for
    # it: cancel kills the probe's process, and one cancelled before its process started is killed as it starts
    marker = f"probe-{os.getpid()}-{moment.split()[0]}"
    for _ in range(3 if moment.startswith("before") else 1):  # the moment is a few milliseconds wide
        probe = BackgroundProbe([sys.executable, "-c", SLOW_PROBE, marker], env=dict(os.environ),
                                cwd=str(tmp_path), name="test-probe")
        probe.start()
        if moment.startswith("while"):
            end = time.monotonic() + 30
            while not _alive_with(marker):
                assert time.monotonic() < end, "the probe never started"
                time.sleep(0.02)
        began = time.monotonic()
        probe.cancel()
        assert time.monotonic() - began < 10, "cancel waited for the probe"
        assert probe.join()[0] is None and not probe.alive()
        assert _alive_with(marker) == []
    # cancelled before it was started: it never runs
    idle = BackgroundProbe([sys.executable, "-c", SLOW_PROBE, marker], env=dict(os.environ), cwd=str(tmp_path),
                           name="test-probe")
    idle.cancel()
    idle.start()
    idle.wait()
    assert idle.join() == (None, "") and _alive_with(marker) == []


def _detaching_script(tmp_path: Path, target: Path, tag: str, *, hold_output: bool) -> Path:
    """A child that starts a process outside its session (setsid, as a compiler server or a launcher's
    daemon does) which writes into ``target`` a second later and lives on; the child itself exits at once."""
    script = tmp_path / f"detach-{tag}.sh"
    redirect = "</dev/null" if hold_output else "</dev/null >/dev/null 2>&1"
    ready = target.parent / f"ready-{tag}"   # inside the root: writable in the sandbox too
    script.write_text("#!/bin/sh\n"
                      f"setsid sh -c 'touch {ready}; sleep 1; echo late > {target}; exec sleep 3559' {redirect} &\n"
                      f"while [ ! -e {ready} ]; do sleep 0.02; done\n"   # it has left the session: now end
                      "echo started\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("hold_output", [False, True], ids=["quiet", "holding-output"])
def test_a_process_a_child_detaches_does_not_outlive_it(tmp_path: Path, where: Where, hold_output: bool,
                                                       request: pytest.FixtureRequest) -> None:
    """attack34 finding 8: a process that left the child's session (setsid) is stopped when the child ends: by
    the pid namespace in the sandbox, by its mark outside it (and listed in procs.ESCAPED); one that holds the
    child's output open does not keep the command waiting. Before: it lived on (sleep 3559) and wrote into the
    root after the command had returned; holding the output, run_limited waited for it."""
    target = tmp_path / "sandbox-root" / "late.txt"
    target.parent.mkdir(exist_ok=True)
    boxed = request.node.callspec.params["where"] == "sandbox"
    script = _detaching_script(tmp_path, target, f"{boxed}-{hold_output}", hold_output=hold_output)
    before = len(getattr(procs, "ESCAPED", []))
    t0 = time.monotonic()
    with where():
        rc, tail = run_limited([str(script)], cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}, limits=Limits(),
                               on_line=lambda _line: None, timeout=60)
    took = time.monotonic() - t0
    assert (rc, tail) == (0, ["started"]) and took < 20, (rc, tail, took)
    time.sleep(2.5)
    assert _alive_with("sleep\x003559") == [] and _alive_with(str(script)) == []
    assert not target.exists(), "the detached process wrote into the root after its child ended"
    found = getattr(procs, "ESCAPED", [])[before:]
    if boxed:   # the namespace ended with the child: nothing was left for the mark to find
        assert found == [], found
    else:       # found by its mark, stopped, and kept for the audit
        assert found and all(e.left_by == script.name for e in found), found
        assert any("3559" in e.command or "sleep 1" in e.command for e in found), found


def test_a_child_flooding_one_endless_line_costs_hermetic_bounded_memory(tmp_path: Path) -> None:
    """Outside attack on issue 41, F8: setup.py printing 800 MB without a newline pushed hermetic (outside the
    sandbox) to 2.5 GB. Output is read in pieces of procs.MAX_LINE at most and the tail keeps 4000 characters a
    line: 400 MB of one line costs well under 100 MB more than hermetic itself."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import resource, sys\n"
        "from hermetic.procs import Limits, run_limited\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "seen = [0]\n"
        "def on_line(line):\n"
        "    seen[0] += len(line)\n"
        "rc, tail = run_limited([sys.executable, '-c', 'import os\\nb = b\"x\" * (1 << 20)\\n"
        "for _ in range(400): os.write(1, b)'], cwd='.', env={'PATH': '/usr/bin:/bin'}, limits=Limits(),\n"
        "                       on_line=on_line)\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base\n"
        "print(rc, seen[0], max(map(len, tail)), grew)\n")
    p = __import__("subprocess").run([sys.executable, str(probe)], capture_output=True, text=True, cwd=tmp_path,
                                     env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                                     timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rc, seen, longest, grew_kib = map(int, p.stdout.split())
    assert (rc, seen) == (0, 400 << 20)
    assert longest <= procs.TAIL_LINE + 4 and grew_kib < 100 * 1024, (longest, grew_kib)


def test_a_probes_result_longer_than_a_tail_line_is_read_whole(tmp_path: Path) -> None:
    """The tail keeps procs.TAIL_LINE characters a line; a probe's result line is taken whole (an interpreter's
    probe answers ~4 KB of JSON: cut at the tail's limit, every realize naming another interpreter failed with
    an internal JSONDecodeError)."""
    value = "y" * (procs.TAIL_LINE * 5)
    code = f"import json; print('noise'); print({procs.RESULT_MARK!r} + json.dumps({{'v': {value!r}}}))"
    result, text = procs.run_probe([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    assert result == {"v": value} and text == "noise"


def test_setup_pys_output_in_many_long_lines_costs_hermetic_bounded_memory(tmp_path: Path) -> None:
    """The re-attack on issue 41, R4: recipe new kept setup.py's last 400 lines whole, so 800 lines of 1 MB grew
    hermetic by 800 MB. The capture keeps them cut as the tail's (procs.TAIL_LINE): 300 lines of 1 MB cost well
    under 100 MB, and the capture still says it found no record."""
    flood = tmp_path / "flood"
    flood.write_text("#!/bin/sh\nexec python3 -c 'import os\nb = b\"x\" * (1 << 20) + b\"\\n\"\n"
                     "for _ in range(300): os.write(1, b)'\n")
    flood.chmod(0o755)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from hermetic.extensions.derive import run_capture\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    run_capture(sys.argv[1], Path('.'), {'PATH': '/usr/bin:/bin'}, 'none', '')\n"
        "    said = 'none'\n"
        "except Exception as e:\n"
        "    said = type(e).__name__ + ('-0-records' if 'gave 0 records' in str(e) else '')\n"
        "print(said, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)\n")
    p = __import__("subprocess").run([sys.executable, str(probe), str(flood)], capture_output=True, text=True,
                                     cwd=tmp_path, timeout=300,
                                     env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert p.returncode == 0, p.stderr[-2000:]
    said, grew_kib = p.stdout.split()
    assert said == "BadInput-0-records" and int(grew_kib) < 100 * 1024, (said, grew_kib)


def test_hermetics_own_helpers_never_load_bytecode_from_the_childrens_cache(tmp_path: Path) -> None:
    """The re-attack's B2: a compile planted a forged .pyc of the standard library's json in the bytecode cache
    (PYTHONPYCACHEPREFIX) its domain's children share; the limits shim of the next child (python -S, which
    imports json) loaded it and changed that child's command. hermetic's helpers run with -E: the forged .pyc,
    valid for json's source, is never loaded; a child that is Python itself still uses the cache."""
    import importlib.util
    import json as real_json
    from importlib._bootstrap_external import _code_to_timestamp_pyc  # type: ignore[attr-defined]
    source = Path(real_json.__file__)
    mark = tmp_path / "payload-ran"
    code = compile(f"open({str(mark)!r}, 'a').write('ran\\n')\n" + source.read_text(), str(source), "exec")
    st = source.stat()
    prefix = tmp_path / "pycache"
    cached = Path(importlib.util.cache_from_source(str(source)).replace("/__pycache__", ""))
    forged = prefix / str(cached).lstrip("/")
    forged = forged.with_name(f"__init__.{sys.implementation.cache_tag}.pyc")
    forged.parent.mkdir(parents=True)
    forged.write_bytes(_code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPYCACHEPREFIX": str(prefix)}
    rc, _tail = run_limited(["/bin/true"], cwd=str(tmp_path), env=env, limits=Limits(), on_line=lambda _line: None)
    assert rc == 0 and not mark.exists()
    # nor a json.py in the current folder (a build folder a child writes: the final re-attack's B2b); nor
    # does a probe (PYC_GUARD's programs: the import check, the torch probe) import from there
    cwd = tmp_path / "build"
    cwd.mkdir()
    (cwd / "json.py").write_text(f"open({str(mark)!r}, 'a').write('cwd\\n')\n")
    rc, _tail = run_limited(["/bin/true"], cwd=str(cwd), env=env, limits=Limits(), on_line=lambda _line: None)
    assert rc == 0 and not mark.exists()
    result, _text = procs.run_probe([sys.executable, "-E", "-c", procs.PYC_GUARD + "import json\nprint("
                                     f"{procs.RESULT_MARK!r} + json.dumps(1))"], env={"PATH": "/usr/bin:/bin"},
                                    cwd=str(cwd))
    assert result == 1 and not mark.exists()
    # the control: a Python child that imports json does load it (the forgery is a real one)
    rc, _tail = run_limited([sys.executable, "-c", "import json"], cwd=str(tmp_path), env=env, limits=Limits(),
                            on_line=lambda _line: None)
    assert rc == 0 and mark.read_text() == "ran\n"


def test_a_refused_write_names_the_path_the_child_was_refused(tmp_path: Path) -> None:
    """How programs say EROFS: the shell names the path before the words, Python after them. A line that names
    other files first (setup.py's capture record, printed whole and JSON-escaped, naming capture.py in its frames)
    still names the refused path (41 N4: the message named capture.py for a write into the kernel cache)."""
    from hermetic.procs import refused_write
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "state").mkdir(parents=True)
    outside.mkdir()
    script, planted = outside / "capture.py", root / "state" / "kernels" / "planted.py"
    script.write_text("")
    writable, read_only = [str(root)], [str(root / "state")]
    assert refused_write(f"sh: 1: cannot create {outside}/x: Read-only file system", writable) == f"{outside}/x"
    assert refused_write(f"sh: 1: cannot create {outside}/sp ace: Read-only file system", writable) == \
        f"{outside}/sp ace"   # dash names it bare (attack47 row 8: named {outside}/sp)
    assert refused_write(f"bash: {outside}/a b c: Read-only file system", writable) == f"{outside}/a b c"
    assert refused_write(f"OSError: [Errno 30] Read-only file system: '{outside}/y'", writable) == f"{outside}/y"
    record = json.dumps({"frames": [{"file": str(script), "line": 3}],
                         "error": f"[Errno 30] Read-only file system: '{planted}'"})
    assert refused_write(json.dumps(record), writable, read_only) == str(planted)   # escaped twice, as printed
    assert refused_write(record, writable, read_only) == str(planted)
    assert refused_write(f"{script}: Read-only file system", writable) == str(script)
    assert refused_write(f"{root}/ok: Read-only file system", writable) is None   # a writable place: not ours
    assert refused_write(f"cannot create {outside}/z", writable) is None
