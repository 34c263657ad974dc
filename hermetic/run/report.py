"""The run's human outputs: a short Markdown report and a PNG plot, both from results.json alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermetic import fs
from hermetic.root import Root
from hermetic.run.spec import Runner


def write_report(path: Path, results: dict[str, Any], runner: Runner, plot: Path | None) -> Path:
    a = results["analysis"]
    env = results["environment"]
    chk = results["checks"]
    unit = "GPU time per call (CUDA events)" if results["device"] == "gpu" else "time per call (monotonic clock)"
    lines = [f"# hermetic run: {runner.name} on the {results['device']}", "",
             f"Device class `{results['device_class']}`; torch {env['torch']} (CUDA {env['torch_cuda']}), "
             f"Python {env['python']}, {env['threads']} threads, CPUs {_ranges(env['affinity'])}"
             + (f"; {env['gpu_name']} (sm {env['capability']})" if env.get("gpu_name") else "") + ".",
             f"{a['repetitions']} repetitions, cells interleaved and reversed every repetition; {unit}; "
             "the first call of every block discarded.", "",
             "## Checks", "",
             f"* exactness: {chk['exactness']['comparisons']} comparisons of the switch-enabled graph against "
             f"the original, {chk['exactness']['mismatches']} mismatches -> "
             f"**{'pass' if chk['exactness']['passed'] else 'FAIL'}**",
             f"* digests ({chk['digests']['class']}): **{chk['digests']['status']}** "
             f"({chk['digests'].get('compared', 0)} compared, {chk['digests']['mismatches']} drifted)", ""]
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
        if "skipped" in c:
            lines.append(f"| {c['name']} | {c.get('a', '')} | {c.get('b', '')} | - | - | - | skipped: "
                         f"{c['skipped']} | - |")
            continue
        lines.append(f"| {c['name']} | {c['a']} | {c['b']} | {c['ratio']:.4f} | [{c['sign_ci'][0]:.4f}, "
                     f"{c['sign_ci'][1]:.4f}] ({100 * c['sign_confidence']:.1f} %) | [{c['bootstrap_ci'][0]:.4f}, "
                     f"{c['bootstrap_ci'][1]:.4f}] | {c['decision']} | {c['repetitions_needed']} |")
    f = results["flags"]
    lines += ["", "## Flags", "",
              f"* A/A control: {'**noisy** (interval excludes 1)' if f.get('aa_noisy') else 'interval contains 1'}"
              + (f", width {100 * a['aa']['width']:.2f} %" if a.get("aa") else ""),
              f"* drift across repetitions: {', '.join(f['drift']) if f.get('drift') else 'none flagged'}",
              f"* invalid samples (thermal / hardware slowdown): {f.get('invalid_samples', 0)}; power-capped: "
              f"{f.get('power_capped_samples', 0)}",
              f"* other compute process seen: {'**yes: run invalid**' if f.get('other_process_seen') else 'no'}",
              f"* repetitions: {a['repetitions']} run; {a['repetitions_recommended']} recommended for "
              f"+-{100 * a['target_halfwidth']:.2f} % (at least 10)", ""]
    p2p = results.get("p2p")
    if p2p and "skipped" not in p2p:
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
    if f.get("unknown_digest_class"):
        lines.append(f"* no reference digests for `{results['device_class']}`: `--record-digests` records them")
    if plot:
        lines += ["", f"![per-repetition medians and ratios]({plot.name})", ""]
    fs.atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path


def _ranges(cpus: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


def write_plot(path: Path, results: dict[str, Any], root: Root) -> Path | None:
    """Per-repetition medians of every cell (left) and the comparisons' ratios with intervals (right)."""
    os.environ.setdefault("MPLCONFIGDIR", str(root.home / ".cache" / "matplotlib"))  # its cache stays inside
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    a = results["analysis"]
    labels = [k for k, v in a["cells"].items() if v["n"]]
    comps = [c for c in a["comparisons"] if "skipped" not in c]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, max(3.0, 0.45 * max(len(labels), len(comps)) + 1.5)))
    for i, label in enumerate(labels):
        meds = a["cells"][label]["per_rep_median"]
        left.scatter(meds, [i] * len(meds), s=14, alpha=0.7)
        left.plot([a["cells"][label]["median"]] * 2, [i - 0.3, i + 0.3], color="black")
    left.set_yticks(range(len(labels)), labels, fontsize=8)
    left.set_xlabel("per-repetition median, us")
    left.set_title("cells")
    for i, c in enumerate(comps):
        lo, hi = c["sign_ci"]
        right.plot([lo, hi], [i, i], color="tab:blue", linewidth=3)
        blo, bhi = c["bootstrap_ci"]
        right.plot([blo, bhi], [i + 0.15, i + 0.15], color="tab:orange", linewidth=1.5)
        right.scatter(c["ratios"], [i - 0.15] * len(c["ratios"]), s=10, color="gray")
        right.scatter([c["ratio"]], [i], color="black", zorder=3)
    right.axvline(1.0, color="black", linewidth=0.8)
    thr = comps[0]["threshold"] if comps else 0.005
    right.axvspan(1 - thr, 1 + thr, color="green", alpha=0.1)
    right.set_yticks(range(len(comps)), [c["name"] for c in comps], fontsize=8)
    right.set_xlabel("ratio b/a: sign-test CI (blue), bootstrap (orange), per rep. (gray)")
    right.set_title("paired comparisons")
    fig.suptitle(f"{results['runner']} on {results['device_class']}")
    fig.tight_layout()
    with fs.atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
