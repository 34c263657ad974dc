"""The pure parts of `hermetic run`, called directly: the analysis of raw samples, the device class, the digest
check. (test_run.py drives the same code through the CLI with a real worker; these pin its rules.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermetic.errors import BadInput
from hermetic.run.analysis import analyze
from hermetic.run.digests import check_digests, device_class
from hermetic.run.spec import Runner, load_runner
from tests.support.cli import REPO


@pytest.fixture(scope="module")
def runner() -> Runner:
    return load_runner(REPO / "runner" / "worker.toml")


def raw_samples(runner: Runner, times: dict[str, list[float]], *, calls: int = 3,
                invalid: frozenset[tuple[str, int]] = frozenset()) -> dict[str, Any]:
    """Raw results as the measuring child writes them: ``times[label][rep]`` for each call of a block, the
    first call of each block discarded; ``invalid`` marks (label, rep) whose samples were taken slowed down."""
    samples = []
    for label, per_rep in times.items():
        for rep, t in enumerate(per_rep):
            for call in range(calls + 1):
                samples.append({"label": label, "rep": rep, "call": call, "discarded": call == 0,
                                "time_us": t * (1.5 if call == 0 else 1.0), "host_us": t,
                                "valid": (label, rep) not in invalid, "power_capped": False})
    assert len(next(iter(times.values()))) == runner.protocol.repetitions
    return {"samples": samples, "flags": {"other_process_seen": []}}


def cpu_times(runner: Runner, switch: float = 1.0, mixed: float = 1.0, aa: float = 1.0) -> dict[str, list[float]]:
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    return {"greedy-d4-b1/torch": [50.0] * 5, "greedy-d5-b4/torch": base,
            "greedy-d5-b4/torch#aa": [t * aa for t in base],
            "switch-greedy-d5-b4/torch": [t * switch for t in base],
            "mixed-d5-b4/torch": [t * switch * mixed for t in base]}


def test_a_clear_slowdown_is_decided_and_the_aa_control_holds(runner: Runner) -> None:
    a = analyze(raw_samples(runner, cpu_times(runner, switch=1.05)), runner, "cpu")
    comps = {c["name"]: c for c in a["comparisons"]}
    assert comps["A/A control"]["ratio"] == pytest.approx(1.0) and comps["A/A control"]["contains_1"]
    switch = comps["switch graph vs original, all greedy"]
    assert switch["ratio"] == pytest.approx(1.05) and switch["decision"] == "slower"
    assert comps["sampled rows vs greedy"]["decision"] == "same"
    assert "skipped" in comps["facc vs stock kernels"]  # its kernel sets exist on a GPU only
    assert a["flags"]["aa_noisy"] is False and a["cells"]["greedy-d5-b4/torch"]["n"] == 15


def test_a_failed_aa_control_flags_the_run(runner: Runner) -> None:
    a = analyze(raw_samples(runner, cpu_times(runner, aa=1.03)), runner, "cpu")
    assert a["aa"]["contains_1"] is False and a["flags"]["aa_noisy"] is True


def test_invalid_samples_are_left_out_and_counted(runner: Runner) -> None:
    slowed = frozenset({("greedy-d4-b1/torch", 2)})
    a = analyze(raw_samples(runner, cpu_times(runner), invalid=slowed), runner, "cpu")
    cell = a["cells"]["greedy-d4-b1/torch"]
    assert cell["invalid"] == 3 and cell["n"] == 12 and cell["per_rep_median"][2] != cell["per_rep_median"][2]
    assert a["flags"]["invalid_samples"] == 3


def test_the_device_class_names_what_changes_arithmetic() -> None:
    cpu = {"torch": "2.14.1+cu130", "cpu_capability": "AVX512", "cpu_vendor": "amd", "threads": 2}
    assert device_class("cpu", cpu) == "cpu-avx512-amd-torch2.14.1_cu130-t2"
    assert device_class("cpu", {**cpu, "cpu_vendor": "intel", "threads": 4}) == "cpu-avx512-intel-torch2.14.1_cu130-t4"
    assert device_class("gpu", {"torch": "2.11.0+cu130", "capability": "9.0"}) == "sm90-torch2.11.0_cu130"


def test_the_digest_check_matches_records_and_flags(tmp_path: Path) -> None:
    digests = {"s00/d4/torch": "a" * 64, "s01/d4/torch": "b" * 64}
    unknown = check_digests(digests, tmp_path, "cpu-x", record=False, runner_name="r")
    assert unknown["status"] == "unknown-class" and "--record-digests" in unknown["message"]
    recorded = check_digests(digests, tmp_path, "cpu-x", record=True, runner_name="r")
    assert recorded["status"] == "match" and recorded["compared"] == 2 and (tmp_path / "cpu-x.txt").is_file()
    drifted = check_digests({**digests, "s01/d4/torch": "c" * 64}, tmp_path, "cpu-x", record=False, runner_name="r")
    assert drifted["status"] == "mismatch" and [m["key"] for m in drifted["mismatches"]] == ["s01/d4/torch"]
    more = check_digests({**digests, "s02/d4/torch": "d" * 64}, tmp_path, "cpu-x", record=False, runner_name="r")
    assert more["status"] == "incomplete" and more["missing"] == ["s02/d4/torch"]
    (tmp_path / "cpu-y.txt").write_text("# a comment\ns00/d4/torch not-a-digest\n")
    with pytest.raises(BadInput) as e:
        check_digests(digests, tmp_path, "cpu-y", record=False, runner_name="r")
    assert e.value.where == f"{tmp_path / 'cpu-y.txt'}:2"
