"""The sandbox (hermetic/sandbox.py, procs.confined): bubblewrap detected once and cached, a child's write
outside the root refused at once with an error naming the path, the setting's three modes (required exits 3
where no sandbox can be had), and the receipt saying whether the sandbox was used and why not. The real
bwrap of this machine, and fake ones (shell scripts) for a bwrap that is broken or does not confine."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from hermetic import procs, sandbox
from hermetic.config import Config
from hermetic.errors import BadInput, PreconditionFailed, SandboxRefused
from hermetic.procs import Limits, run_limited
from hermetic.root import Root
from tests.support.index import LoopbackIndex
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe

needs_bwrap = pytest.mark.skipif(sandbox.bwrap_path()[0] is None, reason="bubblewrap is not installed here")


def _root(tmp_path: Path) -> Root:
    root = Root(tmp_path / "root")
    root.ensure()
    return root


def _fake_bwrap(tmp_path: Path, body: str) -> Path:
    """A script standing in for bwrap; it logs every call to calls.log beside it."""
    exe = tmp_path / "fake-bwrap"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls.log"}\n{body}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _calls(tmp_path: Path) -> int:
    log = tmp_path / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_the_mode_comes_from_the_command_line_then_the_environment_then_the_file(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMETIC_SANDBOX", raising=False)
    none = Config([])

    def mode(*args: str | None) -> tuple[str, str]:
        s = none.resolve("sandbox", *args)
        return s.value, s.origin
    assert mode(None) == ("auto", "the default")
    assert mode(None, "off", "r.toml:3: key limits.sandbox") == ("off", "r.toml:3: key limits.sandbox")
    monkeypatch.setenv("HERMETIC_SANDBOX", "required")
    assert mode(None, "off", "r.toml") == ("required", "HERMETIC_SANDBOX")
    assert mode("off", "auto", "r.toml") == ("off", "--sandbox")
    monkeypatch.setenv("HERMETIC_SANDBOX", "sometimes")
    with pytest.raises(BadInput, match="HERMETIC_SANDBOX must be one of auto, required, off"):
        mode(None)


def test_a_missing_bwrap_says_why_and_required_is_a_failed_precondition(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root(tmp_path)
    monkeypatch.setenv("HERMETIC_BWRAP", str(tmp_path / "no-such-bwrap"))
    sb = sandbox.choose(root, "auto", "the default", tmp_path / "locks")
    assert not sb.used and sb.record() == {"mode": "auto", "set_by": "the default", "used": False,
                                           "why_not": f"HERMETIC_BWRAP names {tmp_path / 'no-such-bwrap'}, which "
                                                      f"is not an executable file"}
    with pytest.raises(PreconditionFailed) as e:
        sandbox.choose(root, "required", "--sandbox", tmp_path / "locks")
    assert e.value.exit_code == 3 and e.value.where == "--sandbox" and "apt-get install bubblewrap" in str(e.value.hint)
    off = sandbox.choose(root, "off", "HERMETIC_SANDBOX", tmp_path / "locks")
    assert off.record()["why_not"] == "sandbox = off (HERMETIC_SANDBOX)"


def test_a_bwrap_that_does_not_confine_or_cannot_start_is_found_out_and_asked_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root(tmp_path)
    # runs the command after "--" as it is: the probe's write outside the root lands, and is taken back
    loose = _fake_bwrap(tmp_path, 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"')
    monkeypatch.setenv("HERMETIC_BWRAP", str(loose))
    found = sandbox.detect(root, tmp_path / "locks")
    assert not found.works and "its write outside the root was not refused" in found.why, found
    assert not list(tmp_path.glob(".hermetic-sandbox-probe-*"))
    calls = _calls(tmp_path)
    assert sandbox.detect(root, tmp_path / "locks") == found and _calls(tmp_path) > calls  # a no is asked again
    # a bwrap that cannot set up its namespace says so first and exits 1
    (tmp_path / "b").mkdir()
    broken = _fake_bwrap(tmp_path / "b", 'echo "bwrap: Creating new namespace failed: Operation not permitted" >&2; '
                                         'exit 1')
    monkeypatch.setenv("HERMETIC_BWRAP", str(broken))
    found = sandbox.detect(root, tmp_path / "locks")
    assert not found.works and "Creating new namespace failed: Operation not permitted" in found.why, found
    assert json.dumps(sandbox.choose(root, "auto", "the default", tmp_path / "locks").record())


@needs_bwrap
def test_the_real_bwrap_works_here_and_its_answer_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMETIC_BWRAP", raising=False)
    root = _root(tmp_path)
    sb = sandbox.choose(root, "required", "--sandbox", tmp_path / "locks")
    rec = sb.record()
    assert rec["used"] and rec["tool"] == sandbox.bwrap_path()[0] and rec["version"].startswith("bubblewrap")
    assert rec["writable"] == [str(root.path)] and rec["refused"] == []  # the lock folder stays read-only
    assert len(list(root.cache_dir("sandbox").glob("*.json"))) == 1


@needs_bwrap
def test_a_child_writing_to_home_or_tmp_fails_at_once_naming_the_path(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMETIC_BWRAP", raising=False)
    root = _root(tmp_path)
    locks = tmp_path / "locks"
    locks.mkdir()
    home_cache = tmp_path / "real-home" / ".cache"   # the HOME hermetic was started with: not the child's
    home_cache.mkdir(parents=True)
    sb = sandbox.choose(root, "auto", "the default", locks)
    env = root.child_env({"PATH": "/usr/bin:/bin"})
    write = "import sys\nfor p in sys.argv[1:]:\n    open(p, 'w').write('x')\n"
    # the lock folder may be any folder a setting names (issue 34): inside, it is read-only like the rest
    leaks = (home_cache / "leak.bin", Path("/tmp") / f"hermetic-sandbox-test-{os.getpid()}", locks / "planted.so")
    for leak in leaks:
        with sb.confined(), pytest.raises(SandboxRefused) as e:
            run_limited([sys.executable, "-c", write, str(leak)], cwd=str(root.tmp), env=env, limits=Limits(),
                        on_line=lambda _line: None)
        assert e.value.where == str(leak) and e.value.exit_code == 1, e.value.render()
        assert "Read-only file system" in e.value.what and "--sandbox off" in str(e.value.hint)
        assert not leak.exists()
    # inside the root it writes; a child that carries on after a refusal is listed too
    carry_on = "import sys\ntry:\n    open(sys.argv[1], 'w')\nexcept OSError as e:\n    print(e)\n" \
               "open(sys.argv[2], 'w').write('x')\n"
    with sb.confined():
        rc, _tail = run_limited([sys.executable, "-c", carry_on, str(home_cache / "x"), str(root.tmp / "ok")],
                                cwd=str(root.tmp), env=env, limits=Limits(), on_line=lambda _line: None)
    assert rc == 0 and (root.tmp / "ok").exists() and not any(locks.iterdir())
    assert [r["path"] for r in sb.record()["refused"]] == [*map(str, leaks), str(home_cache / "x")]
    assert procs.SPANS[-1].confined and procs.SPANS[-1].program == os.path.basename(sys.executable)


def test_the_gpu_nodes_are_bound_into_the_sandbox_where_they_exist(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(sandbox, "GPU_DEVICES", (str(tmp_path / "nvidiactl"), str(tmp_path / "nvidia[0-9]*"),
                                                 str(tmp_path / "nvidia-uvm"), str(tmp_path / "nvidia-modeset")))
    devices = sandbox.gpu_devices()
    assert devices == tuple(str(tmp_path / n) for n in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"))
    args = sandbox.prefix("/usr/bin/bwrap", ("/r", "/locks"), devices)
    assert args[:11] == ("/usr/bin/bwrap", "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--dev",
                         "/dev", "--proc", "/proc", "--bind") and args[-1] == "--"
    assert " ".join(args).count("--dev-bind-try") == 4 and "--bind-try /locks /locks" in " ".join(args)


def test_realize_required_exits_3_where_no_sandbox_can_be_had_and_auto_says_why_in_the_receipt(
        tmp_path: Path, index: LoopbackIndex) -> None:
    from tests.support.cli import Hermetic, hermetic_env
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    env = hermetic_env(tmp_path / "home", extra={"PIP_INDEX_URL": index.simple_url,
                                                  "HERMETIC_BWRAP": str(tmp_path / "no-bwrap")})
    h = Hermetic(tmp_path / "root", env)
    r = h("realize", recipe, "--sandbox", "required")
    assert r.rc == 3, r.err
    assert "error: --sandbox: sandbox = required, and no sandbox can be had here: HERMETIC_BWRAP names" in r.err
    assert "hint: install bubblewrap" in r.err and "Traceback" not in r.err
    r = h("realize", recipe, "--json")
    assert r.rc == 0, r.err
    receipt = json.loads(Path(r.result["receipt"]).read_text())
    assert receipt["sandbox"]["used"] is False and "HERMETIC_BWRAP names" in receipt["sandbox"]["why_not"]
    assert any(rec.get("event") == "sandbox" for rec in r.records)


@needs_bwrap
def test_one_failed_probe_does_not_turn_the_sandbox_off_for_good_and_says_no_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """attack34 finding 9: a read-only ROOT/tmp once made the probe fail with a Python traceback, the "no" was
    cached, and every later command ran without the sandbox. Now the probe says why in one line, and the next
    command asks again (a yes is cached)."""
    monkeypatch.delenv("HERMETIC_BWRAP", raising=False)
    root = _root(tmp_path)
    # the probe's file inside the root cannot be written once (a folder is in its place: root or not)
    in_the_way = root.tmp / f"sandbox-probe-{os.getpid()}"
    in_the_way.mkdir(parents=True)
    found = sandbox.detect(root, tmp_path / "locks")
    in_the_way.rmdir()
    assert not found.works and "Traceback" not in found.why and 'File "' not in found.why, found.why
    assert "Is a directory" in found.why, found.why
    again = sandbox.detect(root, tmp_path / "locks")
    assert again.works, again.why
    assert len(list(root.cache_dir("sandbox").glob("*.json"))) == 1


@needs_bwrap
def test_the_probe_tests_the_records_read_only_and_no_network_and_falls_back_to_the_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs with the sandbox's own arguments: the root's records read-only (a write into store/ must
    meet EROFS) and --unshare-net. A bwrap that cannot unshare the network (here: one that refuses the option,
    as a kernel without unprivileged network namespaces does) still gives the sandbox, with the machine's
    network, and the record says why; one that binds the store writable is no sandbox."""
    monkeypatch.delenv("HERMETIC_BWRAP", raising=False)
    real = sandbox.bwrap_path()[0]
    root = _root(tmp_path)
    sb = sandbox.choose(root, "required", "--sandbox", tmp_path / "locks")
    rec = sb.record()
    assert rec["network"] == "none" and "network_why" not in rec, rec
    assert str(root.path / "store") in rec["read_only"] and str(root.path / "profiles") in rec["read_only"]
    assert "--unshare-net" in sb.confinement.prefix if sb.confinement else False
    no_net = tmp_path / "no-net"
    no_net.mkdir()
    fake = _fake_bwrap(no_net, 'for a in "$@"; do [ "$a" = --unshare-net ] && { echo "bwrap: No permissions to '
                               f'create new namespace" >&2; exit 1; }}; done; exec {real} "$@"')
    monkeypatch.setenv("HERMETIC_BWRAP", str(fake))
    root2 = _root(tmp_path / "r2")
    sb = sandbox.choose(root2, "required", "--sandbox", tmp_path / "locks")
    rec = sb.record()
    assert rec["used"] and rec["network"] == "host", rec
    assert "cannot take the network from a child here (--unshare-net): bwrap: No permissions" in rec["network_why"], rec
    # a cluster's realize keeps the network, and says why
    sb = sandbox.choose(_root(tmp_path / "r3"), "required", "--sandbox", tmp_path / "locks",
                        network="a build cluster compiles")
    assert sb.record()["network"] == "host" and sb.record()["network_why"] == "a build cluster compiles"
    # a bwrap that leaves the store writable (every --ro-bind-try dropped) is found out
    loose = tmp_path / "loose"
    loose.mkdir()
    strip = loose / "strip.py"
    strip.write_text("import os, sys\nargs, out, i = sys.argv[2:], [], 0\nend = args.index('--')\n"
                     "while i < len(args):\n    if i < end and args[i] == '--ro-bind-try':\n        i += 3\n"
                     "        continue\n    out.append(args[i])\n    i += 1\n"
                     "os.execv(sys.argv[1], [sys.argv[1], *out])\n")
    fake = _fake_bwrap(loose, f'exec {sys.executable} {strip} {real} "$@"')
    monkeypatch.setenv("HERMETIC_BWRAP", str(fake))
    found = sandbox.detect(_root(tmp_path / "r4"), tmp_path / "locks")
    assert not found.works and "its write into the root's store was not refused" in found.why, found


@needs_bwrap
def test_a_child_writing_into_the_roots_records_fails_naming_them(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 (F2): inside the root, the store, profiles, gc roots, receipts, derived state and the marker are
    read-only; a child that fails after writing there is told so by name (not as a write outside the root),
    and `hermetic run`'s kernel bucket stays writable to its measuring process alone (the final re-attack's B3:
    a stranger's setup.py planted kernels there)."""
    monkeypatch.delenv("HERMETIC_BWRAP", raising=False)
    root = _root(tmp_path)
    sb = sandbox.choose(root, "auto", "the default", tmp_path / "locks")
    env = root.child_env({"PATH": "/usr/bin:/bin"})
    write = "import sys\nfor p in sys.argv[1:]:\n    open(p, 'a').write('x')\n"
    for target in (root.store / "planted", root.profiles / "planted", root.roots / "planted.json",
                   root.receipts / "planted.json", root.state / "planted", root.path / "HERMETIC_ROOT",
                   root.path / "runs" / "planted"):
        before = target.read_bytes() if target.exists() else None
        with sb.confined(), pytest.raises(SandboxRefused) as e:
            run_limited([sys.executable, "-c", write, str(target)], cwd=str(root.tmp), env=env, limits=Limits(),
                        on_line=lambda _line: None)
        assert e.value.where == str(target) and "which only hermetic itself writes" in e.value.what, e.value.render()
        assert (target.read_bytes() if target.exists() else None) == before
    kernels, theirs = (sandbox.kernel_cache(root, d) / "k" for d in ("run-x", "run-y"))
    with sb.confined(), pytest.raises(SandboxRefused) as e:
        run_limited([sys.executable, "-c", write, str(kernels)], cwd=str(root.tmp), env=env, limits=Limits(),
                    on_line=lambda _line: None)
    assert e.value.where == str(kernels) and not kernels.exists(), e.value.render()
    run = sandbox.choose(root, "auto", "the default", tmp_path / "locks", domain="run-x", kernels=True)
    with run.confined():
        rc, _tail = run_limited([sys.executable, "-c", write, str(kernels), str(root.path / "build-x")],
                                cwd=str(root.tmp), env=env, limits=Limits(), on_line=lambda _line: None)
    assert rc == 0 and kernels.read_text() == "x" and (root.path / "build-x").exists()
    # another runner's kernel cache is not this runner's to write: its package could plant code the other loads
    with run.confined(), pytest.raises(SandboxRefused) as e:
        run_limited([sys.executable, "-c", write, str(theirs)], cwd=str(root.tmp), env=env, limits=Limits(),
                    on_line=lambda _line: None)
    assert e.value.where == str(theirs) and not theirs.exists(), e.value.render()
    # runs/: the folder of the run being measured is its measuring process's to write, an earlier run's is not
    # (a compile or a later run rewrote an earlier run's report.md and results.json before)
    earlier, now = root.path / "runs" / "draft-1", root.path / "runs" / "draft-2"
    for folder in (earlier, now):
        folder.mkdir()
        (folder / "results.json").write_text("{}")
    run.let_write(now)
    assert str(now) in run.record()["writable"] and str(root.path / "runs") in run.record()["read_only"]
    with run.confined():
        rc, _tail = run_limited([sys.executable, "-c", write, str(now / "results.json")], cwd=str(now), env=env,
                                limits=Limits(), on_line=lambda _line: None)
    assert rc == 0 and (now / "results.json").read_text() == "{}x"
    with run.confined(), pytest.raises(SandboxRefused) as e:
        run_limited([sys.executable, "-c", write, str(earlier / "results.json")], cwd=str(now), env=env,
                    limits=Limits(), on_line=lambda _line: None)
    assert e.value.where == str(earlier / "results.json") and "which only hermetic itself writes" in e.value.what
    assert (earlier / "results.json").read_text() == "{}"
