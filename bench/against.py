"""``--against REV`` for the timing benches: the package as commit REV had it, run side by side with this
checkout in the same rounds, so that a change is judged against its parent on one machine at one time.

Both sides run as ``python -m hermetic`` with PYTHONPATH naming their own copy of the package (which wins
over an editable install); each keeps its own scratch root.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hermetic.run.stats import paired_ratios, sign_test_ci  # noqa: E402

WITHIN = 0.05  # the layout issue's bound: medians within 5 % of the parent's


def checkout(rev: str, folder: Path) -> tuple[Path, str]:
    """The package of ``rev`` unpacked under ``folder``; (the folder to put on PYTHONPATH, the full hash)."""
    full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if full.returncode != 0:
        raise SystemExit(f"--against {rev}: not a commit of this repository ({full.stderr.strip()})")
    sha = full.stdout.strip()
    code = folder / f"hermetic-{sha[:12]}"
    if not (code / "hermetic").is_dir():
        code.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha, "hermetic"], capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", str(code)], input=archive.stdout, check=True)
    return code, sha


def with_code(env: dict[str, str], code: Path) -> dict[str, str]:
    """``env`` with ``code``'s package first on the import path (and nothing else's)."""
    return {**env, "PYTHONPATH": str(code)}


def verdict(name: str, this: list[float], base: list[float], rev: str) -> str:
    """A Markdown line: medians, their ratio, the sign-test interval of the per-round ratios, PASS or MISS."""
    m_this, m_base = statistics.median(this), statistics.median(base)
    ratio = m_this / m_base
    lo, hi, conf = sign_test_ci(paired_ratios(base, this))
    ok = ratio <= 1 + WITHIN
    return (f"{'PASS' if ok else 'MISS'}: {name}: this checkout {m_this:.3f} s, {rev[:12]} {m_base:.3f} s, median "
            f"ratio {ratio:.3f} (per-round ratios {lo:.3f}-{hi:.3f} at {100 * conf:.0f} %); target <= "
            f"{1 + WITHIN:.2f}")

