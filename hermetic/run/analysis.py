"""The statistics of one run's raw samples: per-cell summaries, paired comparisons with their decisions, the
A/A control, drift across repetitions and the repetitions a target precision needs. Pure: raw results and
the runner in, a JSON-ready record out (``run.stats`` holds the formulas)."""

from __future__ import annotations

from typing import Any

from hermetic.run import stats
from hermetic.run.spec import Runner


# statistics ------------------------------------------------------------------------------------------------
def analyze(raw: dict[str, Any], runner: Runner, kind: str) -> dict[str, Any]:
    """Per-label summaries, paired comparisons, the A/A control, drift and the repetitions needed."""
    p = runner.protocol
    kernels = runner.device(kind).kernels
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

    pairs: list[tuple[str, str | None, str | None]] = []
    if p.aa_cell:
        pairs.append(("A/A control", aa_label, aa_label + "#aa"))
    pairs += [(c.name, resolve(c.a), resolve(c.b)) for c in runner.compares]
    comparisons: list[dict[str, Any]] = []
    for i, (name, a, b) in enumerate(pairs):
        if a is None or b is None or a not in per_rep or b not in per_rep:
            comparisons.append({"name": name,
                                "skipped": f"needs kernel sets not on this device ({', '.join(kernels)})"})
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
    needed = max((c["repetitions_needed"] for c in comparisons if "repetitions_needed" in c), default=reps)
    flags = {
        "aa_noisy": aa is not None and not aa["contains_1"],
        "drift": sorted(k for k, v in cells.items() if v.get("drift") and v["drift"]["flagged"]),
        "invalid_samples": sum(v["invalid"] for v in cells.values()),
        "power_capped_samples": sum(v["power_capped"] for v in cells.values()),
        "other_process_seen": bool(raw["flags"]["other_process_seen"]),
    }
    return {"cells": cells, "comparisons": comparisons, "aa": aa, "repetitions": reps,
            "repetitions_recommended": min(max(needed, 10), 1000), "target_halfwidth": p.target_halfwidth,
            "flags": flags, "invalid": flags["other_process_seen"]}
