"""The run's human outputs: a short Markdown report and a PNG plot, both from results.json alone.

What most changes a reader's conclusion comes first: a noisy run says so before anything else. The plot's axes
are robust: they span the central values (and every median and ratio), and what lies beyond is drawn at the
edge, marked and labelled with its value, so one stalled repetition cannot squeeze the medians into a pixel.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.reporter import plural
from hermetic.root import Root
from hermetic.run import stats
from hermetic.run.spec import Runner

CENTRAL = (0.1, 0.9)  # the quantiles an axis is built around
REACH = 1.0           # and how far past them it reaches, in multiples of their spread


def write_report(path: Path, results: dict[str, Any], runner: Runner, plot: Path | None) -> Path:
    a = results["analysis"]
    env = results["environment"]
    chk = results["checks"]
    unit = "GPU time per call (CUDA events)" if results["device"] == "gpu" else "time per call (monotonic clock)"
    lines = [f"# hermetic run: {runner.name} on the {results['device']}", ""]
    if a.get("noisy"):
        lines += [f"**Noisy run: no comparison is decided.** {a['noisy'][0].upper()}{a['noisy'][1:]}; every "
                  f"comparison below says `unclear: noisy run` (what its interval alone would say is kept in "
                  f"results.json as `interval_decision`). Rerun on a quieter machine. Repetitions: "
                  f"{a['repetitions_advice']['message']}.", ""]
    lines += [f"Device class `{results['device_class']}`; torch {env['torch']} (CUDA {env['torch_cuda']}), "
              f"Python {env['python']}, {env['threads']} threads, CPUs {_ranges(env['affinity'])}"
              + (f"; {env['gpu_name']} (sm {env['capability']})" if env.get("gpu_name") else "") + ".",
              f"{a['repetitions']} repetitions, cells interleaved and reversed every repetition; {unit}; "
              "the first call of every block discarded.", "",
              "## Checks", "",
              f"* exactness: {chk['exactness']['comparisons']} comparisons of the switch-enabled graph against "
              f"the original, {chk['exactness']['mismatches']} mismatches -> "
              f"**{'pass' if chk['exactness']['passed'] else 'FAIL'}**",
              f"* digests ({chk['digests']['class']}): **{chk['digests']['status']}** "
              f"({chk['digests'].get('compared', 0)} compared, {chk['digests']['mismatches']} drifted)"]
    classes = chk["digests"].get("classes") or {}
    if len(classes) > 1:  # a compiled or Triton set's digests are their own class
        lines += [f"  * `{c}`: {v['status']} ({v['compared']} compared, {v['mismatches']} drifted)"
                  for c, v in classes.items()]
    lines += [f"  {line}" for line in digest_notes(results)]
    lines += compile_lines(chk.get("compile"))
    lines += pair_lines(results)
    lines.append("")
    mism = results["exactness_mismatches"]
    if mism:
        lines += ["| check | kernels | depth | batch | state | mask | row | positions |",
                  "|---|---|---:|---:|---:|---|---:|---:|"]
        lines += [f"| {m['check']} | {m['kernels']} | {m['depth']} | {m['batch']} | {m['state']} | {m['mask']} | "
                  f"{m['row']} | {m['positions']} |" for m in mism[:50]]
        lines.append("")
    if results["digest_mismatches"]:
        lines += ["| digest key | expected | found |", "|---|---|---|"]
        lines += [f"| {m['key']} | {m['expected'][:16]} | {m['found'][:16]} |" for m in results["digest_mismatches"]]
        lines.append("")
    lines += ["## Cells", "", "| cell | median us | IQR % | p10 | p90 | n | invalid | power-capped | drift rho (p) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for label, c in a["cells"].items():
        if not c["n"]:
            lines.append(f"| {label} | - | - | - | - | 0 | {c['invalid']} | {c['power_capped']} | - |")
            continue
        d = c.get("drift") or {}
        drift = f"{d.get('rho', 0):+.2f} ({d.get('p', 1):.2f}){' **flagged**' if d.get('flagged') else ''}"
        lines.append(f"| {label} | {c['median']:.1f} | {100 * c['rel_iqr']:.2f} | {c['p10']:.1f} | {c['p90']:.1f} | "
                     f"{c['n']} | {c['invalid']} | {c['power_capped']} | {drift} |")
    lines += ["", "## Comparisons (ratio = b / a, paired by repetition)", "",
              "| comparison | a | b | ratio | sign-test CI (conf.) | bootstrap CI | decision | reps for target |",
              "|---|---|---|---:|---|---|---|---:|"]
    for c in a["comparisons"]:
        if "not_measured" in c:  # said once, below the table
            continue
        if "skipped" in c:
            lines.append(f"| {c['name']} | {c.get('a', '')} | {c.get('b', '')} | - | - | - | skipped: "
                         f"{c['skipped']} | - |")
            continue
        lines.append(f"| {c['name']} | {c['a']} | {c['b']} | {c['ratio']:.4f} | [{c['sign_ci'][0]:.4f}, "
                     f"{c['sign_ci'][1]:.4f}] ({100 * c['sign_confidence']:.1f} %) | [{c['bootstrap_ci'][0]:.4f}, "
                     f"{c['bootstrap_ci'][1]:.4f}] | {c['decision']} | {c['repetitions_needed']:,} |")
    unmeasured = not_measured_line(results)
    if unmeasured:
        lines += ["", unmeasured]
    f = results["flags"]
    lines += ["", "## Flags", "", "* A/A control: " + _aa_line(a),
              f"* drift across repetitions: {', '.join(f['drift']) if f.get('drift') else 'none flagged'}",
              f"* invalid samples (thermal / hardware slowdown): {f.get('invalid_samples', 0)}; power-capped: "
              f"{f.get('power_capped_samples', 0)}",
              f"* other compute process seen: {'**yes: run invalid**' if f.get('other_process_seen') else 'no'}",
              f"* repetitions: {a['repetitions_advice']['message']}", ""]
    p2p = results.get("p2p")
    if p2p and "skipped" not in p2p and p2p.get("transport") == "cpu":
        lines += ["", f"## The pair's exchange on the CPU ({p2p['bytes'] >> 20} MiB, median of "
                      f"{p2p['repetitions']})", "",
                  f"{p2p['note']}; the copy through the extension is "
                  f"{'exact' if p2p['peer_copy_exact'] else '**NOT exact**'}.", "",
                  "| copy | GB/s | median s |", "|---|---:|---:|",
                  f"| hermetic_p2p.cpu_copy | {p2p['extension_peer_copy']['gb_per_s']:.1f} | "
                  f"{p2p['extension_peer_copy']['median_s']:.6f} |",
                  f"| torch copy_ | {p2p['copy_engine']['gb_per_s']:.1f} | {p2p['copy_engine']['median_s']:.6f} |",
                  ""]
    elif p2p and "skipped" not in p2p:
        lines += ["", f"## P2P between two GPUs ({p2p['bytes'] >> 20} MiB, median of {p2p['repetitions']})", "",
                  f"{p2p['note']}; the copy through the extension is "
                  f"{'exact' if p2p['peer_copy_exact'] else '**NOT exact**'}.", "",
                  "| copy | GB/s | median s |", "|---|---:|---:|"]
        for key, name in (("extension_peer_copy", "peer copy (hermetic_p2p.peer_copy)"),
                          ("copy_engine", "copy engine (torch copy_ across devices)"),
                          ("extension_local_copy", "device-local copy (our kernel)"),
                          ("copy_engine_local", "device-local copy engine (torch copy_)")):
            lines.append(f"| {name} | {p2p[key]['gb_per_s']:.1f} | {p2p[key]['median_s']:.6f} |")
        lines.append("")
    if plot:
        lines += ["", f"![per-repetition medians and ratios]({plot.name})", ""]
    fs.atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path


def pair_lines(results: dict[str, Any]) -> list[str]:
    """A pair run's checks: where each rank ran, the link and how the exchange crossed it, the copy's
    exactness, the pair's outputs against the solo run's; the pair's A/A control."""
    pair, chk = results.get("pair"), results["checks"].get("pair")
    if not pair or not chk:
        return []
    link = pair.get("link") or {}
    if link.get("kind") == "nvlink":
        said = f"NVLink ({link.get('links')} links, version {link.get('nvlink_version')})"
    elif link.get("kind") == "pcie":
        said = f"PCIe ({link.get('topology') or 'path unknown'})"
    else:
        said = "cpu (both ranks on the CPU)"
    eq = chk["equal_to_solo"]
    exact = chk["peer_copy_exact"]
    copy = "bit-exact" if exact else "**NOT exact**" if exact is False else "not checked"
    out = [f"* pair: rank 0 on card {pair['cards'][0]}, rank 1 on card {pair['cards'][1]} "
           f"({', '.join(pair['devices'])}); link {said}; the exchange: {chk['transport']}; the copy {copy}"
           f"; the pair's batch-1 outputs against the solo run's: {eq['compared']} compared, "
           f"{len(eq['mismatches'])} differ" + ("" if eq["required"] else " (cards of two classes: not required)")
           + f" -> **{'pass' if chk['passed'] else 'FAIL'}**"]
    pa = results["analysis"].get("pair_aa")
    if pa:
        lo, hi = pa["sign_ci"]
        out.append(f"* the pair's A/A control: [{lo:.4f}, {hi:.4f}], {100 * (hi - lo):.2f} % wide")
    return out


def not_measured_line(results: dict[str, Any]) -> str:
    """One line for the comparisons that need kernel sets this device never measures (a CPU has no stock,
    facc or Triton kernels): named together, not as a row each."""
    skipped = [c for c in results["analysis"]["comparisons"] if "not_measured" in c]
    if not skipped:
        return ""
    sets = ", ".join(dict.fromkeys(k for c in skipped for k in c["not_measured"]))
    measured = ", ".join(results.get("kernels") or [])
    return (f"Not compared on the {results['device']}, which does not measure kernel sets {sets}"
            + (f" (it measures {measured})" if measured else "") + ": "
            + ", ".join(c["name"] for c in skipped) + ".")


def _ranges(cpus: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


def _aa_line(a: dict[str, Any]) -> str:
    aa = a.get("aa")
    if aa is None:
        return "none measured: nothing checks this run's intervals against its noise"
    lo, hi = aa["sign_ci"]
    rule = (f"it must contain 1 and be at most {a['aa_max_width']:g} x the threshold wide "
            f"({100 * a['aa_max_width'] * a['threshold']:.2f} %)")
    if a.get("noisy"):
        return f"**failed**: {a['noisy']}; {rule}"
    return f"holds: interval [{lo:.4f}, {hi:.4f}], width {100 * (hi - lo):.2f} % ({rule})"


def compile_lines(comp: dict[str, Any] | None) -> list[str]:
    """The compile check: what each compiled set really ran, and whether the timed calls compiled anything."""
    if not comp:
        return []
    lines = []
    classes = ""
    for k, v in comp["sets"].items():
        lines.append(f"* compiled set `{k}`: **{'pass' if v['compiled'] else 'FAIL'}**, {v['status']}: "
                     f"{v['reason']} ({plural(v['graphs'], 'graphs')} for {plural(v['calls'], 'calls')}, "
                     f"{v['compile_s']:.1f} s in the backend)")
    for k, why in comp.get("skipped", {}).items():
        lines.append(f"* kernel set `{k}`: skipped ({why})")
    timed = ("nothing compiled and nothing written into the kernel caches" if comp["timed_clean"]
             else f"**compiled inside the timed calls** ({comp['timed_events']}): FAIL")
    if comp["sets"]:
        classes = (f"; {plural(comp['inductor_cache_misses'], 'graphs')} compiled, "
                   f"{comp['inductor_cache_hits']} loaded from the kernel cache, "
                   f"{plural(comp['cache_files_written'], 'cache files')} written; "
                   f"{comp['warmup_seconds']:.1f} s from the start to the first timed call")
    lines.append(f"* timed phase: {timed}{classes}")
    return lines


def digest_notes(results: dict[str, Any]) -> list[str]:
    """What the digest check's status means, and, against a pinned reference, what changed since it."""
    dig = results["checks"]["digests"]
    notes = []
    if dig["status"] == "unknown-class":
        notes.append(f"{dig['message']}.")
    elif dig["status"] == "recorded":
        was = {"match": "the reference it replaces matched", "mismatch": "the reference it replaces **did not**",
               "incomplete": "the reference it replaces lacked some keys"}.get(dig.get("previous", ""),
                                                                                 "there was no reference before")
        notes.append(f"recorded as the reference of this class, pinned to this run's receipt ({was}).")
    drift = dig.get("drift")
    if drift and dig["status"] != "recorded" and (dig["status"] == "mismatch" or drift["differences"]
                                                  or not drift["pinned"]):
        notes.append(f"{drift['message'][0].upper()}{drift['message'][1:]}.")
        notes += [f"* {d['what']}: reference `{d['reference']}`, now `{d['now']}`" for d in drift["differences"]]
    return notes


# the plot --------------------------------------------------------------------------------------------------
def axis_range(values: Iterable[float], *, keep: Sequence[float] = (), central: tuple[float, float] = CENTRAL,
               reach: float = REACH) -> tuple[float, float]:
    """An axis one wild value cannot stretch: the central quantiles of ``values`` widened by ``reach`` times
    their spread, always holding every value of ``keep`` (medians, point ratios, 1), and never wider than the
    values themselves need (a quiet run's axis is just its data's)."""
    finite = [v for v in values if math.isfinite(v)]
    kept = [v for v in keep if math.isfinite(v)]
    if not finite and not kept:
        return 0.0, 1.0
    base = finite or kept
    lo = min([stats.quantile(base, central[0]), *kept])
    hi = max([stats.quantile(base, central[1]), *kept])
    reach_by = reach * (hi - lo or abs(hi) * 0.01 or 1.0)
    inside = [v for v in finite if lo - reach_by <= v <= hi + reach_by] + kept
    lo, hi = min(inside), max(inside)
    margin = 0.05 * (hi - lo or abs(hi) * 0.01 or 1.0)
    return lo - margin, hi + margin


def _clipped(ax: Any, xs: Sequence[float], y: float, lo: float, hi: float, **style: Any) -> None:
    """Points inside the axis as they are; those beyond it at its edge, as red arrows labelled with their
    value (outliers marked, never dropped)."""
    inside = [x for x in xs if lo <= x <= hi]
    if inside:
        ax.scatter(inside, [y] * len(inside), **style)
    for x in xs:
        if math.isfinite(x) and not lo <= x <= hi:
            edge, marker, align = (hi, ">", "right") if x > hi else (lo, "<", "left")
            ax.scatter([edge], [y], marker=marker, color="red", s=30, zorder=4)
            value = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.4g}"
            ax.annotate(value, (edge, y), xytext=(0, 6), textcoords="offset points", fontsize=7, color="red",
                        ha=align)


def plot_figure(results: dict[str, Any]) -> Any:
    """Per-repetition medians of every cell (left) and the comparisons' ratios with intervals (right), on
    robust axes (``axis_range``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    a = results["analysis"]
    labels = [k for k, v in a["cells"].items() if v["n"]]
    comps = [c for c in a["comparisons"] if "skipped" not in c]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(3.0, 0.45 * max(len(labels), len(comps)) + 1.5)))
    meds = {label: a["cells"][label]["per_rep_median"] for label in labels}
    lo, hi = axis_range([m for v in meds.values() for m in v], keep=[a["cells"][k]["median"] for k in labels])
    for i, label in enumerate(labels):
        _clipped(left, meds[label], i, lo, hi, s=14, alpha=0.7)
        left.plot([a["cells"][label]["median"]] * 2, [i - 0.3, i + 0.3], color="black")
    left.set_xlim(lo, hi)
    _plain_ticks(left)
    left.set_yticks(range(len(labels)), labels, fontsize=8)
    left.set_xlabel("per-repetition median, us (values beyond the axis: red arrows, labelled)")
    left.set_title("cells")
    thr = a.get("threshold", comps[0]["threshold"] if comps else 0.005)
    ends = [x for c in comps for x in (*c["sign_ci"], *c["bootstrap_ci"], *c["ratios"])]
    rlo, rhi = axis_range(ends, keep=[1 - thr, 1 + thr, *(c["ratio"] for c in comps)])
    for i, c in enumerate(comps):
        for (clo, chi), dy, style in ((c["sign_ci"], 0.0, {"color": "tab:blue", "linewidth": 3}),
                                      (c["bootstrap_ci"], 0.15, {"color": "tab:orange", "linewidth": 1.5})):
            right.plot([max(clo, rlo), min(chi, rhi)], [i + dy, i + dy], **style)
        _clipped(right, c["ratios"], i - 0.15, rlo, rhi, s=10, color="gray")
        right.scatter([c["ratio"]], [i], color="black", zorder=3)
    right.set_xlim(rlo, rhi)
    _plain_ticks(right)
    right.axvline(1.0, color="black", linewidth=0.8)
    right.axvspan(1 - thr, 1 + thr, color="green", alpha=0.1)
    right.set_yticks(range(len(comps)), [c["name"] for c in comps], fontsize=8)
    right.set_xlabel("ratio b/a: sign-test CI (blue), bootstrap (orange), per rep. (gray)")
    right.set_title("paired comparisons" + (" (noisy run: none decided)" if a.get("noisy") else ""))
    fig.suptitle(f"{results['runner']} on {results['device_class']}")
    fig.tight_layout()
    return fig


def _plain_ticks(ax: Any) -> None:
    """Tick labels that say the values themselves: no offset or "1e6" drawn at the axis' end, where it lands on
    the x label (a narrow ratio axis around 1, or microseconds past a million)."""
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)


def write_plot(path: Path, results: dict[str, Any], root: Root) -> Path | None:
    os.environ.setdefault("MPLCONFIGDIR", str(root.home / ".cache" / "matplotlib"))  # its cache stays inside
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = plot_figure(results)
    with fs.atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
