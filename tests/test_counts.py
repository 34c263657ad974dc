"""``realize.noop.Counts``: the one form of a realize's counts (the receipt's, the no-op record's, the dry run's
and the result's), read back from what earlier versions wrote (receipt format 1: ``objects_objects``)."""

from __future__ import annotations

import json

import pytest

from hermetic.extensions.objects import Decision
from hermetic.realize.noop import OBJECT_KEYS, Counts, ObjectCounts
from tests.support.cli import REPO

MEASURED = REPO / "docs" / "measurements"


def test_the_object_keys_are_the_compile_rooms_decisions() -> None:
    assert {key.removeprefix("objects_") for _a, key in OBJECT_KEYS} == {str(d) for d in Decision}
    tally = {Decision.COMPILED: 3, Decision.REUSED_VARIANT: 2, Decision.FETCHED_REMOTE: 1, Decision.UNCACHEABLE: 1}
    o = ObjectCounts.from_decisions(tally)
    assert (o.compiled, o.uncacheable, o.reused, o.reused_variant, o.fetched_remote, o.total) == (3, 1, 0, 2, 1, 7)


def test_old_receipts_and_results_read_the_same() -> None:
    """A receipt of format 1 (a real one, measured on an H200) and a result record of the same time: their
    ``objects_objects`` is ``objects`` now, and every count they hold comes back."""
    receipt = json.loads((MEASURED / "exl3-receipt-h200.json").read_text())
    assert receipt["format"] == 1
    c = Counts.from_json(receipt["counts"])
    assert c.objects is not None and (c.objects.total, c.objects.compiled, c.objects.reused) == (388, 35, 194)
    assert c.to_json() == {**{k: v for k, v in receipt["counts"].items() if k != "objects_objects"},
                           "objects": 388, "objects_compiled-uncacheable": 0, "objects_fetched-remote": 0,
                           "modules_linked": 0}
    result = json.loads((MEASURED / "gpu-h200-23" / "b-realize.result.json").read_text())["counts"]
    r = Counts.from_json(result)
    assert r.objects is not None and r.objects.fetched_remote == 229 and r.objects.total == result["objects_objects"]


def test_a_recipe_that_builds_nothing_has_no_object_keys() -> None:
    c = Counts(wheels=2, fetched=1, fetched_bytes=10, unpacked=1, reused=1, files=9)
    assert c.to_json() == {"wheels": 2, "fetched": 1, "fetched_bytes": 10, "unpacked": 1, "reused": 1, "files": 9}
    assert Counts.from_json(c.to_json()) == c and c.noop().to_json() == {
        "wheels": 2, "fetched": 0, "fetched_bytes": 0, "unpacked": 0, "reused": 2, "files": 9}


def test_the_noop_counts_every_wheel_and_object_reused() -> None:
    built = Counts(5, 1, 100, 2, 3, 4, ObjectCounts(compiled=6, uncacheable=1, reused=2, reused_variant=3,
                                                    fetched_remote=4), modules_linked=2)
    again = Counts.from_json(json.loads(json.dumps(built.to_json())))
    assert again == built
    noop = again.noop()
    assert noop.to_json() == {"wheels": 5, "fetched": 0, "fetched_bytes": 0, "unpacked": 0, "reused": 5, "files": 4,
                              "objects": 16, "objects_compiled": 0, "objects_compiled-uncacheable": 0,
                              "objects_reused": 13, "objects_reused-variant": 3, "objects_fetched-remote": 0,
                              "modules_linked": 0}


def test_a_v1_noop_record_keeps_the_noop_a_noop() -> None:
    """A no-op record written before this change (state/realize-v1 does not move): its counts still read."""
    old = {"fetched": 0, "fetched_bytes": 0, "files": 4, "objects_compiled": 0, "objects_objects": 388,
           "objects_reused": 231, "objects_reused-variant": 157, "reused": 5, "unpacked": 0, "wheels": 5}
    assert Counts.from_json(old).noop().to_json()["objects"] == 388


@pytest.mark.parametrize("bad", [[], {"wheels": "5"}, {"wheels": True}, {"objects_objects": -1}, {"files": 1.5}])
def test_a_count_of_another_shape_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        Counts.from_json(bad)


def test_unknown_keys_of_a_newer_hermetic_are_ignored() -> None:
    assert Counts.from_json({"wheels": 1, "objects_from-the-future": 3}).wheels == 1


def test_the_closing_line_says_one_and_many() -> None:
    one = Counts(1, 1, 0, 1, 0, 1, ObjectCounts(compiled=1), modules_linked=1)
    assert one.say() == "1 wheel: 1 fetched, 1 unpacked, 0 reused; objects: 1 compiled, 0 reused, 0 reused across " \
                        "variants; 1 file"
    two = Counts(2, 0, 0, 0, 2, 2, ObjectCounts(reused=2, fetched_remote=2))
    assert two.say() == "2 wheels: 0 fetched, 0 unpacked, 2 reused; objects: 0 compiled, 2 reused, 0 reused across " \
                        "variants, 2 from the remote cache; 2 files"
