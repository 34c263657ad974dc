"""realize of lock-only recipes: fetch, materialize, no-op, lock updates, and every bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from hermetic.root import NO_CUDA
from tests.support.cli import Hermetic
from tests.support.index import LoopbackIndex, dead_url
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe
from tests.support.trees import store_listing, tree_snapshot
from tests.support.wheels import build_wheel


def test_realize_then_noop_touches_nothing_and_asks_no_index(tmp_path: Path, hermetic: Hermetic,
                                                              index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    b = make_pkg(tmp_path / "whl", "beta", "2.0")
    index.add(a.path, b.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a) + pip_lock_line(b))
    first = hermetic("realize", recipe, "--json", check=True)
    result = json.loads(first.out.splitlines()[-1])
    assert result["counts"]["fetched"] == 2 and result["changed"] is True
    # the fetch is said as it starts, before the index is asked, naming what the store lacks
    kinds = [r.get("event") for r in first.records]
    assert kinds.index("fetch-start") < kinds.index("fetched")
    (start,) = [r["message"] for r in first.records if r.get("event") == "fetch-start"]
    assert start == "fetching 2 wheels the store lacks: alpha==1.0, beta==2.0", start
    # one duration, the receipt's, in the closing line
    total = json.loads(Path(result["receipt"]).read_text())["timings"]["total"]
    assert total == result["timings"]["total"] > 0
    (done,) = [r["message"] for r in first.records if r.get("event") == "done"]
    assert done.endswith(f"(2 wheels: 2 fetched, 2 unpacked, 0 reused; {result['counts']['files']} files; "
                         f"{total:.1f} s)"), done
    profile = hermetic.root / "profiles" / "env1"
    assert (profile / "alpha" / "include" / "h3.h").read_text().startswith("#define H3 3")
    assert os.access(profile / "beta" / "bin" / "tool", os.X_OK)
    before = tree_snapshot(profile)
    store_before = store_listing(hermetic.root)
    served = len(index.state.requests)

    again = hermetic("realize", recipe, "--json", env={"PIP_INDEX_URL": dead_url()}, check=True)
    result = json.loads(again.out.splitlines()[-1])
    assert result["changed"] is False and result["counts"]["fetched"] == 0
    # a no-op says how long the command took, its interpreter's start included: never "0.00 s"
    (done,) = [r["message"] for r in again.records if r.get("event") == "done"]
    took = float(re.fullmatch(r".*; (\d+\.\d) s\)", done).group(1))  # type: ignore[union-attr]
    assert 0.05 <= took < 30, done
    assert len(index.state.requests) == served
    assert tree_snapshot(profile) == before
    assert store_listing(hermetic.root) == store_before


def test_noop_imports_no_heavy_module(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    hermetic("realize", recipe, check=True)
    res = hermetic("realize", recipe, env={"PYTHONPROFILEIMPORTTIME": "1"}, check=True)
    imported = {line.split("|")[-1].strip() for line in res.err.splitlines() if "import time" in line}
    for heavy in ("requests", "installer", "packaging.markers", "torch", "hermetic.locks.read"):
        assert heavy not in imported, heavy


def test_lock_update_rewrites_only_changed_files(tmp_path: Path, hermetic: Hermetic,
                                                 index: LoopbackIndex) -> None:
    v1 = make_pkg(tmp_path / "whl", "alpha", "1.0")
    v2 = make_pkg(tmp_path / "whl", "alpha", "1.1")
    index.add(v1.path, v2.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(v1))
    hermetic("realize", recipe, check=True)
    profile = hermetic.root / "profiles" / "env1"
    before = tree_snapshot(profile)
    (tmp_path / "r" / "env1.lock.txt").write_text(pip_lock_line(v2))
    hermetic("realize", recipe, check=True)
    after = tree_snapshot(profile)
    unchanged = [p for p in before if p in after and before[p][2] == after[p][2]]
    assert len(unchanged) >= 31  # 30 headers and the tool script
    for p in unchanged:
        assert after[p][:2] == before[p][:2], f"{p} was rewritten"
    assert after["alpha/__init__.py"][2] != before["alpha/__init__.py"][2]
    assert "alpha/only_1_0.py" not in after and "alpha/only_1_1.py" in after


def _assert_clean_failure(res: object, code: int, *needles: str) -> None:
    assert res.rc == code, (res.rc, res.err)  # type: ignore[attr-defined]
    assert "Traceback" not in res.err  # type: ignore[attr-defined]
    for n in needles:
        assert n in res.err, (n, res.err)  # type: ignore[attr-defined]


def test_hash_mismatch_is_bad_input_and_store_unchanged(tmp_path: Path, hermetic: Hermetic,
                                                        index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    good = write_recipe(tmp_path / "g", "good", pip_lock_line(make_pkg(tmp_path / "w2", "beta", "1.0")))
    index.add(tmp_path / "w2" / "beta-1.0-py3-none-any.whl")
    hermetic("realize", good, check=True)
    before = store_listing(hermetic.root)
    recipe = write_recipe(tmp_path / "r", "bad", f"alpha==1.0 --hash=sha256:{'0' * 64}\n")
    res = hermetic("realize", recipe)
    _assert_clean_failure(res, 2, "bad.lock.txt")
    assert store_listing(hermetic.root) == before
    assert not any((hermetic.root / "store" / "tmp").iterdir())


def test_record_mismatch_and_path_escape_are_refused(tmp_path: Path, hermetic: Hermetic,
                                                     index: LoopbackIndex) -> None:
    liar = build_wheel(tmp_path / "whl", "liar", "1.0", {"liar/x.py": "A = 1\n"},
                       record_override={"liar/x.py": "sha256=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"})
    esc = build_wheel(tmp_path / "whl", "esc", "1.0", {"../escape.py": "A = 1\n"})
    absw = build_wheel(tmp_path / "whl", "absw", "1.0", {"/tmp/hermetic-abs-escape.py": "A = 1\n"})
    index.add(liar.path, esc.path, absw.path)
    for w in (liar, esc, absw):
        recipe = write_recipe(tmp_path / w.name, w.name, pip_lock_line(w))
        before = store_listing(hermetic.root)
        res = hermetic("realize", recipe)
        _assert_clean_failure(res, 2, w.filename)
        assert not any(k.startswith("entries/") for k in set(store_listing(hermetic.root)) - set(before))
    assert not (tmp_path / "escape.py").exists() and not Path("/tmp/hermetic-abs-escape.py").exists()


def test_bad_toml_and_recipe_keys(tmp_path: Path, hermetic: Hermetic) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "x.lock.txt").write_text("")
    cases = {
        "syntax": ('[recipe]\nname = "x"\nlocks = ["x.lock.txt"\n', ":3"),
        "unknown": ('[recipe]\nname = "x"\nlocks = ["x.lock.txt"]\ncolour = "red"\n', "colour"),
        "wrongtype": ('[recipe]\nname = 5\nlocks = ["x.lock.txt"]\n', "recipe.name"),
        "missing": ('[recipe]\nname = "x"\nlocks = ["nope.txt"]\n', "nope.txt"),
    }
    for label, (text, needle) in cases.items():
        recipe = folder / f"{label}.toml"
        recipe.write_text(text)
        res = hermetic("realize", recipe)
        _assert_clean_failure(res, 2, f"{label}.toml", needle)
    assert not (hermetic.root / "store").exists() or not any((hermetic.root / "store" / "entries").iterdir())


def test_missing_hash_and_no_wheel_for_interpreter(tmp_path: Path, hermetic: Hermetic,
                                                   index: LoopbackIndex) -> None:
    res = hermetic("realize", write_recipe(tmp_path / "a", "nohash", "alpha==1.0\n"))
    _assert_clean_failure(res, 2, "nohash.lock.txt:1")
    foreign = build_wheel(tmp_path / "whl", "foreign", "1.0", {"f/x.py": "1"},
                          tag="cp27-cp27m-win32")
    lock = (f'lock-version = "1.0"\ncreated-by = "test"\n[[packages]]\nname = "foreign"\nversion = "1.0"\n'
            f'[[packages.wheels]]\nurl = "{index.url}/files/{foreign.filename}"\n'
            f'hashes = {{sha256 = "{foreign.sha256}"}}\n')
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "pylock.toml").write_text(lock)
    (folder / "r.toml").write_text('[recipe]\nname = "foreign"\nlocks = ["pylock.toml"]\n')
    res = hermetic("realize", folder / "r.toml")
    _assert_clean_failure(res, 2, "pylock.toml", foreign.filename)


def test_size_mismatch_in_pylock(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "pylock.toml").write_text(
        f'lock-version = "1.0"\ncreated-by = "test"\n[[packages]]\nname = "alpha"\nversion = "1.0"\n'
        f'[[packages.wheels]]\nurl = "{index.url}/files/{a.filename}"\nsize = {a.size + 1}\n'
        f'hashes = {{sha256 = "{a.sha256}"}}\n')
    (folder / "r.toml").write_text('[recipe]\nname = "sized"\nlocks = ["pylock.toml"]\n')
    _assert_clean_failure(hermetic("realize", folder / "r.toml"), 2, "size")


def test_network_failures_exit_1(tmp_path: Path, hermetic: Hermetic, index: LoopbackIndex) -> None:
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "net", pip_lock_line(a))
    res = hermetic("realize", recipe, env={"PIP_INDEX_URL": dead_url()})
    _assert_clean_failure(res, 1, "alpha")
    index.state.truncate_files = True
    res = hermetic("realize", recipe)
    _assert_clean_failure(res, 1, "truncated")
    assert not (hermetic.root / "profiles" / "net").exists()



SYSTEM_NVCC = "#!/bin/sh\necho 'Cuda compilation tools, release 12.0: a system CUDA'\n"
CUDA_PROBE = "import shutil, torch.utils.cpp_extension as c; print(c.CUDA_HOME, shutil.which('nvcc'))"


def test_env_shows_no_system_cuda_and_each_folder_once(tmp_path: Path, hermetic: Hermetic,
                                                        index: LoopbackIndex) -> None:
    """Without a toolchain, what `hermetic env` runs sees no CUDA: not the caller's CUDA_HOME, not an nvcc on
    the caller's PATH, not /usr/local/cuda (torch's last guess, and this machine's system CUDA where it has one);
    and the caller's venv bin, which the environment puts first itself, is on PATH once."""
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    hermetic("realize", recipe, check=True)
    system = tmp_path / "usr-local-cuda"  # a system CUDA of the caller's: its nvcc on PATH, named by CUDA_HOME
    (system / "bin").mkdir(parents=True)
    (system / "bin" / "nvcc").write_text(SYSTEM_NVCC)
    (system / "bin" / "nvcc").chmod(0o755)
    venv_bin = str(Path(sys.executable).parent)  # as an activated venv has it: first on PATH
    caller = {"PATH": os.pathsep.join([venv_bin, str(system / "bin"), os.environ["PATH"]]),
              "CUDA_HOME": str(system), "CUDA_PATH": str(system)}
    r = hermetic("env", recipe, "--", "python", "-c", CUDA_PROBE, env=caller)
    assert r.rc == 0, r.err
    cuda_home, nvcc = r.out.split()
    assert cuda_home == NO_CUDA and not os.path.exists(cuda_home)
    assert nvcc == "None" and "/usr/local" not in r.out + r.err
    printed = hermetic("env", recipe, "--json", env=caller, check=True).result["env"]
    assert printed["CUDA_HOME"] == printed["CUDA_PATH"] == cuda_home
    path = printed["PATH"].split(os.pathsep)
    assert path.count(venv_bin) == 1 and str(system / "bin") not in path
    assert path[0] == str(hermetic.root / "profiles" / "env1" / "bin")
    # its temp folder is in home/, which sandboxed children cannot write (the re-attack's B1: links planted in
    # tmp/ by a stranger's setup.py were followed by nvcc run under env, outside the root)
    temps = hermetic("env", recipe, "--", "sh", "-c", 'echo "$TMPDIR $TMP $TEMP"', check=True).out.split()
    assert temps == [str(hermetic.root / "home" / "tmp")] * 3, temps


def test_a_planted_no_cuda_folder_is_never_what_a_child_sees(tmp_path: Path, hermetic: Hermetic,
                                                               index: LoopbackIndex) -> None:
    """Outside attack r1, finding 10 (s_nocuda.sh): CUDA_HOME without a toolchain named ROOT/tmp/no-cuda, "a
    folder that never exists", which any write inside the root could make: a planted tmp/no-cuda/bin/nvcc was
    the CUDA torch took in `hermetic env` (a CUDA extension built there would run it). Now CUDA_HOME names a
    folder below /dev/null, which nothing can make; the planted one is not seen."""
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "env1", pip_lock_line(a))
    hermetic("realize", recipe, check=True)
    planted = hermetic.root / "tmp" / "no-cuda" / "bin" / "nvcc"
    planted.parent.mkdir(parents=True)
    planted.write_text("#!/bin/sh\necho PLANTED-NVCC\n")
    planted.chmod(0o755)
    r = hermetic("env", recipe, "--", "python", "-c", CUDA_PROBE)
    assert r.rc == 0, r.err
    cuda_home, nvcc = r.out.split()
    assert cuda_home == NO_CUDA and not os.path.exists(cuda_home) and nvcc == "None", r.out
    assert "no-cuda" not in (r.out + r.err).replace(NO_CUDA, ""), r.out + r.err
    with pytest.raises(OSError):   # nothing can make it
        os.makedirs(os.path.join(NO_CUDA, "bin"))


GATED = ("import os, sys, time\n"
         "print('ready', flush=True)\n"
         "while not os.path.exists(sys.argv[1]):\n"
         "    time.sleep(0.05)\n"
         "import alpha\n"
         "print(open(alpha.__file__).read().strip())\n")


def test_env_command_keeps_its_tree_alive_while_it_runs(tmp_path: Path, hermetic: Hermetic,
                                                        index: LoopbackIndex) -> None:
    """The outside attack on issue 35 (finding 7): `hermetic env RECIPE -- CMD` pinned nothing (it execs CMD), so
    `gc --drop-root` beside it deleted the tree under the running command (ModuleNotFoundError). The command
    inherits the temp root's lock and runs from the pinned tree itself, never through the profile; once it has
    exited, gc collects the tree."""
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "envgc", pip_lock_line(a))
    hermetic("realize", recipe, check=True)
    gate = tmp_path / "gate"
    proc = hermetic.popen("env", recipe, "--", "python", "-c", GATED, gate)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        gc = hermetic("gc", "--drop-root", "envgc", "--json")
        assert gc.rc == 0 and gc.result["dead_entries"] == [], gc.out
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == "VERSION = '1.0'"
    assert not (hermetic.root / "profiles" / "envgc").exists()
    gone = hermetic("gc", "--json")
    assert gone.rc == 0 and len(gone.result["dead_entries"]) == 2   # the tree and the unpacked wheel


def test_env_refuses_a_profile_that_is_no_link_to_an_entry(tmp_path: Path, hermetic: Hermetic,
                                                            index: LoopbackIndex) -> None:
    """The outside attack on issue 35 (finding 7): `env` ran the command (exit 0) inside a `profiles/NAME` that
    was a plain folder or a link out of the store. A profile is a link to an entry's out/ (docs/layout.md's bad
    records): anything else is exit 2 naming it, for the printed environment too."""
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "envprof", pip_lock_line(a))
    hermetic("realize", recipe, check=True)
    profile = hermetic.root / "profiles" / "envprof"
    fake = tmp_path / "outside" / "fakeprof"
    (fake / "alpha").mkdir(parents=True)
    (fake / "alpha" / "__init__.py").write_text("VERSION = 'not the locked one'\n")
    profile.unlink()
    profile.symlink_to(fake)
    for shape in ("a link out of the store", "a folder"):
        if shape == "a folder":
            profile.unlink()
            shutil.copytree(fake, profile)
        for args in (("--", "python", "-c", "import alpha; print(alpha.VERSION)"), ()):
            r = hermetic("env", recipe, *args)
            assert r.rc == 2 and r.err.startswith(f"error: {profile}: the profile "), (shape, r.out, r.err)
            assert "verify --repair" in r.err and "not the locked one" not in r.out, (shape, r.out)
    assert hermetic("verify", "--repair").rc == 0
    r = hermetic("env", recipe, "--", "python", "-c", "import alpha; print(alpha.VERSION)")
    assert r.rc == 0 and r.out.strip() == "1.0", r.err


@pytest.mark.parametrize("cpus,says", [
    ("1-0", "the range 1-0 runs backwards"), ("0-1,1-0", "the range 1-0 runs backwards"),
    ("0-", "'0-' is not a CPU number or a range N-M"), ("-1", "'-1' is not a CPU number"),
    ("0,,1", "'' is not a CPU number"), ("", "'' is not a CPU number"), ("0x3", "'0x3' is not a CPU number"),
    ("0-1:2", "'0-1:2' is not a CPU number"), ("4095", "names no CPU this machine lets hermetic use"),
    ("0-99999999999", "names more than 4096 CPUs")])
def test_a_malformed_cpus_list_is_exit_2_naming_file_line_and_key(cpus: str, says: str, tmp_path: Path,
                                                                   hermetic: Hermetic, index: LoopbackIndex) -> None:
    """The outside attack on issue 35 (finding 13): "1-0" was refused but "0-1,1-0" accepted, and "0-" accepted
    (meaning unknown). One rule (docs/recipes.md): items N or N-M with M not below N, none empty."""
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "cpus", pip_lock_line(a))
    recipe.write_text(recipe.read_text() + f'\n[limits]\ncpus = "{cpus}"\n')
    r = hermetic("realize", recipe)
    assert r.rc == 2 and "Traceback" not in r.err, r.err
    assert r.err.startswith(f"error: {recipe}:") and "limits.cpus" in r.err and says in r.err, r.err


def test_a_cpus_list_naming_cpus_this_machine_lacks_warns_which(tmp_path: Path, hermetic: Hermetic,
                                                                index: LoopbackIndex) -> None:
    """A list naming some CPUs this machine lets hermetic use and some it does not ("0,5" on a 2-CPU machine): the
    children run on those it has, and realize says which are missing (the outside attack: accepted silently)."""
    have = sorted(os.sched_getaffinity(0))
    a = make_pkg(tmp_path / "whl", "alpha", "1.0")
    index.add(a.path)
    recipe = write_recipe(tmp_path / "r", "cpus", pip_lock_line(a))
    recipe.write_text(recipe.read_text() + f'\n[limits]\ncpus = "{have[0]},4090-4095"\n')
    r = hermetic("realize", recipe)
    assert r.rc == 0, r.err
    warned = [ln for ln in r.err.splitlines() if "4090-4095" in ln]
    assert warned and "limits.cpus" in warned[0] and f"the children run on CPU {have[0]}" in warned[0], r.err


def _two_owners(tmp_path: Path, shared_root: Path) -> tuple[Path, Path]:
    """A root of its own with the session's toolchain, and a folder holding a recipe named ``ownerfix.feature`` (a
    toolchain only): the name of recipe ``ownerfix``'s variant ``feature`` (tests.support.builds.Project)."""
    from tests.support.builds import linked_root
    from tests.support.recipes import recipe_toml
    root = linked_root(shared_root, tmp_path / "root")
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(Path(__file__).parents[1] / "manifests" / "cuda-13.0-toolchain.txt", other)
    (other / "recipe.toml").write_text(recipe_toml("ownerfix.feature", toolchain=True))
    return root, other


def test_a_recipe_named_like_another_recipes_variant_is_refused_before_it_replaces_its_profile(
        tmp_path: Path, shared_root: Path) -> None:
    """Recipe ``ownerfix``'s variant ``feature`` and a recipe named ``ownerfix.feature`` realize under one name: the
    second is exit 2 naming the first's recipe, the key and the way out, its profile left as it was. (Before, the
    second replaced the first's profile and gc root without a word.)"""
    from tests.support import cli
    from tests.support.builds import Project
    root, other = _two_owners(tmp_path, shared_root)
    env = dict(os.environ)
    first = cli.run(root, "realize", other / "recipe.toml", env=env)
    assert first.rc == 0, first.err[-3000:]
    profile = root / "profiles" / "ownerfix.feature"
    before = os.readlink(profile)
    proj = Project(tmp_path / "p", "ownerfix", root)
    second = proj.realize("--variant", "feature", check=False)
    assert second.rc == 2, second.err[-3000:]
    line = next(i for i, t in enumerate(proj.recipe.read_text().splitlines(), 1) if t == "[variants.feature]")
    assert (f"the root ownerfix.feature is recipe ownerfix.feature ({other / 'recipe.toml'}): realizing recipe "
            f"ownerfix's variant feature would replace its profile {profile}") in second.err, second.err
    assert f"{proj.recipe}:{line}" in second.err and "gc --drop-root ownerfix.feature" in second.err
    assert os.readlink(profile) == before and not (root / "build" / "ownerfix").exists()
    assert json.loads((root / "roots" / "ownerfix.feature.json").read_text())["owner"] == \
        {"recipe": "ownerfix.feature", "variant": ""}
    again = cli.run(root, "realize", other / "recipe.toml", env=env)   # its own name: still a no-op
    assert again.rc == 0 and os.readlink(profile) == before, again.err[-3000:]
    for how in ("--check", "--dry-run"):   # both say what a realize would say (attack47 row 11: exit 4 and 0)
        said = cli.run(root, "realize", proj.recipe, "--variant", "feature", how, env=env)
        assert said.rc == 2 and "would replace its profile" in said.err, (how, said.rc, said.err[-2000:])
    # a root an older hermetic wrote has no owner: its recipe file still says whose it is (attack47 row 4)
    record_path = root / "roots" / "ownerfix.feature.json"
    record = json.loads(record_path.read_text())
    del record["owner"]
    record_path.write_text(json.dumps(record))
    second = proj.realize("--variant", "feature", check=False)
    assert second.rc == 2 and "would replace its profile" in second.err, second.err[-3000:]
    assert os.readlink(profile) == before
    moved = other / "recipe.toml.away"   # its recipe file gone: whose root it is cannot be told (re-attack B3)
    (other / "recipe.toml").rename(moved)
    unknown = proj.realize("--variant", "feature", check=False)
    assert unknown.rc == 2 and "cannot be told" in unknown.err and "gc --drop-root ownerfix.feature" in unknown.err, \
        unknown.err[-3000:]
    assert os.readlink(profile) == before
    third = tmp_path / "third"   # `hermetic env` of a recipe of that name elsewhere: not realized, for the same reason
    shutil.copytree(other, third)
    (third / "recipe.toml.away").unlink()
    (third / "recipe.toml").write_text(moved.read_text())
    shown = cli.run(root, "env", third / "recipe.toml", env=env)
    assert shown.rc == 3 and "cannot be told" in shown.err and "gc --drop-root ownerfix.feature" in shown.err, \
        shown.err[-2000:]
    # the outside attack on that (stop 48, row 9): an owner-less root of recipe ownerfix's variant feature whose
    # recipe file now holds, or links to, recipe ownerfix.feature: env ran in the variant's environment (exit 0)
    record_path.write_text(json.dumps({**record, "recipe": str(proj.recipe)}))
    shown = cli.run(root, "env", third / "recipe.toml", env=env)
    assert shown.rc == 3 and "its profile is recipe ownerfix's variant feature's" in shown.err, shown.err[-2000:]
    kept = proj.recipe.with_suffix(".kept")
    proj.recipe.rename(kept)
    proj.recipe.symlink_to(third / "recipe.toml")
    shown = cli.run(root, "env", third / "recipe.toml", env=env)
    assert shown.rc == 3 and "records no owner" in shown.err and "cannot be told" in shown.err, shown.err[-2000:]
    proj.recipe.unlink()
    kept.rename(proj.recipe)
    record_path.write_text(json.dumps(record))
    moved.rename(other / "recipe.toml")
    noop = cli.run(root, "realize", other / "recipe.toml", env=env)   # its own recipe's no-op: the owner written
    assert noop.rc == 0 and "up to date" in noop.err, noop.err[-3000:]
    assert json.loads(record_path.read_text())["owner"] == {"recipe": "ownerfix.feature", "variant": ""}
    # a malformed owner is a bad record (attack47 row 5: taken as none, and verify said all valid)
    for bad in (None, "ownerfix", ["ownerfix"], {"recipe": "ownerfix"}, {"recipe": "x\ny", "variant": ""}):
        record_path.write_text(json.dumps({**record, "owner": bad}))
        refused = proj.realize("--variant", "feature", check=False)
        assert refused.rc == 2 and "its 'owner' is malformed" in refused.err and str(record_path) in refused.err, \
            (bad, refused.err[-2000:])
        assert os.readlink(profile) == before
        found = cli.run(root, "verify", "--json", env=env)
        assert found.rc == 1 and "its 'owner' is malformed" in found.out, (bad, found.out[-2000:])
    # `hermetic env` of a recipe whose name is another recipe's variant profile: not realized (attack47 row 6)
    record_path.write_text(json.dumps({**record, "owner": {"recipe": "ownerfix", "variant": "feature"}}))
    shown = cli.run(root, "env", other / "recipe.toml", env=env)
    assert shown.rc == 3 and "its profile is recipe ownerfix's variant feature's" in shown.err, shown.err[-2000:]


def test_two_recipes_of_one_name_realized_together_leave_one_owner(tmp_path: Path, shared_root: Path) -> None:
    """attack47 (5b): recipe ``ownerfix``'s variant ``feature`` and a recipe named ``ownerfix.feature`` started
    together both passed validation (no root yet) and both exited 0, the last one's profile winning. The owner is
    checked again at the end under the name's lock: with both held there until they wait together, exactly one
    exits 0 and the other 2, and the root and profile are the winner's."""
    import fcntl
    import time

    from tests.support import cli
    from tests.support.builds import Project
    root, other = _two_owners(tmp_path, shared_root)
    env = dict(os.environ)
    proj = Project(tmp_path / "p", "ownerfix", root)
    lock = root / "store" / "locks" / "root-ownerfix.feature.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX)
    procs = [cli.popen(root, "realize", other / "recipe.toml", "--json", env=env),
             cli.popen(root, "realize", proj.recipe, "--variant", "feature", "--json", env=env)]
    try:
        inode = f":{os.fstat(held).st_ino} "
        end = time.monotonic() + 600
        while sum(1 for line in Path("/proc/locks").read_text().splitlines() if "->" in line and inode in line) < 2:
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
            assert time.monotonic() < end, "the two realizes never both waited at the end"
            time.sleep(0.1)
        # neither has pointed the profile anywhere yet: that waits for the owner check under the lock (the
        # re-attack's B4: a realize refused there had already replaced the other's profile at materialize)
        assert not os.path.lexists(root / "profiles" / "ownerfix.feature")
    finally:
        os.close(held)   # both go on, one after the other
    results = [(p.wait(timeout=600), p.communicate()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], [(rc, err[-2000:]) for rc, (_out, err) in results]
    winner = next(i for i, (rc, _) in enumerate(results) if rc == 0)
    loser_err = results[1 - winner][1][1]
    assert "would replace its profile" in loser_err, loser_err[-2000:]
    owner = json.loads((root / "roots" / "ownerfix.feature.json").read_text())["owner"]
    assert owner == ({"recipe": "ownerfix.feature", "variant": ""} if winner == 0 else
                     {"recipe": "ownerfix", "variant": "feature"})
    tree = json.loads(results[winner][1][0].splitlines()[-1])["tree"]
    assert os.readlink(root / "profiles" / "ownerfix.feature").split("/")[-2] == tree
