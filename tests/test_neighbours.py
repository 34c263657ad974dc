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

from pathlib import Path

import pytest

from tests.support.cli import REPO, hermetic_env
from tests.support.neighbours import NEIGHBOURS, REALIZES, NeighbourLab
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
