"""The pure parts of `hermetic run`, called directly: the analysis of raw samples (recorded ones too: a quiet
H200 run and a noisy run on this project's busy 2-core machine), the noisy-run rule, the repetitions advice,
the plot's axes, the device class, the digest check and its drift report. (test_run.py drives the same code
through the CLI with a real worker; these pin its rules.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermetic.errors import BadInput
from hermetic.run.analysis import NOISY, analyze, noisy_run, repetitions_advice
from hermetic.run.digests import check_digests, device_class, read_reference, receipt_facts, record_reference
from hermetic.run.report import axis_range, not_measured_line, plot_figure
from hermetic.run.spec import Runner, load_runner
from tests.support.cli import REPO

QUIET_H200 = REPO / "docs" / "measurements" / "run-h200" / "results-r10.json"  # 10 repetitions, 2026-11-30
NOISY_CPU = REPO / "tests" / "data" / "run" / "cpu-noisy-2core.json"           # 5 repetitions, 2026-12-01


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


def test_a_failed_aa_control_flags_the_run_and_withholds_every_decision(runner: Runner) -> None:
    a = analyze(raw_samples(runner, cpu_times(runner, switch=1.05, aa=1.03)), runner, "cpu")
    assert a["aa"]["contains_1"] is False and a["flags"]["aa_noisy"] is True
    assert "excludes 1" in a["noisy"]
    decided = [c for c in a["comparisons"] if "skipped" not in c]
    assert len(decided) == 3 and all(c["decision"] == NOISY and c["decision_reason"] == a["noisy"] for c in decided)
    switch = next(c for c in decided if c["name"] == "switch graph vs original, all greedy")
    assert switch["interval_decision"] == "slower"  # what the interval alone says is kept, not decided


# the noisy-run rule on recorded samples ----------------------------------------------------------------------
def recorded(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return {"samples": data["samples"], "flags": {"other_process_seen": data["flags"]["other_process_seen"]}}


def test_a_quiet_recorded_run_still_decides(runner: Runner) -> None:
    a = analyze(recorded(QUIET_H200), runner.with_overrides(repetitions=10), "gpu")
    assert a["noisy"] is None and not a["flags"]["aa_noisy"]
    # the kernel sets added after these samples were taken (compiled, triton) have no cells in them: skipped
    decisions = {c["name"]: c["decision"] for c in a["comparisons"] if "skipped" not in c}
    assert decisions == {"A/A control": "same", "switch graph vs original, all greedy": "slower",
                         "sampled rows vs greedy": "unclear", "facc vs stock kernels": "unclear"}
    assert a["aa"]["width"] < 0.005 < a["aa_max_width"] * a["threshold"]


def test_a_noisy_recorded_run_decides_nothing(runner: Runner) -> None:
    a = analyze(recorded(NOISY_CPU), runner, "cpu")
    aa = a["aa"]
    assert aa["contains_1"] and aa["width"] > 1.0  # it contains 1, but is 143 % wide: too wide to decide
    assert a["noisy"] and "wide, more than 4 x the threshold of 0.50 % (2.00 %)" in a["noisy"]
    decided = [c for c in a["comparisons"] if "skipped" not in c]
    assert decided and {c["decision"] for c in decided} == {NOISY}


def test_the_noisy_run_rule_on_its_own() -> None:
    def aa(lo: float, hi: float) -> dict[str, Any]:
        return {"sign_ci": [lo, hi]}
    assert noisy_run(None, threshold=0.005, max_width=4) is None          # no control: nothing to withhold on
    assert noisy_run(aa(0.998, 1.003), threshold=0.005, max_width=4) is None
    assert "excludes 1" in (noisy_run(aa(1.001, 1.004), threshold=0.005, max_width=4) or "")
    assert "excludes 1" in (noisy_run(aa(0.990, 0.999), threshold=0.005, max_width=4) or "")
    assert noisy_run(aa(0.99, 1.0099), threshold=0.005, max_width=4) is None   # 1.99 % wide: within 2 %
    wide = noisy_run(aa(0.99, 1.0101), threshold=0.005, max_width=4) or ""
    assert "2.01 % wide" in wide and "(2.00 %)" in wide
    assert noisy_run(aa(0.99, 1.0101), threshold=0.005, max_width=5) is None   # the multiple is the runner's


# the repetitions a target needs, and the cap said separately ---------------------------------------------------
def test_the_repetitions_needed_are_reported_as_computed_with_the_cap_apart() -> None:
    capped = repetitions_advice(38_398, run=5, halfwidth=0.005, confidence=0.95, by="A/A control")
    assert capped["needed"] == 38_398 and capped["capped"] and capped["cap"] == 1000
    assert capped["recommended"] == 1000
    assert capped["message"].startswith("5 run; 38,398 needed for +-0.50 % at 95 % confidence (by A/A control)")
    assert "more than --repetitions accepts (1,000)" in capped["message"]
    fine = repetitions_advice(24, run=5, halfwidth=0.005, confidence=0.95)
    assert fine["needed"] == fine["recommended"] == 24 and not fine["capped"]
    assert fine["message"] == "5 run; 24 needed for +-0.50 % at 95 % confidence; run --repetitions 24"
    few = repetitions_advice(6, run=5, halfwidth=0.005, confidence=0.95)
    assert few["needed"] == 6 and few["recommended"] == 10 and "(at least 10)" in few["message"]
    assert repetitions_advice(6, run=10, halfwidth=0.005, confidence=0.95)["message"].endswith("; enough")


def test_the_analysis_reports_the_uncapped_need(runner: Runner) -> None:
    a = analyze(recorded(NOISY_CPU), runner, "cpu")
    worst = max(c["repetitions_needed"] for c in a["comparisons"] if "repetitions_needed" in c)
    assert a["repetitions_needed"] == worst > 1000 and a["repetitions_recommended"] == 1000
    assert a["repetitions_advice"]["capped"] and f"{worst:,} needed" in a["repetitions_advice"]["message"]


# the plot's axes ------------------------------------------------------------------------------------------------
def test_one_huge_outlier_does_not_stretch_the_axis(runner: Runner) -> None:
    times = cpu_times(runner, switch=1.05)
    times["mixed-d5-b4/torch"][3] = 700_000.0  # one stalled repetition, as on the busy machine
    a = analyze(raw_samples(runner, times), runner, "cpu")
    meds = [m for c in a["cells"].values() for m in c["per_rep_median"]]
    lo, hi = axis_range(meds, keep=[c["median"] for c in a["cells"].values()])
    assert 40 < lo < 50 and 105 < hi < 200  # every median inside, the outlier far outside
    assert all(lo <= c["median"] <= hi for c in a["cells"].values())
    quiet_lo, quiet_hi = axis_range([99.0, 100.0, 101.0, 100.5])
    assert (quiet_lo, quiet_hi) == pytest.approx((98.9, 101.1))  # a quiet run's axis is its data's, 5 % around
    fig = plot_figure({"analysis": a, "runner": "draft", "device_class": "cpu-test"})
    left = fig.axes[0]
    assert left.get_xlim() == pytest.approx((lo, hi))
    marks = [t.get_text() for t in left.texts]
    assert marks == ["700,000"] and left.texts[0].xy[0] == pytest.approx(hi)  # at the edge, labelled
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_no_offset_is_drawn_over_the_x_labels(runner: Runner) -> None:
    """Calls of about a second, in microseconds: the ticks say the values, with no "1e6" offset at the axis'
    end, where it was drawn over the x label (nor one on the ratios' axis)."""
    times = {label: [t * 12_000 for t in per_rep] for label, per_rep in cpu_times(runner, switch=1.02).items()}
    a = analyze(raw_samples(runner, times), runner, "cpu")
    fig = plot_figure({"analysis": a, "runner": "draft", "device_class": "cpu-test"})
    fig.canvas.draw()
    left, right = fig.axes
    assert left.get_xlim()[1] > 1e6
    assert [ax.xaxis.get_offset_text().get_text() for ax in (left, right)] == ["", ""]
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_comparisons_of_sets_the_device_never_measures_are_one_line(runner: Runner) -> None:
    a = analyze(raw_samples(runner, cpu_times(runner)), runner, "cpu")
    unmeasured = [c["name"] for c in a["comparisons"] if "not_measured" in c]
    assert unmeasured and all("skipped" in c for c in a["comparisons"] if c["name"] in unmeasured)
    line = not_measured_line({"analysis": a, "device": "cpu", "kernels": ["torch"]})
    assert line.startswith("Not compared on the cpu, which does not measure kernel sets ") and "(it measures " \
        "torch)" in line and line.endswith(", ".join(unmeasured) + ".")
    assert "A/A control" not in line


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


def test_the_class_follows_the_capability_torch_dispatches_to() -> None:
    cpu = {"torch": "2.14.1+cu130", "cpu_capability": "AVX2", "cpu_vendor": "amd", "threads": 2,
           "env": {"ATEN_CPU_CAPABILITY": "avx2"}}  # as the measuring process reports it under that variable
    assert device_class("cpu", cpu) == "cpu-avx2-amd-torch2.14.1_cu130-t2"
    assert (REPO / "manifests" / "digests" / "cpu-avx2-amd-torch2.14.1_cu130-t2.txt").is_file()
    # the pin holds the capability torch dispatched to, not how it was chosen
    facts = receipt_facts({"environment": cpu})
    assert facts["runtime cpu_capability"] == "AVX2" and not any("ATEN" in k for k in facts)


def receipt(module_sha: str = "1" * 64, torch: str = "2.14.1+cu130", **environment: Any) -> dict[str, Any]:
    """A run receipt's parts that a reference pins, in the shape pipeline.py writes them."""
    return {"device": "cpu", "device_class": "cpu-avx512-amd-torch2.14.1_cu130-t2",
            "modules": {"hermetic_p2p": {"file": "/r/hermetic_p2p.so", "sha256": module_sha}},
            "environment": {"python": "3.11.7", "executable": "/usr/bin/python3", "torch": torch,
                            "torch_cuda": "13.0", "threads": 2, "cpu_capability": "AVX512", "cpu_vendor": "amd",
                            "env": {"ATEN_CPU_CAPABILITY": None}, **environment},
            "worker": {"sha256": "2" * 64}, "states": {"sha256": "3" * 64}, "runner": {"sha256": "4" * 64}}


def test_the_digest_check_matches_records_and_flags(tmp_path: Path) -> None:
    digests = {"s00/d4/torch": "a" * 64, "s01/d4/torch": "b" * 64}
    now = receipt_facts(receipt())
    unknown = check_digests(digests, tmp_path, "cpu-x", now=now)
    assert unknown["status"] == "unknown-class" and "--record-digests" in unknown["message"]
    assert "compared with nothing, which is not a pass" in unknown["message"]
    taking = check_digests(digests, tmp_path, "cpu-x", now=now, recording=True)
    assert taking["status"] == "recorded" and not (tmp_path / "cpu-x.txt").exists()  # written after the receipt
    (tmp_path / "receipt.json").write_text(json.dumps(receipt()))
    record_reference(digests, tmp_path, "cpu-x", runner_name="r", receipt=tmp_path / "receipt.json",
                     receipt_body=receipt())
    again = check_digests(digests, tmp_path, "cpu-x", now=now)
    assert again["status"] == "match" and again["compared"] == 2 and again["drift"]["differences"] == []
    drifted = check_digests({**digests, "s01/d4/torch": "c" * 64}, tmp_path, "cpu-x", now=now)
    assert drifted["status"] == "mismatch" and [m["key"] for m in drifted["mismatches"]] == ["s01/d4/torch"]
    more = check_digests({**digests, "s02/d4/torch": "d" * 64}, tmp_path, "cpu-x", now=now)
    assert more["status"] == "incomplete" and more["missing"] == ["s02/d4/torch"]
    (tmp_path / "cpu-y.txt").write_text("# a comment\ns00/d4/torch not-a-digest\n")
    with pytest.raises(BadInput) as e:
        check_digests(digests, tmp_path, "cpu-y", now=now)
    assert e.value.where == f"{tmp_path / 'cpu-y.txt'}:2"


def test_a_drift_report_names_what_differs_from_the_pinned_receipt(tmp_path: Path) -> None:
    digests = {"s00/d4/torch": "a" * 64}
    body = receipt()
    (tmp_path / "receipt.json").write_text(json.dumps(body))
    record_reference(digests, tmp_path, "cpu-x", runner_name="r", receipt=tmp_path / "receipt.json",
                     receipt_body=body)
    _, pin = read_reference(tmp_path / "cpu-x.txt")
    import hashlib
    # the receipt is copied beside the reference, where it is committed with it, and the pin names the copy
    assert pin and pin["receipt"] == "receipts/receipt.json"
    assert (tmp_path / "receipts" / "receipt.json").read_bytes() == (tmp_path / "receipt.json").read_bytes()
    assert pin["receipt_sha256"] == hashlib.sha256((tmp_path / "receipt.json").read_bytes()).hexdigest()
    assert pin["facts"]["module hermetic_p2p"] == "sha256:" + "1" * 64
    assert pin["facts"]["runtime torch"] == "2.14.1+cu130" and pin["facts"]["input worker"] == "sha256:" + "2" * 64
    # the module rebuilt and torch upgraded: the digests drift, and the report says what changed
    later = receipt_facts(receipt(module_sha="9" * 64, torch="2.15.0+cu130"))
    drifted = check_digests({"s00/d4/torch": "b" * 64}, tmp_path, "cpu-x", now=later)
    drift = drifted["drift"]
    assert drifted["status"] == "mismatch" and drift["pinned"]
    assert {d["what"] for d in drift["differences"]} == {"module hermetic_p2p", "runtime torch"}
    assert "modules changed (hermetic_p2p); runtime changed (torch); inputs unchanged" in drift["message"]
    assert f"receipt {tmp_path / 'receipts' / 'receipt.json'};" in drift["message"] and drift["receipt_shipped"]
    torch = next(d for d in drift["differences"] if d["what"] == "runtime torch")
    assert (torch["reference"], torch["now"]) == ("2.14.1+cu130", "2.15.0+cu130")
    # a reference without a pin says it cannot tell
    (tmp_path / "cpu-old.txt").write_text("s00/d4/torch " + "a" * 64 + "\n")
    old = check_digests(digests, tmp_path, "cpu-old", now=later)
    assert old["status"] == "match" and not old["drift"]["pinned"] and "re-record" in old["drift"]["message"]


def test_what_decides_no_bit_raises_no_drift_note(tmp_path: Path) -> None:
    """A newcomer's fresh clone: another interpreter path (a venv), another Python, a real AVX2 CPU where the
    reference's run was told ATEN_CPU_CAPABILITY=avx2: the same bits, and no "runtime changed" note."""
    digests = {"s00/d4/torch": "a" * 64}
    recorder = receipt(cpu_capability="AVX2", env={"ATEN_CPU_CAPABILITY": "avx2"})
    (tmp_path / "receipt.json").write_text(json.dumps(recorder))
    record_reference(digests, tmp_path, "cpu-x", runner_name="r", receipt=tmp_path / "receipt.json",
                     receipt_body=recorder)
    newcomer = receipt(cpu_capability="AVX2", python="3.11.9", executable="/home/me/hermetic/.venv/bin/python3",
                       env={"ATEN_CPU_CAPABILITY": None})
    checked = check_digests(digests, tmp_path, "cpu-x", now=receipt_facts(newcomer))
    assert checked["status"] == "match" and checked["drift"]["differences"] == []
    # what does decide the bits still shows: the instruction set torch dispatches to
    wider = check_digests(digests, tmp_path, "cpu-x", now=receipt_facts(receipt(cpu_capability="AVX512")))
    assert [d["what"] for d in wider["drift"]["differences"]] == ["runtime cpu_capability"]
    # an older file's pins of the interpreter's path and of ATEN_CPU_CAPABILITY are read and left out
    old = (tmp_path / "cpu-x.txt").read_text().replace(
        "pin runtime torch ", "pin runtime executable /usr/bin/python3\npin runtime ATEN_CPU_CAPABILITY avx2\n"
                              "pin runtime torch ")
    (tmp_path / "cpu-old.txt").write_text(old)
    assert check_digests(digests, tmp_path, "cpu-old", now=receipt_facts(newcomer))["drift"]["differences"] == []


# recorded on an AMD EPYC machine on 2026-12-03, whose receipts were not kept: re-recorded there, they ship too
RECEIPTS_NOT_KEPT = {"cpu-avx2-amd-torch2.14.1_cu130-t2", "cpu-avx2-amd-torch2.14.1_cu130-t2-inductor-cpp-triton3.8.0",
                     "cpu-avx512-amd-torch2.14.1_cu130-t2",
                     "cpu-avx512-amd-torch2.14.1_cu130-t2-inductor-cpp-triton3.8.0"}


def test_every_reference_pins_a_receipt_that_ships_with_it() -> None:
    """The receipt a drift report names is in the repository, its sha256 is the pin's, and the pinned facts are
    the ones the receipt gives today (so a re-pin by hand could not drift from a re-record)."""
    import hashlib
    folder = REPO / "manifests" / "digests"
    pinned = {}
    for path in sorted(folder.glob("*.txt")):
        _, pin = read_reference(path)
        if pin is None or path.stem in RECEIPTS_NOT_KEPT:
            continue
        shipped = folder / pin["receipt"]
        assert shipped.is_file(), f"{path.name} pins {pin['receipt']}, which is not in the repository"
        assert hashlib.sha256(shipped.read_bytes()).hexdigest() == pin["receipt_sha256"], path.name
        assert pin["facts"] == receipt_facts(json.loads(shipped.read_text())), path.name
        pinned[path.stem] = pin
    assert any(stem.startswith("cpu-") for stem in pinned) and any(stem.startswith("sm") for stem in pinned)
    assert {p.stem for p in folder.glob("*.txt")} >= RECEIPTS_NOT_KEPT
