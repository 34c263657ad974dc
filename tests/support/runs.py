"""What the run tests share: a throw-away repository with a small runner, and hermetic for it.

The runner (``SMALL``) measures two cells of the reference draft worker with a small model on the CPU;
``small_repo`` writes it beside the p2p recipe, the reference worker (or a variant of it) and fresh states.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.cli import REPO, Hermetic, hermetic_env

SMALL = """\
[runner]
name = "small"
states = "states.json"
digests = "digests"

[worker]
entry = "{worker}:make_worker"
params = {{ hidden = 64, intermediate = 128, vocab = 256 }}

[kernels]
torch = ""

[cpu]
realize = ["../recipes/p2p.toml"]
kernels = ["torch"]
threads = 1
memory = "{memory}"
address_space = "32G"

[gpu]
realize = ["../recipes/p2p.toml"]
kernels = ["torch"]

[protocol]
repetitions = 3
calls = 3
warmup_calls = 1
warmup_seconds = 0
aa_cell = "greedy-b2"

[checks]
depths = [4]
batches = [1, 2]

[[cells]]
name = "greedy-b2"
graph = "original"
depth = 4
batch = 2

[[cells]]
name = "mixed-b2"
graph = "switch"
depth = 4
batch = 2
mask = "alternate"

[[compare]]
a = "greedy-b2"
b = "mixed-b2"
"""

SLOW_WORKER = """\
import os, time
from draft_worker import DraftWorker, load_states  # noqa: F401


def make_worker(ctx):
    gate = os.environ.get("HERMETIC_TEST_GATE") or "{gate}"
    deadline = time.monotonic() + 300
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return DraftWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""


def small_repo(base: Path, worker_source: str | None = None, *, memory: str = "6G") -> Path:
    """A throw-away repository: the p2p recipe and its lock, the reference worker, a small runner."""
    (base / ".git").mkdir(parents=True)  # its paths must stay inside this repository, not the one it lies in
    shutil.copytree(REPO / "recipes" / "p2p", base / "recipes" / "p2p")
    shutil.copy(REPO / "recipes" / "p2p.toml", base / "recipes" / "p2p.toml")
    (base / "manifests").mkdir()
    shutil.copy(REPO / "manifests" / "cuda-13.0-toolchain.txt", base / "manifests")
    rdir = base / "runner"
    rdir.mkdir()
    shutil.copy(REPO / "runner" / "draft_worker.py", rdir)
    worker = "draft_worker.py"
    if worker_source is not None:
        (rdir / "variant_worker.py").write_text(worker_source)
        worker = "variant_worker.py"
    subprocess.run([sys.executable, str(REPO / "runner" / "make_states.py"), "--hidden", "64", "--vocab", "256",
                    "--out", str(rdir / "states.json")], check=True, capture_output=True)
    (rdir / "runner.toml").write_text(SMALL.format(worker=worker, memory=memory))
    return rdir / "runner.toml"


def run_hermetic(run_root: tuple[Path, Path], tmp: Path) -> Hermetic:
    """hermetic on the run tests' root, with a HOME of its own and the tests' lock folder."""
    root, locks = run_root
    return Hermetic(root, hermetic_env(tmp / "home", extra={"HERMETIC_LOCK_DIR": str(locks)}))
