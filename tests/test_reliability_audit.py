"""The outside-root audit (hermetic/audit.py): honest about what it sees (planted writes are reported, the
root is not), bounded, JSON-ready in a stable order, and honest about whose each file is (``ours`` yes, no or
unknown, from the children's spans and the file itself; ``clean`` counts only ours); in every realize receipt,
where a realize with HOME and TMPDIR watched creates nothing outside the root, a child's real leak (a
compiler flag writing into HOME) fails at the write inside the sandbox and is reported as ours without it, and
another process's file is not ours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hermetic.audit as audit_mod
from hermetic import sandbox
from hermetic.audit import OutsideRootAudit
from tests.support import cli
from tests.support.cli import REPO
from tests.support.recipes import TOOLCHAIN_LOCK, recipe_toml
from tests.support.reliability import child_env, live_commands


def _places(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    home, tmp, cwd, root = (tmp_path / n for n in ("home", "tmp", "cwd", "work/root"))
    for d in (home / ".cache" / "pip", home / ".config", tmp / "old", cwd, root):
        d.mkdir(parents=True)
    (home / ".config" / "tool.ini").write_text("a = 1\n")
    (home / ".bashrc").write_text("# rc\n")
    (tmp / "old" / "gone.txt").write_text("x")
    return home, tmp, cwd, root


def test_planted_writes_are_reported_and_the_root_is_not(tmp_path: Path) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd)
    audit.start()
    (home / ".cache" / "pip" / "http").mkdir()
    (home / ".cache" / "pip" / "http" / "blob").write_text("cached")  # a new folder: reported at its top
    (home / ".nv" / "ComputeCache").mkdir(parents=True)                # a watched folder that did not exist
    (home / ".leaky-tool").write_text("x")                              # a new top-level entry of HOME
    (home / ".config" / "tool.ini").write_text("a = 2\n")               # an existing file rewritten
    (tmp / "tmpxft_0001").write_text("nvcc")
    (tmp / "old" / "gone.txt").unlink()
    (cwd / "__pycache__").mkdir()
    (root / "store").mkdir()                                            # inside the root: not outside
    (root / "store" / "blob").write_text("fine")
    result = audit.finish()
    assert json.loads(json.dumps(result)) == result
    assert result["created"] == sorted([str(cwd / "__pycache__"), str(home / ".cache" / "pip" / "http"),
                                        str(home / ".leaky-tool"), str(home / ".nv" / "ComputeCache"),
                                        str(tmp / "tmpxft_0001")])
    assert result["changed"] == [str(home / ".config" / "tool.ini")]
    assert result["removed"] == [str(tmp / "old" / "gone.txt")]
    # the whole time counted as an unsandboxed child's: the shallow places were not looked at below their depth
    assert result["clean"] is False and result["complete"] is False
    assert all("deep only" in u for u in result["unchecked"]) and len(result["unchecked"]) == 2, result["unchecked"]
    assert result["counts"]["created"] == 5 and result["truncated"] == []
    assert str(home) in result["watched"] and str(root) not in " ".join(result["created"])
    # told nothing of hermetic's children, the audit counts the whole time as one unsandboxed child's: every
    # file still there is ours, the removed one cannot be told
    ours = {f["path"]: f["ours"] for f in result["files"]}
    assert ours.pop(str(tmp / "old" / "gone.txt")) == "unknown" and set(ours.values()) == {"yes"}
    assert result["counts"]["ours"] == 6 and result["counts"]["unknown"] == 1


def _plant(home: Path, tmp: Path, cwd: Path) -> tuple[float, float, subprocess.Popen[bytes]]:
    """Files written during a child's span (t0..t1) and after it, one by another user, one held open."""
    t0 = time.time()
    (home / ".cache" / "leak.bin").write_text("ours")                       # this user, during the span
    (tmp / "other-user.txt").write_text("x")                                # during, but owned by nobody
    os.chown(tmp / "other-user.txt", 65534, 65534)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1], 'w')\nf.write('x')\n"
                               "f.flush()\nprint('open', flush=True)\ntime.sleep(60)", str(cwd / "held.log")],
                              stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
    (tmp / "during.txt").write_text("x")                                    # during, beside another writer
    (tmp / "old" / "gone.txt").unlink()
    t1 = time.time()
    time.sleep(0.3)
    (tmp / "after.txt").write_text("x")                                     # when no child ran
    return t0, t1, holder


def test_each_file_is_judged_ours_or_not_from_the_children_and_the_file(tmp_path: Path) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd)
    audit.start()
    t0, t1, holder = _plant(home, tmp, cwd)
    try:
        result = audit.finish(children=[(t0, t1, "g++", False)])
    finally:
        holder.kill()
        holder.wait()
    judged = {f["path"]: (f["ours"], f["reason"]) for f in result["files"]}

    def verdict(path: Path, ours: str, words: str) -> None:
        assert judged[str(path)][0] == ours and words in judged[str(path)][1], (path, judged[str(path)])
    verdict(home / ".cache" / "leak.bin", "yes", "while g++ (a child of hermetic, not in the sandbox) ran")
    verdict(tmp / "other-user.txt", "no", f"owned by uid 65534; hermetic runs as uid {os.geteuid()}")
    verdict(cwd / "held.log", "no", f"held open by pid {holder.pid}")
    verdict(tmp / "after.txt", "no", "when no child of hermetic ran")
    verdict(tmp / "during.txt", "unknown", "another process wrote in")
    verdict(tmp / "old" / "gone.txt", "unknown", "it is gone")
    assert result["clean"] is False and result["counts"]["ours"] == 1  # the leak alone makes it unclean
    assert [f["ours"] for f in result["files"]] == ["yes", "unknown", "unknown", "no", "no", "no"]  # ours first


def test_under_the_sandbox_no_file_outside_is_ours(tmp_path: Path) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd)
    audit.start()
    t0, t1, holder = _plant(home, tmp, cwd)
    try:
        result = audit.finish(children=[(t0, t1, "ninja", True)], exclude=[tmp / "old"])
    finally:
        holder.kill()
        holder.wait()
    assert result["clean"] is True and result["counts"]["not_ours"] == len(result["files"]) == 6
    assert all("every child of hermetic ran in the sandbox" in f["reason"] for f in result["files"])
    # a lock folder is watched: only lock files are left out there (gone.txt is none)
    assert result["removed"] == [str(tmp / "old" / "gone.txt")] and f"{tmp / 'old'}/*.lock" in result["excluded"]
    assert result["children"] == {"ran": 1, "sandboxed": 1}


def test_nothing_written_is_clean_and_a_root_inside_a_watched_place_is_skipped(tmp_path: Path) -> None:
    home, tmp, _cwd, _root = _places(tmp_path)
    root = home / ".hermetic"  # a root inside HOME (and the current folder is HOME): it is not outside
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=home)
    audit.start()
    (root / "store" / "deep").mkdir(parents=True)  # creating the root itself is not a leak either
    (root / "store" / "deep" / "f").write_text("x")
    result = audit.finish(children=[])   # no child ran: nothing could write deeper than the audit looked
    assert result["clean"] is True, result
    assert result["created"] == result["changed"] == result["removed"] == []
    assert result["watched"].count(str(home)) == 1  # HOME and the current folder are one place


def test_a_place_past_the_entry_budget_is_reported_as_truncated(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    home, tmp, cwd, root = _places(tmp_path)
    for i in range(50):
        (tmp / f"f{i}").write_text("x")
    monkeypatch.setattr(audit_mod, "MAX_ENTRIES", 20)
    audit = OutsideRootAudit(root, home=home, temp_dirs=[tmp], cwd=cwd)
    audit.start()
    (cwd / "new").write_text("x")
    result = audit.finish()
    assert result["truncated"] == [str(tmp)] and result["complete"] is False
    assert result["created"] == [str(cwd / "new")]  # the places within budget are still seen whole


def test_the_default_places_and_the_cost(tmp_path: Path) -> None:
    audit = OutsideRootAudit(tmp_path / "root")
    audit.start()
    result = audit.finish()
    home = os.environ.get("HOME") or os.path.expanduser("~")
    for place in (os.path.realpath(home), "/tmp", os.path.realpath(os.getcwd())):
        assert place in result["watched"]
    assert result["counts"]["entries_walked"] <= 2 * len(result["watched"]) * audit_mod.MAX_ENTRIES
    print(f"default audit: {len(result['watched'])} places, {result['counts']['entries_walked']} entries, "
          f"{result['seconds']} s")


MODULE = """#include <Python.h>
static PyModuleDef d = {PyModuleDef_HEAD_INIT, "audit_ext", 0, -1, 0};
PyMODINIT_FUNC PyInit_audit_ext(void) { return PyModule_Create(&d); }
"""


def _build_recipe(tmp_path: Path, name: str, cflags: str) -> Path:
    folder = tmp_path / name
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "m.cpp").write_text(MODULE)
    shutil.copy(TOOLCHAIN_LOCK, folder)
    (folder / "recipe.toml").write_text(recipe_toml(
        name, toolchain=True, sources={"s": "src"}, jobs=2,
        extensions=[f'name = "audit_ext"\nsource = "s"\nsources = ["*.cpp"]\ncflags = [{cflags}]']))
    return folder / "recipe.toml"


def _realize_build(tmp_path: Path, root: Path, name: str, cflags: str, *args: str,
                   rc: int = 0) -> tuple[dict[str, object], Path, Path]:
    """Realize a one-file extension with a HOME, TMPDIR and current folder of its own (watched); with
    ``rc`` 0, the receipt's audit (and the receipt under "receipt"), else the result record."""
    recipe = _build_recipe(tmp_path, name, cflags)
    home, tmp = tmp_path / f"{name}-home", tmp_path / f"{name}-tmp"
    env = child_env(home, tmp)
    cwd = tmp_path / f"{name}-cwd"
    cwd.mkdir()
    p = cli.run(root, "realize", recipe, "--json", *args, env=env, cwd=cwd, code=REPO)  # this checkout's code
    assert p.returncode == rc, p.stderr[-3000:]
    if rc != 0:
        return {**p.result, "stderr": p.stderr}, home, tmp
    receipt = json.loads(Path(json.loads(p.stdout.splitlines()[-1])["receipt"]).read_text())
    return {**receipt["outside_root_audit"], "receipt": receipt}, home, tmp


def test_a_build_writes_nothing_outside_and_a_leaking_flag_fails_in_the_sandbox_or_is_ours_without(
        tmp_path: Path, shared_root: Path) -> None:
    audit, home, tmp = _realize_build(tmp_path, shared_root, "auditclean", "")
    assert str(home) in audit["watched"] and str(tmp) in audit["watched"]  # type: ignore[operator]
    mine = [p for p in audit["created"] + audit["changed"] + audit["removed"]  # type: ignore[operator]
            if p.startswith((str(home), str(tmp), str(tmp_path)))]
    assert mine == [], mine  # compilers, the import check and their caches all wrote inside the root
    sandboxed = sandbox.bwrap_path()[0] is not None
    assert audit["receipt"]["sandbox"]["used"] is sandboxed  # type: ignore[index]
    # a recipe flag that makes g++ write its temporaries into HOME: a real child leaking
    leak_home = tmp_path / "auditleak-home"
    flag = f'"-save-temps", "-dumpdir", "{leak_home}/leak-"'
    if sandboxed:  # the write fails at once, the error names it, nothing lands
        result, home, _tmp = _realize_build(tmp_path, shared_root, "auditleak", flag, rc=1)
        err = result["error"]
        assert err["kind"] == "sandbox-refused" and str(err["where"]).startswith(f"{leak_home}/leak-m."), err  # type: ignore[index]
        assert f"error: {leak_home}/leak-m." in str(result["stderr"]) and "--sandbox off" in str(result["stderr"])
        assert not list(home.glob("leak-*"))
    # without the sandbox the same leak lands, and the receipt says it is ours
    off_flag = f'"-save-temps", "-dumpdir", "{tmp_path / "auditleakoff-home"}/off-"'
    audit, home, _tmp = _realize_build(tmp_path, shared_root, "auditleakoff", off_flag, "--sandbox", "off")
    assert audit["receipt"]["sandbox"] == {"mode": "off", "set_by": "--sandbox", "used": False,  # type: ignore[index]
                                           "why_not": "sandbox = off (--sandbox)"}
    ours = {f["path"]: f for f in audit["files"] if f["ours"] == "yes"}  # type: ignore[union-attr]
    assert sorted(p for p in ours if p.startswith(str(home))) == [str(home / "off-m.ii"), str(home / "off-m.s")]
    assert "ninja" in ours[str(home / "off-m.ii")]["reason"]
    assert audit["clean"] is False and (home / "off-m.ii").exists() and REPO.exists()


def test_another_process_file_is_not_ours_and_leaves_the_build_clean(tmp_path: Path, shared_root: Path) -> None:
    """Without the sandbox: a file another process writes (and holds open) in the watched TMPDIR while a
    realize builds is reported, judged not ours, and ``clean`` stays true."""
    recipe = _build_recipe(tmp_path, "auditother", "")
    home, tmp = tmp_path / "auditother-home", tmp_path / "auditother-tmp"
    proc = cli.popen(shared_root, "realize", recipe, "--json", "--sandbox", "off", env=child_env(home, tmp))
    assert proc.stdout is not None
    proc.stdout.readline()  # the realize has begun (its audit's snapshot is taken before its first record)
    other = tmp / "other-writer.log"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1], 'w')\nf.write('x')\n"
                               "f.flush()\ntime.sleep(600)", str(other)])
    try:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    finally:
        holder.kill()
        holder.wait()
    receipt = json.loads(Path(json.loads(out.splitlines()[-1])["receipt"]).read_text())
    audit = receipt["outside_root_audit"]
    judged = {f["path"]: f for f in audit["files"]}
    assert str(other) in audit["created"] and judged[str(other)]["ours"] == "no", judged
    assert f"held open by pid {holder.pid}" in judged[str(other)]["reason"]
    # with the sandbox off, what lies below HOME's top and the current folder's second level was not looked at
    ours = [f for f in audit["files"] if f["ours"] == "yes"]
    assert audit["clean"] == "unknown" and receipt["sandbox"]["used"] is False, ours
    assert all("deep only" in u for u in audit["unchecked"]), audit["unchecked"]


@pytest.mark.parametrize("mode", ["sandbox", "off"])
def test_a_compiler_wrapper_that_leaves_a_detached_child_writing_into_the_root(
        tmp_path: Path, shared_root: Path, mode: str) -> None:
    """attack34 finding 8: g++ ``-wrapper`` (a compiler launcher) starts a process outside its session (setsid)
    that writes into the scratch root two seconds later and lives on. In the sandbox the pid namespace ends it
    with its child; without, it is found by its mark when its child ends, stopped, and the receipt's audit lists
    it under ``escaped`` (clean then "unknown" at best). Either way nothing is left when realize returns and
    nothing is written into the root after. Before: it outlived the realize (in the sandbox with the root
    writable) and wrote its file."""
    if mode == "sandbox" and sandbox.bwrap_path()[0] is None:
        pytest.skip("bubblewrap is not installed here")
    late = shared_root / f"late-{mode}.txt"
    ready = shared_root / f"ready-{mode}"
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text("#!/bin/sh\n"
                       'case "$1" in *cc1plus*) ;; *) exec "$@";; esac\n'
                       f"setsid sh -c 'touch {ready}; sleep 2; echo late > {late}; exec sleep 3541' "
                       "</dev/null >/dev/null 2>&1 &\n"
                       f"while [ ! -e {ready} ]; do sleep 0.02; done\n"
                       'exec "$@"\n')
    wrapper.chmod(0o755)
    args = ("--sandbox", "off") if mode == "off" else ()
    audit, _home, _tmp = _realize_build(tmp_path, shared_root, f"auditdetach{mode}", f'"-wrapper", "{wrapper}"',
                                        *args)
    assert ready.exists()   # the wrapper ran
    time.sleep(3)
    left = [pid for pid, cmd in live_commands().items() if b"sleep\x003541" in cmd]
    assert left == [], "a process the compiler started outlived the realize"
    assert not late.exists(), "it wrote into the root after its child ended"
    if mode == "off":
        assert any("3541" in e["command"] or "sleep 2" in e["command"] for e in audit["escaped"]), audit["escaped"]
        assert audit["clean"] != True  # noqa: E712
    else:
        assert audit["receipt"]["sandbox"]["used"] is True  # type: ignore[index]
