"""The statistics of one run's raw samples: per-cell summaries, paired comparisons with their decisions, the
A/A control, drift across repetitions and the repetitions a target precision needs. Pure: raw results and
the runner in, a JSON-ready record out (``run.stats`` holds the formulas).

Two rules keep the report honest in a noisy run: when the A/A control fails, no comparison is decided (each
says ``unclear: noisy run`` and why); and the repetitions a target precision needs are reported as computed,
with the most ``--repetitions`` accepts stated beside them, never in their place.
"""

from __future__ import annotations

from typing import Any

from hermetic.run import stats
from hermetic.run.spec import REPETITIONS_MAX, Runner

NOISY = "unclear: noisy run"
PAIR_AA = "A/A control (pair)"
PAIR_VS_SOLO = "pair vs solo: "  # + the cell's name: rank 1 on its own card against both ranks on one
RECOMMEND_AT_LEAST = 10  # the sign test's interval reaches 97.9 % with 10 repetitions, 93.75 % with 5


# the two rules ---------------------------------------------------------------------------------------------
def noisy_run(aa: dict[str, Any] | None, *, threshold: float, max_width: float) -> str | None:
    """Why the run is too noisy to decide anything, or None while its A/A control holds.

    The A/A control measures one cell under two labels, so its true ratio is exactly 1. Its interval must
    contain 1 and be at most ``max_width`` thresholds wide: an interval that excludes 1 says the run's
    intervals are too narrow for its noise, and one much wider than the threshold says this run cannot
    resolve an effect of the threshold's size; either way a decision taken from it would be luck.
    """
    if aa is None:
        return None
    lo, hi = aa["sign_ci"]
    where = f"the A/A control's interval [{lo:.4f}, {hi:.4f}]"
    if not lo <= 1 <= hi:
        return f"{where} excludes 1 (one cell measured twice, under two labels, disagrees with itself)"
    if hi - lo > max_width * threshold:
        return (f"{where} is {100 * (hi - lo):.2f} % wide, more than {max_width:g} x the threshold of "
                f"{100 * threshold:.2f} % ({100 * max_width * threshold:.2f} %)")
    return None


def repetitions_advice(needed: int, *, run: int, halfwidth: float, confidence: float, by: str | None = None,
                       cap: int = REPETITIONS_MAX, at_least: int = RECOMMEND_AT_LEAST) -> dict[str, Any]:
    """The repetitions a target precision needs, as computed; what to run, and the cap, said separately."""
    recommended = min(max(needed, at_least), cap)
    target = f"+-{100 * halfwidth:.2f} % at {100 * confidence:g} % confidence"
    msg = f"{run} run; {needed:,} needed for {target}" + (f" (by {by})" if by else "")
    if needed > cap:
        msg += (f". That is more than --repetitions accepts ({cap:,}): at this noise the target is out of reach "
                f"by repeating; quiet the machine (or widen target_halfwidth) first")
    elif needed > run or run < at_least:
        msg += f"; run --repetitions {recommended}" + (f" (at least {at_least})" if needed < at_least else "")
    else:
        msg += "; enough"
    return {"needed": needed, "recommended": recommended, "cap": cap, "capped": needed > cap, "by": by,
            "message": msg}


# statistics ------------------------------------------------------------------------------------------------
def analyze(raw: dict[str, Any], runner: Runner, kind: str) -> dict[str, Any]:
    """Per-label summaries, paired comparisons, the A/A control, drift and the repetitions needed."""
    p = runner.protocol
    kernels = tuple(raw.get("kernels") or runner.device(kind).kernels)  # the sets measured (some may be skipped)
    labels: list[str] = list(dict.fromkeys(s["label"] for s in raw["samples"]))
    reps = p.repetitions
    use = [s for s in raw["samples"] if not s["discarded"]]
    per_rep: dict[str, list[float]] = {}
    cells: dict[str, Any] = {}
    for label in labels:
        mine = [s for s in use if s["label"] == label]
        valid = [s["time_us"] for s in mine if s["valid"]]
        meds = []
        for r in range(reps):
            vals = [s["time_us"] for s in mine if s["rep"] == r and s["valid"]]
            meds.append(stats.median(vals) if vals else float("nan"))
        per_rep[label] = meds
        summ: dict[str, Any] = stats.summary(valid) if valid else {"n": 0}
        summ.update({"invalid": sum(1 for s in mine if not s["valid"]),
                     "power_capped": sum(1 for s in mine if s["power_capped"]),
                     "host_median_us": stats.median([s["host_us"] for s in mine]) if mine else None,
                     "per_rep_median": meds,
                     "drift": stats.drift(meds, threshold=p.threshold) if all(m == m for m in meds) else None})
        cells[label] = summ

    def resolve(label: str) -> str | None:
        cell, _, k = label.partition("/")
        k = k or kernels[0]
        return f"{cell}/{k}" if k in kernels else None

    aa_label = f"{p.aa_cell}/{kernels[0]}"

    def absent(*labels: str) -> list[str]:
        """The kernel sets a comparison needs that this run did not measure."""
        return [k for k in dict.fromkeys(lb.partition("/")[2] or kernels[0] for lb in labels) if k not in kernels]

    def missing(*labels: str) -> str:
        """The kernel sets a comparison needs that this run did not measure, and those it did."""
        sets = absent(*labels)
        if not sets:
            return "its cells were not measured in this run"
        return (f"needs kernel set{'s' if len(sets) != 1 else ''} {', '.join(sets)}, not measured on this "
                f"device (it measures {', '.join(kernels)})")

    pairs: list[tuple[str, str | None, str | None, str, list[str]]] = []
    if p.aa_cell:
        pairs.append(("A/A control", aa_label, aa_label + "#aa", missing(aa_label), absent(aa_label)))
    pairs += [(c.name, resolve(c.a), resolve(c.b), missing(c.a, c.b), absent(c.a, c.b)) for c in runner.compares]
    paired = bool(raw.get("pair"))
    if paired:  # a pair run: its own A/A control, and each cell on the pair against the same cell solo
        if p.aa_cell:
            pairs.append((PAIR_AA, aa_label + "@pair", aa_label + "@pair#aa", missing(aa_label), absent(aa_label)))
        for cell in runner.cells:
            solo = f"{cell.name}/{kernels[0]}"
            pairs.append((f"{PAIR_VS_SOLO}{cell.name}", solo, solo + "@pair", missing(solo), absent(solo)))
    comparisons: list[dict[str, Any]] = []
    for i, (name, a, b, why, sets) in enumerate(pairs):
        if a is None or b is None or a not in per_rep or b not in per_rep:
            # not_measured: the kernel sets this device never measures (reported once, not as a row each)
            comparisons.append({"name": name, "skipped": why, **({"not_measured": sets} if sets else {})})
            continue
        ra, rb = per_rep[a], per_rep[b]
        ok = [j for j in range(reps) if ra[j] == ra[j] and rb[j] == rb[j]]
        if len(ok) < 2:
            comparisons.append({"name": name, "a": a, "b": b, "skipped": "fewer than 2 valid repetitions"})
            continue
        c = stats.compare([ra[j] for j in ok], [rb[j] for j in ok], threshold=p.threshold,
                          confidence=p.confidence, seed=i)
        c.update(name=name, a=a, b=b,
                 repetitions_needed=stats.repetitions_needed(c["ratios"], halfwidth=p.target_halfwidth,
                                                             confidence=p.confidence))
        comparisons.append(c)
    aa = comparisons[0] if p.aa_cell and "skipped" not in comparisons[0] else None
    noisy = noisy_run(aa, threshold=p.threshold, max_width=p.aa_max_width)
    pair_aa = next((c for c in comparisons if c["name"] == PAIR_AA and "skipped" not in c), None)
    if noisy is None and pair_aa is not None:  # a pair run is decided only while both its controls hold
        pair_noisy = noisy_run(pair_aa, threshold=p.threshold, max_width=p.aa_max_width)
        noisy = f"on the pair, {pair_noisy}" if pair_noisy else None
    if noisy:
        for c in comparisons:
            if "decision" in c:  # what the interval alone would say stays in the results, not in the decision
                c.update(interval_decision=c["decision"], decision=NOISY, decision_reason=noisy)
    measured = [c for c in comparisons if "repetitions_needed" in c]
    worst = max(measured, key=lambda c: c["repetitions_needed"], default=None)
    advice = repetitions_advice(worst["repetitions_needed"] if worst else reps, run=reps,
                                halfwidth=p.target_halfwidth, confidence=p.confidence,
                                by=worst["name"] if worst else None)
    flags = {
        "aa_noisy": noisy is not None,
        "drift": sorted(k for k, v in cells.items() if v.get("drift") and v["drift"]["flagged"]),
        "invalid_samples": sum(v["invalid"] for v in cells.values()),
        "power_capped_samples": sum(v["power_capped"] for v in cells.values()),
        "other_process_seen": bool(raw["flags"]["other_process_seen"]),
    }
    return {"cells": cells, "comparisons": comparisons, "aa": aa, "pair_aa": pair_aa, "noisy": noisy,
            "repetitions": reps,
            "repetitions_needed": advice["needed"], "repetitions_recommended": advice["recommended"],
            "repetitions_advice": advice, "target_halfwidth": p.target_halfwidth,
            "aa_max_width": p.aa_max_width, "threshold": p.threshold,
            "flags": flags, "invalid": flags["other_process_seen"]}
