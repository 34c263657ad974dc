"""Commands side by side never lie or delete what another holds (issue 35): every pair of a realize (lock-only
and the compile fixture, cold and warm) and a neighbour (verify, verify --repair, gc, gc --drop-root, import,
export), the neighbour started at a seeded moment within the realize's span. Each round: both exit 0, a
verify or repair beside the realize reports nothing in a sound store, and afterwards verify is clean and every
entry a root or a profile names is there. The machinery is tests/support/neighbours.py; bench/soak's
neighbours phase runs the same pairs 20 times each and more.

On the code before the fix, these failed: a repair beside a cold build removed the module and objects the
realize had just published ("its object blob ... is missing", listed before they were), a plain verify beside
it said the same of a sound store, and ``gc --drop-root`` beside it failed the import check (it imported
through the profile gc removed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hermetic.store import Store
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.index import LoopbackIndex
from tests.support.neighbours import BUILD, LOCK, NEIGHBOURS, REALIZES, NeighbourLab
from tests.support.recipes import make_pkg, pip_lock_line, write_recipe
from tests.support.reliability import realize_toolchain, toolchain_wheels_from

SEED = 35


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, shared_root: Path) -> NeighbourLab:
    work = tmp_path_factory.mktemp("neighbours")
    env = hermetic_env(work / "home", tmp=work / "tmp")
    links = toolchain_wheels_from(shared_root, work / "links")
    realize_toolchain(work / "root", {**env, "PIP_FIND_LINKS": str(links)}, REPO, links)
    neighbours = NeighbourLab(work, work / "root", env, seed=SEED)
    neighbours.setup()
    return neighbours


@pytest.mark.parametrize("neighbour", NEIGHBOURS)
@pytest.mark.parametrize("kind", REALIZES)
def test_a_realize_and_a_neighbour_side_by_side(lab: NeighbourLab, kind: str, neighbour: str) -> None:
    r = lab.round(0, kind, neighbour)
    assert r.ok, "\n".join(r.problems)


HOLDER = """
import sys, time
from pathlib import Path
from hermetic.store import Store
store = Store(Path(sys.argv[1]))
store.pin_entry(sys.argv[2])
store.pin_blob(sys.argv[3])
print("pinned", flush=True)
time.sleep(600)
"""


def test_repair_leaves_what_another_process_pins_and_says_so(tmp_path: Path, hermetic: Hermetic,
                                                            index: LoopbackIndex) -> None:
    """A corrupt blob and the entry using it, pinned by a live process (its temp root): repair removes neither
    and says "in use" (exit 1: the problem stays); once that process is gone, repair mends them."""
    wheel = make_pkg(tmp_path / "whl", "held", "1.0")
    index.add(wheel.path)
    recipe = write_recipe(tmp_path / "r", "held", pip_lock_line(wheel))
    hermetic("realize", recipe, check=True)
    store = Store(hermetic.root / "store")
    target = hermetic.root / "profiles" / "held" / "held" / "include" / "h1.h"
    blob = next(p for _d, _x, p in store.iter_blobs() if p.stat().st_ino == target.stat().st_ino)
    entry = next(e for e in store.iter_entries() if e.endswith("-held") and not (store.entry_path(e) / "out").exists())
    os.chmod(blob, 0o644)
    blob.write_bytes(b"#define H1 666\n")   # same inode: the tree's file too
    os.chmod(blob, 0o444)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store.path), entry, blob.name],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "pinned"
        res = hermetic("verify", "--repair", "--json")
        assert res.rc == 1 and "Traceback" not in res.err
        assert f"blob {blob.name}: in use by another hermetic process: not removed" in res.err, res.err
        assert f"entry {entry}: in use by another hermetic process: not removed" in res.err, res.err
        assert blob.exists() and store.has_entry(entry)
    finally:
        holder.kill()
        holder.wait()
    mended = hermetic("verify", "--repair", "--json")
    assert mended.rc == 0, mended.err[-3000:]
    assert target.read_text().startswith("#define H1 1")


def test_gc_drop_root_while_the_import_check_imports_fails_nothing(lab: NeighbourLab) -> None:
    """The window of the reported failure, placed: a recipe whose tree holds a wheel of its own starts its
    import check only at step 8 (torch's import could read the wheel), and `gc --drop-root` of that recipe runs
    the moment the check begins, while the check's interpreter still imports torch. The check imports from
    the tree the realize pinned: it passes, and the realize's root and profile are both there after it."""
    project = lab.work / "nb-checked"
    shutil.copytree(lab.work / BUILD, project)
    shutil.copy(lab.work / LOCK / "env.lock.txt", project / "env.lock.txt")
    recipe = project / "recipe.toml"
    recipe.write_text(recipe.read_text().replace(f'name = "{BUILD}"', 'name = "nb-checked"\nlocks = ["env.lock.txt"]'))
    realize = lab.popen("realize", recipe, "--json")
    assert realize.stdout is not None
    for line in realize.stdout:   # the compiles are done; the check's interpreter starts now
        if line.startswith("{") and json.loads(line).get("phase") == "checking":
            break
    gc = lab.h("gc", "--drop-root", "nb-checked", "--json")
    out, err = realize.communicate(timeout=600)
    assert gc.rc == 0, gc.err[-3000:]
    assert realize.returncode == 0, err[-3000:]
    assert (lab.root / "roots" / "nb-checked.json").exists() and (lab.root / "profiles" / "nb-checked").exists()
    assert lab.h("verify").rc == 0


def test_gc_drop_root_while_the_recipe_compiles_waits_for_its_build(lab: NeighbourLab) -> None:
    """The race a loaded CI run hit (stop 48, `[build-cold-drop-root]`): `gc --drop-root R` while R's realize
    compiled dropped R's toolchain profile too, through which every compile and the link name CUDA, and the
    realize failed ("cannot find -lcudart"). The drop now waits for R's build (its lock), saying so; both exit 0,
    the store stays sound and no profile dangles."""
    project = lab.work / "nb-compiling"
    shutil.copytree(lab.work / BUILD, project)
    recipe = project / "recipe.toml"
    recipe.write_text(recipe.read_text().replace(f'name = "{BUILD}"', 'name = "nb-compiling"'))
    clock = project / "src" / "clock.cpp"   # one unit of its own: something to compile, not all reused
    clock.write_text(clock.read_text() + "\n// nb-compiling\n")
    realize = lab.popen("realize", recipe, "--json")
    assert realize.stdout is not None
    seen = False
    for line in realize.stdout:   # the build holds its lock from before this line to the link
        if line.startswith("{") and json.loads(line).get("phase") == "compiling":
            seen = True
            break
    gc = lab.h("gc", "--drop-root", "nb-compiling", "--json")
    out, err = realize.communicate(timeout=600)
    assert seen, err[-3000:]
    assert realize.returncode == 0, err[-3000:]
    assert gc.rc == 0, gc.err[-3000:]
    assert "waiting for the build of nb-compiling to end" in gc.out + gc.err, (gc.out[-2000:], gc.err[-2000:])
    assert lab.h("verify").rc == 0
    profiles = lab.root / "profiles"
    assert not [p.name for p in profiles.iterdir() if p.is_symlink() and not p.exists()]
