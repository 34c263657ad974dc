"""The decision function of certified reuse, called directly on hand-made records: which stored object a
compile may use, and why none fits. (test_reuse.py drives it through real builds; test_keys.py the keys.)"""

from __future__ import annotations

from typing import Any

from hermetic.extensions.objects import INPUT_CHANGED, NO_MATCH, Chosen, Decision, NoneFits, choose
from hermetic.store.records import ObjectRecord


def record(name: str, defines: dict[str, str | None], inputs: int = 3) -> ObjectRecord:
    rec: dict[str, Any] = {"format": 1, "name": name, "kind": "object", "key": name, "lookup": "L",
                           "source": "a.cpp", "object": "0" * 64, "size": 1,
                           "inputs": [(f"/src/h{i}.h", "stripped", "1" * 64) for i in range(inputs)],
                           "defines": defines, "argv": [], "command": [], "output": "a.o", "env": {},
                           "toolchain": {"cuda": "tc", "host_compilers": {}}, "built_by": {}, "refs": []}
    return rec  # type: ignore[return-value]


MINE = {"TORCH_EXTENSION_NAME": "stock_ext", "NDEBUG": "1"}


def never_blocked(_rec: ObjectRecord, _names: list[str]) -> str | None:
    return None


def test_no_record_and_no_matching_input_say_so() -> None:
    assert choose(MINE, [], lambda r: True, never_blocked) == NoneFits(NO_MATCH)
    found = choose(MINE, [record("a", MINE)], lambda r: False, never_blocked)
    assert found == NoneFits(INPUT_CHANGED)


def test_an_exact_match_wins_over_a_waivable_one() -> None:
    other = record("facc", {**MINE, "TORCH_EXTENSION_NAME": "facc_ext"})
    exact = record("stock", MINE)
    found = choose(MINE, [other, exact], lambda r: True, never_blocked)
    assert isinstance(found, Chosen) and found.record["name"] == "stock" and found.decision is Decision.REUSED
    assert found.waived == []


def test_another_variants_object_is_reused_with_its_differing_defines_waived() -> None:
    other = record("facc", {**MINE, "TORCH_EXTENSION_NAME": "facc_ext", "EXTRA": "1"})
    asked: list[list[str]] = []
    found = choose(MINE, [other], lambda r: True, lambda r, names: asked.append(names) or None)
    assert isinstance(found, Chosen) and found.decision is Decision.REUSED_VARIANT
    assert found.waived == ["EXTRA", "TORCH_EXTENSION_NAME"] and asked == [["EXTRA", "TORCH_EXTENSION_NAME"]]


def test_a_blocked_waiver_compiles_and_says_why() -> None:
    other = record("facc", {**MINE, "TORCH_EXTENSION_NAME": "facc_ext"}, inputs=7)
    found = choose(MINE, [other], lambda r: True, lambda r, names: "/src/bindings.cpp mentions one of them")
    assert isinstance(found, NoneFits) and found.weight == 7
    assert found.reason == "defines differ (TORCH_EXTENSION_NAME) and /src/bindings.cpp mentions one of them"


def test_only_records_whose_inputs_match_are_weighed() -> None:
    stale, fresh = record("stale", MINE), record("fresh", {**MINE, "NDEBUG": None})
    found = choose(MINE, [stale, fresh], lambda r: r["name"] == "fresh", never_blocked)
    assert isinstance(found, Chosen) and found.record["name"] == "fresh" and found.waived == ["NDEBUG"]
    assert Decision.COMPILED.compiled and Decision.UNCACHEABLE.compiled and not Decision.REUSED_VARIANT.compiled
