"""The dry run prints the real plan (issue 42): ``realize --dry-run`` and ``realize`` make every decision with
the same functions (realize.plan), so what the plan says of each wheel, source, object and link is what the
realize then does: on a cold build, for another variant, after a header changed, for two variants compiled
together (the graph's prediction), and for a recipe the realize refuses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from hermetic.extensions.certificate import read_certificate
from hermetic.store import Store
from tests.support.builds import Project, joint_recipe
from tests.support.cli import REPO, command
from tests.support.recipes import recipe_toml

ENV = dict(os.environ)


def dry(root: Path, recipe: Path, *args: str) -> dict[str, Any]:
    p = subprocess.run(command(root, "realize", recipe, "--dry-run", "--json", *args), capture_output=True,
                       text=True, env=ENV, cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout.splitlines()[-1]))


def _decisions(root: Path, receipt: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(module, source) -> the decision its certificate records, uncacheable read as compiled (a plan cannot
    know that before the compiler lists the inputs)."""
    store = Store(root / "store")
    return {(m["module"], o["source"]): o["decision"].replace("compiled-uncacheable", "compiled")
            for m in receipt["modules"] for o in read_certificate(store, m["certificate_blob"])["objects"]}


def _same(root: Path, done: Any, planned: dict[str, Any]) -> None:
    """Per object, per module and in the counts, the plan is what the realize did."""
    plan = planned["plan"]
    receipt = json.loads(Path(done.result["receipt"]).read_text())
    assert [(m["module"], m["variant"]) for m in plan["modules"]] == \
        [(r["module"], r["variant"]) for r in receipt["modules"]]
    for m, r in zip(plan["modules"], receipt["modules"], strict=True):
        assert m["action"] == ("link" if r["linked"] else "reuse"), (m, r["linked"])
    assert _decisions(root, receipt) == {(m["module"], o["source"]): o["decision"]
                                         for m in plan["modules"] for o in m["objects"]}
    counts = {k: v for k, v in done.result["counts"].items() if k != "files"}
    expected = {k: v for k, v in planned["counts"].items() if k != "files"}
    expected["objects_compiled-uncacheable"] = counts["objects_compiled-uncacheable"]
    expected["objects_compiled"] -= counts["objects_compiled-uncacheable"]
    assert counts == expected


def test_the_plan_of_a_build_is_what_the_realize_does(tmp_path: Path, shared_root: Path) -> None:
    proj = Project(tmp_path / "p", "planned", shared_root)
    cold = dry(shared_root, proj.recipe)
    assert cold["plan"]["version"] == 2 and cold["plan"]["modules"][0]["action"] == "link"
    _same(shared_root, proj.realize(), cold)
    # another variant: its objects reused across variants or compiled, as the plan says
    feature = dry(shared_root, proj.recipe, "--variant", "feature")
    assert {o["decision"] for o in feature["plan"]["modules"][0]["objects"]} >= {"reused-variant", "compiled"}
    _same(shared_root, proj.realize("--variant", "feature"), feature)
    # a header edited: what reads it compiles again (and why), the rest is reused, and the module is linked
    proj.edit("util.h", "#", "// edited\n#")
    edited = dry(shared_root, proj.recipe)
    objects = {o["source"]: o for o in edited["plan"]["modules"][0]["objects"]}
    assert any(o["decision"] == "compiled" and "util.h" in o["reason"] for o in objects.values()), objects
    assert any(o["decision"] == "reused" for o in objects.values()), objects
    _same(shared_root, proj.realize(), edited)
    # unchanged since: up to date, and the module found by its link key once the no-op record is gone
    assert dry(shared_root, proj.recipe)["plan"]["up_to_date"] is True
    explained = dry(shared_root, proj.recipe, "-v")
    assert explained["plan"]["up_to_date"] is True


def test_two_variants_compiled_together_are_planned_as_the_graph_predicts(tmp_path: Path, shared_root: Path) -> None:
    """A unit both variants compile (another variant's copy, its defines waivable): the plan says the second
    waits for the first's object, as the build graph predicts it, and the realize does so."""
    proj = Project(tmp_path / "j", "planjoint", shared_root, sources=REPO / "tests" / "data" / "joint_src",
                   recipe=joint_recipe("planjoint", heavy_parts=1, computed=False))
    proj.realize()
    proj.edit("light_a.cpp", "+ 1;", "+ 3;")
    planned = dry(shared_root, proj.recipe, "-v")
    plain, spiced = ({o["source"]: o for o in m["objects"]} for m in planned["plan"]["modules"])
    assert plain["light_a.cpp"]["decision"] == "compiled" and "light_a.cpp changed" in plain["light_a.cpp"]["reason"]
    assert spiced["light_a.cpp"]["decision"] == "reused-variant" and spiced["light_a.cpp"]["predicted"] is True
    assert "the object of joint_ext: light_a.cpp" in spiced["light_a.cpp"]["reason"]
    done = proj.realize()
    receipt = json.loads(Path(done.result["receipt"]).read_text())
    assert receipt["schedule"]["predicted_to_wait"] == 1 and receipt["schedule"]["waited"] == 1
    _same(shared_root, done, planned)


def test_a_recipe_the_realize_refuses_the_plan_refuses_alike(tmp_path: Path, shared_root: Path) -> None:
    """Two sources and a variant with patches: the realize refuses it before any work; the dry run used to
    plan it anyway (its sources were planned by other code)."""
    folder = tmp_path / "two"
    for src in ("a", "b"):
        (folder / src).mkdir(parents=True)
        (folder / src / f"{src}.cpp").write_text("int f() { return 1; }\n")
    (folder / "fix.patch").write_text("--- a/a.cpp\n+++ b/a.cpp\n@@ -1 +1 @@\n-int f() { return 1; }\n"
                                      "+int f() { return 2; }\n")
    (folder / "cuda-13.0-toolchain.txt").write_text((REPO / "manifests" / "cuda-13.0-toolchain.txt").read_text())
    recipe = folder / "recipe.toml"
    recipe.write_text(recipe_toml("twosrc", toolchain=True, sources={"a": "a", "b": "b"},
                                  extensions=['name = "a_ext"\nsource = "a"\nsources = ["*.cpp"]',
                                              'name = "b_ext"\nsource = "b"\nsources = ["*.cpp"]'],
                                  variants='[variants.fixed]\npatches = ["fix.patch"]'))
    outs = []
    for args in (("--dry-run",), ()):
        p = subprocess.run(command(shared_root, "realize", recipe, "--json", *args), capture_output=True,
                           text=True, env=ENV, cwd=REPO, timeout=900)
        assert p.returncode == 2, p.stderr
        outs.append(json.loads(p.stdout.splitlines()[-1])["error"]["what"])
    assert outs[0] == outs[1] and "has patches but the recipe builds from several sources" in outs[0]
