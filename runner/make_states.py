"""Write the twelve frozen synthetic request states of the reference worker (runner/states/synthetic.json).

Deterministic: the same integer hash as the worker's weights (det_uniform), so rerunning this script rewrites
the same bytes; the test suite checks that it does. A state is what the draft worker gets from the target
model after a verify step: the last accepted token, the target's hidden state for it (float32, stored as
exact bytes), a noise seed for sampled rows and a temperature.

    python3 runner/make_states.py [--hidden 512] [--vocab 8192] [--out runner/states/synthetic.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_worker import DEFAULTS, det_normalish, det_uniform  # noqa: E402

COUNT = 12


def states(hidden: int, vocab: int) -> dict:
    out = []
    for i in range(COUNT):
        h = det_normalish((hidden,), 100 + i, 1.0).contiguous()
        token = int(det_uniform(1, 200 + i)[0].item() * vocab)
        out.append({"name": f"s{i:02d}", "token": token, "seed": 1000 + i,
                    "temperature": (0.6, 0.8, 1.0)[i % 3],
                    "hidden_f32": base64.b64encode(h.numpy().tobytes()).decode()})
    return {"format": 1, "generator": "runner/make_states.py", "hidden": hidden, "vocab": vocab,
            "states": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=DEFAULTS["hidden"])
    ap.add_argument("--vocab", type=int, default=DEFAULTS["vocab"])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "states" / "synthetic.json")
    a = ap.parse_args()
    a.out.write_text(json.dumps(states(a.hidden, a.vocab), indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
