"""One build graph for every variant of a realize (extensions/graph.py), on a real fixture (tests/data/joint_src,
real g++ through ninja): what overlaps, what waits, what a wrong prediction costs, what a failure keeps, and
the no-op after a fresh checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hermetic.extensions.certificate import read_certificate
from hermetic.extensions.graph import memory_pool
from hermetic.root import CACHES
from hermetic.store import Store
from tests.support import cli
from tests.support.builds import DATA, JOINT_VARIANTS, Project, Realized, joint_recipe
from tests.support.reliability import realize_toolchain, toolchain_wheels_from
from tests.support.trees import listing, store_listing

JOINT = DATA / "joint_src"
ALL = {"heavy.cpp", "light_a.cpp", "light_b.cpp", "bindings.cpp", "computed.cpp"}


def joint_project(folder: Path, name: str, root: Path, **kw: Any) -> Project:
    return Project(folder, name, root, sources=JOINT, recipe=joint_recipe(name, **kw))


def certificates(root: Path, res: Realized) -> dict[str, dict[str, Any]]:
    """variant -> its module's certificate, from the realize's receipt."""
    receipt = json.loads(Path(str(res.result["receipt"])).read_text())
    store = Store(root / "store")
    return {m["variant"]: dict(read_certificate(store, m["certificate_blob"])) for m in receipt["modules"]}


def objects(cert: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["source"]: o for o in cert["objects"]}


def schedule(res: Realized) -> dict[str, Any]:
    s: dict[str, Any] = json.loads(Path(str(res.result["receipt"])).read_text())["schedule"]
    return s


def written(root: Path) -> dict[str, object]:
    """What a no-op must leave as it was: the store, receipts, build folders, every cache but the no-op's."""
    return {"store": store_listing(root), "receipts": listing(root / "receipts"), "build": listing(root / "build"),
            "state": listing(root / "state", skip=(CACHES["realize"].folder,)), "profiles": listing(root / "profiles")}


def events(res: Realized, kind: str) -> list[str]:
    return [r["message"] for r in map(json.loads, res.out.splitlines()) if r.get("event") == kind]


def test_heavy_units_of_two_variants_overlap_and_a_waivable_unit_compiles_once(tmp_path: Path,
                                                                              shared_root: Path) -> None:
    proj = joint_project(tmp_path / "p", "jointa", shared_root)
    res = proj.realize("--explain")
    certs = certificates(shared_root, res)
    plain, spiced = objects(certs["plain"]), objects(certs["spiced"])
    assert {s: o["decision"] for s, o in plain.items()} == dict.fromkeys(ALL, "compiled")
    # heavy.cpp and bindings.cpp read what the variants define differently: each variant compiles its own
    assert spiced["heavy.cpp"]["decision"] == spiced["bindings.cpp"]["decision"] == "compiled"
    # the light units waited for plain's objects and reuse them, their differing defines waived
    for unit in ("light_a.cpp", "light_b.cpp"):
        assert spiced[unit]["decision"] == "reused-variant"
        assert spiced[unit]["entry"] == plain[unit]["entry"]
        assert spiced[unit]["waited_for"] == f"plain/joint_ext: {unit}"
        assert spiced[unit]["waived"] == ["JOINT_FLAVOR", "TORCH_EXTENSION_NAME"]
    # the computed include hid flavor.h from the prediction: it waited, the real dependency list said no,
    # and it compiled in the second phase, never reused
    assert spiced["computed.cpp"]["decision"] == "compiled"
    assert spiced["computed.cpp"]["reason"].startswith("predicted to reuse plain/joint_ext: computed.cpp, but ")
    assert "flavor.h mentions one of them" in spiced["computed.cpp"]["reason"]
    s = schedule(res)
    assert (s["predicted_to_wait"], s["waited"], s["mispredicted"]) == (3, 2, 1)
    # the compile's progress said which unit ran longest and for how long (each compile writes its start), and
    # the compiles' duration is said once, by the schedule's line, not by a closing line of the bar as well
    doing = [r for r in map(json.loads, res.out.splitlines()) if r.get("event") == "progress" and r.get("doing")]
    assert doing and {r["label"] for r in doing} <= {"compiling jointa", "compiling jointa (second phase)"}
    # (which unit it names depends on when the watcher sampled: any unit of the graph, with its seconds)
    named = {f"running {v}/{m}: {u}" for v, m in (("plain", "joint_ext"), ("spiced", "joint_spiced_ext")) for u in ALL}
    assert all(any(r["doing"].startswith(n) for n in named) and r["doing_s"] >= 0 for r in doing), doing
    closing = [r for r in map(json.loads, res.out.splitlines()) if r.get("event") == "progress"
               and r.get("label", "").startswith("compiling jointa") and ": done, " in r.get("message", "")]
    assert not closing, closing
    assert [m for m in events(res, "build") if m.startswith("compiled 8 objects in ")]
    units = {u["unit"]: u for u in s["units"]}
    assert len(units) == 8
    assert units["spiced/joint_spiced_ext: computed.cpp"]["phase"] == 2
    a, b = units["plain/joint_ext: heavy.cpp"], units["spiced/joint_spiced_ext: heavy.cpp"]
    assert a["phase"] == b["phase"] == 1
    assert a["started_s"] < b["started_s"] + b["seconds"] and b["started_s"] < a["started_s"] + a["seconds"], (a, b)
    assert s["critical_path"]["unit"] in units and 0 < s["busy"] <= 1.0
    # the compilers' CPU time is recorded, each unit's and over the job slots (one compiler thread each here)
    assert 0 < s["cpu_busy"] <= s["busy"] * 1.05 and s["cpu_seconds"] > 0
    assert all(u["cpu_seconds"] > 0 for u in s["units"])
    for v in ("plain", "spiced"):
        assert s["variants"][v]["plan_s"] > 0 and s["variants"][v]["link_s"] > 0
    assert s["import_check_s"] > 0
    # the check's interpreter imported torch while the compiles ran (the profile holds no wheels of its own)
    check = json.loads(Path(str(res.result["receipt"])).read_text())["import_check"]
    assert check["started_early"] is True and check["modules"] == ["joint_ext", "joint_spiced_ext"]
    # what each compile took is in its record and the certificate; the next build starts the longest first
    assert plain["heavy.cpp"]["cost"]["seconds"] > plain["light_a.cpp"]["cost"]["seconds"]
    assert plain["heavy.cpp"]["cost"]["max_rss"] > 1 << 20
    explained = events(res, "explain")
    assert "joint_spiced_ext: light_a.cpp: reused-variant [waived JOINT_FLAVOR, TORCH_EXTENSION_NAME] " \
           "[waited for plain/joint_ext: light_a.cpp]" in explained
    assert any(line.startswith("joint_spiced_ext: heavy.cpp: compiled (") and "not waiting for it: " in line
               and "heavy.cpp mentions one of them" in line for line in explained), explained
    # both modules import together, each with its own flavor
    out = subprocess.run([sys.executable, "-c", "import joint_ext, joint_spiced_ext; "
                          "print(*joint_ext.values()); print(*joint_spiced_ext.values())"],
                         env={**os.environ, "PYTHONPATH": str(res.result["profile"])}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    first, second = (tuple(int(x) for x in line.split()) for line in out.stdout.splitlines())
    assert (second[0] - first[0], second[1:]) == (1, (41, 42, 240)) and first[3] == 140

    # a change every unit reads: all compile again, the longest last time first; computed.cpp's last
    # dependency list (its object record) names flavor.h, so this time it is predicted right: no second phase
    proj.edit("common.h", "return 40;", "return 40 + 0;")
    again = schedule(proj.realize())
    started = [u["unit"].rsplit(": ", 1)[1] for u in again["units"]]
    assert started[:2] == ["heavy.cpp", "heavy.cpp"], again["units"]
    assert (again["predicted_to_wait"], again["waited"], again["mispredicted"]) == (2, 2, 0)
    assert {u["phase"] for u in again["units"]} == {1}


def test_joint_and_separate_variant_realizes_give_the_same_modules(tmp_path: Path, shared_root: Path) -> None:
    wheels = toolchain_wheels_from(shared_root, tmp_path / "wheels")
    proj = joint_project(tmp_path / "p", "jointb", tmp_path / "unused", heavy_parts=0)
    env = cli.hermetic_env(tmp_path / "home")
    modules: dict[str, dict[str, str]] = {}
    for run, args in (("joint", ()), ("plain", ("--variant", "plain")), ("spiced", ("--variant", "spiced"))):
        root = tmp_path / f"root-{run}"
        realize_toolchain(root, env, tmp_path, wheels)
        p = cli.run(root, "realize", proj.recipe, "--json", *args,
                    env={**env, "PIP_FIND_LINKS": str(wheels), "PIP_NO_INDEX": "1"})
        assert p.rc == 0, p.err[-3000:]
        receipt = json.loads(Path(str(p.result["receipt"])).read_text())
        modules[run] = {m["module"]: m["sha256"] for m in receipt["modules"]}
    assert modules["joint"] == {**modules["plain"], **modules["spiced"]}
    assert len(modules["joint"]) == 2


def test_a_failing_compile_keeps_the_other_variants_objects(tmp_path: Path, shared_root: Path) -> None:
    variants = JOINT_VARIANTS.replace("spiced", "broken").replace('JOINT_FLAVOR = "2"', 'JOINT_FLAVOR = "0"')
    proj = joint_project(tmp_path / "p", "jointc", shared_root, heavy_parts=0, variants=variants)
    failed = proj.realize(check=False)
    assert failed.rc == 1
    assert "compiling jointc failed (1 object: broken/joint_broken_ext: heavy.cpp)" in failed.err
    assert "flavor 0 does not build" in failed.err
    assert "objects that compiled are kept" in failed.err
    # the other variant's objects were recorded as they finished: its own realize compiles nothing
    plain = proj.realize("--variant", "plain")
    counts = plain.result["counts"]
    assert isinstance(counts, dict)
    assert (counts.get("objects_compiled", 0), counts["objects_reused"]) == (0, 5), counts
    assert set(plain.decisions.values()) == {"reused"}


def test_a_fresh_checkout_of_the_same_bytes_is_a_noop(tmp_path: Path, shared_root: Path) -> None:
    proj = joint_project(tmp_path / "p", "jointd", shared_root, heavy_parts=0)
    first = proj.realize()
    assert first.result["changed"] is True
    before = written(shared_root)
    # a checkout at the same path: the same bytes, new inodes and mtimes
    shutil.copytree(proj.folder, tmp_path / "copy")
    shutil.rmtree(proj.folder)
    shutil.copytree(tmp_path / "copy", proj.folder)
    same = proj.realize()
    # and one in a new folder
    moved = Project.at(tmp_path / "copy", "jointd", shared_root)
    elsewhere = moved.realize()
    for res in (same, elsewhere):
        assert res.result["changed"] is False
        assert res.result["timings"] == {}            # step 0 only: no build, no import check
        counts = res.result["counts"]
        assert isinstance(counts, dict)
        assert (counts["objects_compiled"], counts["objects_reused"], counts["objects_reused-variant"]) == (0, 8, 2)
    # nothing written but the no-op records and the gc root's recipe path
    assert written(shared_root) == before
    root_record = json.loads((shared_root / "roots" / "jointd.json").read_text())
    assert root_record["recipe"] == str(moved.recipe)
    # the slow path counts the same way
    slow = moved.realize("--explain")
    assert slow.result["changed"] is False
    counts = slow.result["counts"]
    assert isinstance(counts, dict)
    assert (counts["objects_compiled"], counts["objects_reused"], counts["objects_reused-variant"]) == (0, 8, 2)
    # a real edit is still a change
    moved.edit("light_a.cpp", "+ 1;", "+ 3;")
    edited = moved.realize()
    assert edited.result["changed"] is True
    assert edited.result["counts"]["objects_compiled"] == 1  # type: ignore[index]


def test_heavy_compiles_share_the_memory_there_is() -> None:
    gib = 1 << 30
    # two 4.5 GB units on 16 jobs with 128 GiB: nothing to cap
    assert memory_pool([int(4.5 * gib)] * 2 + [gib] * 30, 16, 120 * gib)[0] is None
    # the same with 8 GiB: at most one of them at a time
    assert memory_pool([int(4.5 * gib)] * 2 + [gib // 4] * 30, 16, 8 * gib) == (1, gib // 2)
    # 24 GiB, 8 jobs, 5 GB units: four side by side
    assert memory_pool([5 * gib] * 6, 8, 24 * gib)[0] == 4
    # no record yet, one job, or no figure: no pool
    assert memory_pool([None, None], 4, 8 * gib)[0] is None
    assert memory_pool([5 * gib], 1, gib)[0] is None
    assert memory_pool([5 * gib], 4, None)[0] is None
