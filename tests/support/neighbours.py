"""Commands side by side on one root (issue 35): a realize and a neighbour started at a seeded random moment
into it, then the checks that neither lied to nor deleted under the other. Shared by tests/test_neighbours.py
(a fixed-seed sample) and bench/soak's neighbours phase (20 rounds a pair and more).

The realizes: a lock-only recipe (three wheels from a find-links folder: an unpack of 200 files, 2 MiB of
incompressible bytes, one small) and the compile fixture (tests/data/reuse_src, six objects, one module, the
import check), each cold (its entries collected and, for the build, its import check forgotten) or warm (every
entry in the store: ``realize --explain`` goes past the no-op check and pins them all). The neighbours:
``verify``, ``verify --repair``, ``gc``, ``gc --drop-root`` of the realize's own recipe, ``import`` of an
archive of the lock-only recipe's closure (the very entries a cold lock-only realize publishes) and ``export``
of another root.

A round passes when: the realize exits 0; the neighbour exits 0; a verify or a repair beside it reports no
problem (the store is sound: any problem is a false report) and a repair removes nothing; after both, verify
is clean, every entry every gc root names is there and every profile points at an entry that is there (no
pinned or just-published entry was deleted).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hermetic.store import Store
from tests.support import cli
from tests.support.cli import Result
from tests.support.recipes import TOOLCHAIN_LOCK, pip_lock_line, recipe_toml
from tests.support.wheels import BuiltWheel, build_wheel

FIXTURE_SRC = Path(__file__).resolve().parents[1] / "data" / "reuse_src"
REALIZES = ("lock-cold", "lock-warm", "build-cold", "build-warm")
NEIGHBOURS = ("verify", "repair", "gc", "drop-root", "import", "export")
LOCK, BUILD, BASE = "nb-lock", "nb-build", "nb-base"
ROUND_LIMIT_S = 600


@dataclass
class Round:
    index: int
    realize: str
    neighbour: str
    offset_s: float
    realize_rc: int | None = None
    neighbour_rc: int | None = None
    false_reports: list[str] = field(default_factory=list)   # problems a verify or repair beside it said
    repaired: int = 0                                       # what a repair beside it removed
    after_problems: list[str] = field(default_factory=list)  # verify after the round
    missing: list[str] = field(default_factory=list)         # root entries or profile targets gone
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _wheels(out: Path) -> list[BuiltWheel]:
    rng = random.Random(35)
    return [build_wheel(out, "nbmany", "1.0", {f"nbmany/m{i // 40}/f{i}.py": f"V = {i}\n" * 30 for i in range(200)}),
            build_wheel(out, "nbbulk", "1.0", {f"nbbulk/data{i}.bin": rng.randbytes(512 << 10) for i in range(4)}),
            build_wheel(out, "nbsmall", "1.0", {"nbsmall/__init__.py": "X = 1\n"})]


class NeighbourLab:
    """One root holding the CUDA toolchain, three recipes and an archive; ``round`` runs one pair."""

    def __init__(self, work: Path, root: Path, env: dict[str, str], seed: int = 35) -> None:
        self.work, self.root = work, root
        self.links = work / "links"          # the find-links folder: the test wheels (and the toolchain's)
        self.env = {**env, "PIP_FIND_LINKS": str(self.links), "PIP_NO_INDEX": "1"}
        self.rng = random.Random(seed)
        self.recipes: dict[str, Path] = {}
        self.archive = work / "nb-lock.tar.zst"
        self.spans: dict[str, float] = {}    # how long each kind of realize took alone: the offsets' range

    def h(self, *args: str | Path, timeout: float = ROUND_LIMIT_S) -> Result:
        return cli.run(self.root, *args, env=self.env, timeout=timeout)

    def popen(self, *args: str | Path) -> subprocess.Popen[str]:
        return cli.popen(self.root, *args, env=self.env)

    # setting up ------------------------------------------------------------------------------------------
    def setup(self) -> dict[str, Any]:
        """The recipes, the base root, the archive, and each realize timed alone (toolchain realized already)."""
        self.links.mkdir(parents=True, exist_ok=True)
        wheels = _wheels(self.work / "wheels")
        for w in wheels:
            shutil.copy(w.path, self.links / w.path.name)
        lock = self.work / LOCK
        lock.mkdir(parents=True, exist_ok=True)
        (lock / "env.lock.txt").write_text("".join(pip_lock_line(w) for w in wheels))
        (lock / "recipe.toml").write_text(recipe_toml(LOCK, locks=["env.lock.txt"]))
        base = self.work / BASE
        base.mkdir(parents=True, exist_ok=True)
        (base / "env.lock.txt").write_text(pip_lock_line(wheels[2]))
        (base / "recipe.toml").write_text(recipe_toml(BASE, locks=["env.lock.txt"]))
        build = self.work / BUILD
        shutil.copytree(FIXTURE_SRC, build / "src", dirs_exist_ok=True)
        clock = build / "src" / "clock.cpp"
        clock.write_text(clock.read_text().replace("__TIME__", '"fixed"'))
        shutil.copy(TOOLCHAIN_LOCK, build)
        ext = 'name = "nb_ext"\nsource = "src"\nsources = ["*.cpp", "*.cu"]\ninclude_dirs = ["."]'
        (build / "recipe.toml").write_text(recipe_toml(BUILD, toolchain=True, archs=["9.0"], sources={"src": "src"},
                                                       jobs=2, extensions=[ext]))
        self.recipes = {LOCK: lock / "recipe.toml", BUILD: build / "recipe.toml", BASE: base / "recipe.toml"}
        self._must(self.h("realize", self.recipes[BASE]))
        side = self.work / "side-root"   # the archive: the lock-only recipe's closure, made on another root
        self._must(cli.run(side, "realize", self.recipes[LOCK], env=self.env))
        self._must(cli.run(side, "export", self.archive, "--name", LOCK, "--level", "1", env=self.env))
        shutil.rmtree(side, ignore_errors=True)
        for kind in REALIZES:
            self._prepare(kind)
            began = time.monotonic()
            self._must(self.h(*self._realize_args(kind)))
            self.spans[kind] = round(time.monotonic() - began, 2)
        return {"spans_s": dict(self.spans)}

    @staticmethod
    def _must(res: Result) -> None:
        if res.rc != 0:
            raise RuntimeError(f"setting the neighbours up failed ({res.rc}):\n{res.err[-3000:]}")

    def _recipe(self, kind: str) -> str:
        return LOCK if kind.startswith("lock") else BUILD

    def _realize_args(self, kind: str) -> list[str | Path]:
        args: list[str | Path] = ["realize", self.recipes[self._recipe(kind)], "--json"]
        return [*args, "--explain"] if kind.endswith("warm") else args

    def _prepare(self, kind: str) -> None:
        """Cold: the recipe's entries collected (and the build's import check forgotten, so that it runs);
        warm: every entry in the store and rooted."""
        name = self._recipe(kind)
        if kind.endswith("cold"):
            self._must(self.h("gc", "--drop-root", name))
            if name == BUILD:
                shutil.rmtree(self.root / "state" / "imports-v1", ignore_errors=True)
        else:
            self._must(self.h("realize", self.recipes[name]))

    def _neighbour_args(self, neighbour: str, kind: str, index: int) -> list[str | Path]:
        return {"verify": ["verify"], "repair": ["verify", "--repair"], "gc": ["gc"],
                "drop-root": ["gc", "--drop-root", self._recipe(kind)], "import": ["import", self.archive],
                "export": ["export", self.work / f"out-{index % 2}.tar.zst", "--name", BASE, "--level", "1"],
                }[neighbour] + ["--json"]

    # one round -------------------------------------------------------------------------------------------
    def round(self, index: int, kind: str, neighbour: str, offset_s: float | None = None) -> Round:
        """The realize ``kind`` and, ``offset_s`` (default: a seeded moment within its span) after it starts,
        the neighbour; both run to their end, then the checks."""
        if offset_s is None:
            offset_s = round(self.rng.uniform(0, self.spans.get(kind, 1.0)), 3)
        r = Round(index, kind, neighbour, offset_s)
        self._prepare(kind)
        began = time.monotonic()
        realize = self.popen(*self._realize_args(kind))
        outputs: dict[str, tuple[str, str]] = {}
        reader = threading.Thread(target=lambda: outputs.__setitem__("realize", realize.communicate(
            timeout=ROUND_LIMIT_S)), daemon=True)
        reader.start()
        time.sleep(offset_s)
        near = self.h(*self._neighbour_args(neighbour, kind, index))
        reader.join(ROUND_LIMIT_S)
        r.realize_rc = realize.wait(timeout=60)
        r.neighbour_rc = near.rc
        out, err = outputs.get("realize", ("", ""))
        if r.realize_rc != 0:
            r.problems.append(f"the realize failed ({r.realize_rc}):\n{err[-2000:]}")
        if near.rc != 0:
            r.problems.append(f"the neighbour {neighbour} failed ({near.rc}):\n{near.err[-2000:]}")
        if neighbour in ("verify", "repair"):
            said = [rec for rec in near.records if rec.get("event") == "problem"]
            r.false_reports = [str(rec.get("message")) for rec in said]
            if r.false_reports:
                r.problems.append(f"{neighbour} beside a realize reported {len(said)} problems in a sound store: "
                                  f"{r.false_reports[:3]}")
            repairs = [rec for rec in near.records if rec.get("event") == "repair"]
            r.repaired = sum(int(str(rec.get("message", "removed 0")).split()[1]) for rec in repairs)
        self._check_after(r)
        r.seconds = round(time.monotonic() - began, 2)
        return r

    def _check_after(self, r: Round) -> None:
        after = self.h("verify", "--json")
        r.after_problems = [str(rec.get("message")) for rec in after.records if rec.get("event") == "problem"]
        if after.rc != 0 or r.after_problems:
            r.problems.append(f"verify after the round: exit {after.rc}, {r.after_problems[:5]}")
        store = Store(self.root / "store")
        for p in sorted((self.root / "roots").glob("*.json")):
            try:
                refs = json.loads(p.read_text())["refs"]
            except (OSError, ValueError, KeyError):
                continue   # dropped meanwhile
            r.missing += [f"{p.stem}: {ref}" for ref in refs
                          if ref.startswith("entry:") and not store.has_entry(ref[len("entry:"):])]
        profiles = self.root / "profiles"
        r.missing += [f"profile {p.name}" for p in (sorted(profiles.iterdir()) if profiles.exists() else [])
                      if p.is_symlink() and not p.exists()]
        if r.missing:
            r.problems.append(f"entries a root or a profile names are gone: {r.missing[:5]}")


def plan(rounds: int, seed: int) -> list[tuple[str, str]]:
    """Every pair ``rounds`` times, in a seeded order (each pass over the pairs shuffled anew)."""
    rng = random.Random(seed)
    pairs = [(k, n) for k in REALIZES for n in NEIGHBOURS]
    out = []
    for _ in range(rounds):
        batch = list(pairs)
        rng.shuffle(batch)
        out += batch
    return out


def summarize(rounds: list[Round]) -> dict[str, Any]:
    pairs: dict[str, dict[str, int]] = {}
    for r in rounds:
        cell = pairs.setdefault(f"{r.realize} + {r.neighbour}", {"rounds": 0, "ok": 0})
        cell["rounds"] += 1
        cell["ok"] += r.ok
    return {
        "rounds": len(rounds),
        "ok": sum(r.ok for r in rounds),
        "pairs": pairs,
        "false_corruption_reports": sum(len(r.false_reports) for r in rounds),
        "removed_by_repair_beside_a_realize": sum(r.repaired for r in rounds),
        "problems_after_a_round": sum(len(r.after_problems) for r in rounds),
        "deleted_pinned_or_published": sum(len(r.missing) for r in rounds),
        "realizes_failed": sum(r.realize_rc != 0 for r in rounds),
        "neighbours_failed": sum(r.neighbour_rc != 0 for r in rounds),
        "round_seconds": [r.seconds for r in rounds],
        "failed": [asdict(r) for r in rounds if not r.ok],
    }
