"""Compiled kernel sets in `hermetic run`: torch.compile through a counting backend, the compile check (every
call one compiled graph, nothing compiled inside the timed calls), the kernel caches in the root keyed by
torch and triton, and the compiled digests' own device class.

The whole-run tests measure the small runner of tests/support/runs.py with its MLP compiled by Inductor (C++
on this CPU) on the run tests' shared root, so the kernel cache they share is warm after the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermetic.errors import BadInput
from hermetic.run.compiling import cache_key, verdict
from hermetic.run.digests import combine, kernel_class, split_by_class
from hermetic.run.spec import load_runner
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.runs import run_hermetic, small_repo

COMPILED_SET = ('[kernels]\ntorch = ""\n', '[kernels]\ntorch = ""\ncompiled = { compile = "inductor" }\n')
COMPILED_ON_CPU = ('[cpu]\nrealize = ["../recipes/p2p.toml"]\nkernels = ["torch"]',
                   '[cpu]\nrealize = ["../recipes/p2p.toml"]\nkernels = ["compiled"]')

# Compiles a function it never compiled before on the first call inside a timed block (the measuring process
# turns garbage collection off in every timed block, and nowhere else).
LATE_COMPILE_WORKER = """\
import gc
import torch
from draft_worker import Call, DraftWorker, load_states  # noqa: F401

LATE = []


class LateCall(Call):
    def __call__(self):
        if not gc.isenabled() and not LATE:
            LATE.append(self.w.kernels[self.kernels].compile(lambda x: x * 3 + 1)(torch.ones(5)))
        super().__call__()


class LateWorker(DraftWorker):
    call_class = LateCall


def make_worker(ctx):
    return LateWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""

# torch.compile disabled from inside: every compiled function silently runs eagerly.
EAGER_WORKER = """\
import torch
import torch._dynamo
from draft_worker import DraftWorker, load_states  # noqa: F401


def make_worker(ctx):
    torch._dynamo.config.disable = True
    return DraftWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""


def compiled_repo(base: Path, worker_source: str | None = None) -> Path:
    runner = small_repo(base, worker_source)
    text = runner.read_text()
    for old, new in (COMPILED_SET, COMPILED_ON_CPU):
        assert old in text
        text = text.replace(old, new)
    runner.write_text(text)
    return runner


@pytest.fixture(scope="module")
def run_root(shared_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    locks = tmp_path_factory.mktemp("locks")
    h = Hermetic(shared_root, hermetic_env(tmp_path_factory.mktemp("home")))
    h("realize", REPO / "recipes" / "p2p.toml", check=True)
    return shared_root, locks


def receipt_of(r: object) -> dict:
    return json.loads(Path(r.result["receipt"]).read_text())  # type: ignore[attr-defined]


# pure parts ------------------------------------------------------------------------------------------------
def test_the_verdict_reads_one_compiled_graph_per_call() -> None:
    assert verdict(10, 10, {})["status"] == "compiled"
    assert verdict(10, 20, {})["status"] == "graph-break"
    brk = verdict(10, 20, {"Tensor.item": 2})
    assert brk["status"] == "graph-break" and "Tensor.item (x2)" in brk["reason"] and not brk["compiled"]
    eager = verdict(10, 0, {})
    assert eager["status"] == "eager-fallback" and not eager["compiled"] and "10 of 10 calls" in eager["reason"]
    assert verdict(10, 7, {})["status"] == "eager-fallback"
    assert verdict(0, 0, {})["status"] == "not-called"


def test_the_cache_key_changes_with_torch_cuda_triton_python_and_isa() -> None:
    base = cache_key("2.14.1+cu130", "13.0", "3.8.0", "3.11", "AVX512")
    assert base == "torch2.14.1_cu130-cuda13.0-triton3.8.0-py3.11-avx512"
    others = {cache_key("2.14.2+cu130", "13.0", "3.8.0", "3.11", "AVX512"),
              cache_key("2.14.1+cu130", "12.8", "3.8.0", "3.11", "AVX512"),
              cache_key("2.14.1+cu130", "13.0", "3.8.1", "3.11", "AVX512"),
              cache_key("2.14.1+cu130", "13.0", None, "3.11", "AVX512"),
              cache_key("2.14.1+cu130", "13.0", "3.8.0", "3.12", "AVX512"),
              cache_key("2.14.1+cu130", "13.0", "3.8.0", "3.11", "AVX2")}
    assert base not in others and len(others) == 6


def test_compiled_and_triton_digests_form_their_own_classes() -> None:
    env = {"triton": "3.8.0", "kernel_sets": {"torch": {"ops": "torch"}, "compiled": {"compile": "inductor"},
                                              "triton": {"module": "draft_triton", "triton": True},
                                              "stock": {"module": "exllamav3_ext", "triton": False}}}
    assert kernel_class("cpu-x", "cpu", env, "compiled") == "cpu-x-inductor-cpp-triton3.8.0"
    assert kernel_class("sm90-t", "gpu", env, "compiled") == "sm90-t-inductor-triton-triton3.8.0"
    assert kernel_class("sm90-t", "gpu", env, "triton") == "sm90-t-triton3.8.0"
    assert kernel_class("sm90-t", "gpu", env, "stock") == "sm90-t"
    groups = split_by_class({"s00/d4/torch": "a", "s00/d4/compiled": "b"}, "cpu-x", "cpu", env)
    assert groups == {"cpu-x": {"s00/d4/torch": "a"}, "cpu-x-inductor-cpp-triton3.8.0": {"s00/d4/compiled": "b"}}
    one = {"class": "cpu-x", "status": "match", "mismatches": [], "missing": [], "compared": 1, "file": "f"}
    two = {"class": "cpu-x-i", "status": "unknown-class", "mismatches": [], "missing": [], "compared": 0,
           "file": "g", "message": "no reference"}
    both = combine([one, two])
    assert both["status"] == "unknown-class" and both["class"] == "cpu-x" and both["message"] == "no reference"
    assert set(both["classes"]) == {"cpu-x", "cpu-x-i"}


def test_a_compiled_set_names_a_known_backend(tmp_path: Path) -> None:
    runner = compiled_repo(tmp_path / "repo")
    r = load_runner(runner)
    assert r.compiled == {"compiled": "inductor"} and r.cpu.kernels == ("compiled",)
    runner.write_text(runner.read_text().replace('compile = "inductor"', 'compile = "tvm"'))
    with pytest.raises(BadInput, match="kernels.compiled.compile = 'tvm'"):
        load_runner(runner)


def test_graph_breaks_and_a_disabled_dynamo_are_caught_in_process(tmp_path: Path) -> None:
    """The counting backend itself (dynamo's eager backend stands in for Inductor: no C++ to wait for)."""
    script = """
import json, torch, torch._dynamo
from hermetic.run.compiling import CompiledSet
out = {}
whole = CompiledSet("whole", "eager")
f = whole.compile(lambda x: torch.sin(x) * 2)
broken = CompiledSet("broken", "eager")
def two_graphs(x):
    y = torch.sin(x)
    torch._dynamo.graph_break()
    return y * 2
g = broken.compile(two_graphs)
for _ in range(3):
    f(torch.ones(4)); g(torch.ones(4))
torch._dynamo.config.disable = True
off = CompiledSet("off", "eager")
h = off.compile(lambda x: torch.cos(x) + 1)
for _ in range(3):
    h(torch.ones(4))
print(json.dumps({s.name: s.record() for s in (whole, broken, off)}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    assert rec["whole"]["status"] == "compiled" and rec["whole"]["graph_runs"] == 3
    assert rec["broken"]["status"] == "graph-break", rec["broken"]
    assert rec["off"]["status"] == "eager-fallback" and rec["off"]["graph_runs"] == 0


LINKED_KEY = """
import os, sys, torch
from hermetic.run.compiling import cache_key, package_version, use_kernel_caches
base, other = sys.argv[1:3]
key = cache_key(torch.__version__, torch.version.cuda, package_version("triton"),
                f"{sys.version_info[0]}.{sys.version_info[1]}", torch.backends.cpu.get_cpu_capability())
os.makedirs(os.path.join(other, key, "inductor"))
open(os.path.join(other, key, "inductor", "theirs.py"), "w").close()
os.makedirs(base)
os.symlink(os.path.join("..", os.path.basename(other), key), os.path.join(base, key))   # planted by base's own run
caches = use_kernel_caches(base)
print(os.path.realpath(caches["variables"]["TORCHINDUCTOR_CACHE_DIR"]))
"""


def test_a_link_in_a_runners_own_kernel_cache_never_leads_to_another_runners(tmp_path: Path) -> None:
    """attack47 (row 10): a runner's measuring process planted, in its own cache, a link at a key not yet used
    to another runner's folder of that key; its next run with that key loaded the other's kernels. The link is
    now removed and a folder made in its place."""
    base, other = tmp_path / "kernels" / "run-ra", tmp_path / "kernels" / "run-rb"
    p = subprocess.run([sys.executable, "-c", LINKED_KEY, str(base), str(other)], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    folder = Path(p.stdout.strip())
    assert folder.is_relative_to(base.resolve()) and not any(folder.iterdir()), folder
    assert [f.name for f in other.rglob("*.py")] == ["theirs.py"]


# whole runs ------------------------------------------------------------------------------------------------
def test_the_kernel_cache_is_inside_the_root_and_survives_between_runs(run_root: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    runner = compiled_repo(tmp_path / "repo")
    h = run_hermetic(run_root, tmp_path)
    first = h("run", runner, "--device", "cpu", "--json")
    assert first.rc == 0, first.err[-3000:]
    comp = receipt_of(first)["checks"]["compile"]
    assert comp["passed"] and comp["sets"]["compiled"]["status"] == "compiled"
    cache = Path(comp["cache"])
    assert cache.is_relative_to(run_root[0] / "state" / "kernels-v2" / "run-small")   # the runner's own
    assert (cache / "inductor").is_dir() and any((cache / "inductor").rglob("*"))
    kept = {p for p in cache.rglob("*") if p.is_file()}
    second = h("run", runner, "--device", "cpu", "--json")
    assert second.rc == 0, second.err[-3000:]
    receipt = receipt_of(second)
    comp = receipt["checks"]["compile"]
    assert comp["cache"] == str(cache) and kept <= {p for p in cache.rglob("*") if p.is_file()}
    assert comp["inductor_cache_misses"] == 0 and comp["inductor_cache_hits"] == 2, comp  # batches 1 and 2
    assert comp["cache_files_written"] == 0 and comp["compiled_nothing"] and comp["timed_clean"]
    assert comp["warmup_seconds"] > 0
    env = receipt["environment"]["env"]
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):
        assert env[var].startswith(str(cache) + os.sep), (var, env[var])
    created = receipt["outside_root_audit"].get("created", [])
    assert not [p for p in created if "inductor" in p or "triton" in p], created  # /tmp is shared: only ours
    dig = receipt["checks"]["digests"]
    assert any(c.endswith("-inductor-cpp-triton" + str(receipt["environment"]["triton"])) for c in dig["classes"])


def test_a_compile_inside_the_timed_phase_is_caught(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = compiled_repo(tmp_path / "repo", LATE_COMPILE_WORKER)
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu")
    assert r.rc == 1, r.err[-3000:]
    assert "compiling inside the timed calls" in r.err
    run_dir = Path(r.err.split("results in ")[1].split(",")[0])
    results = json.loads((run_dir / "results.json").read_text())
    comp = results["checks"]["compile"]
    assert not comp["passed"] and not comp["timed_clean"]
    assert comp["timed_events"]["graphs"] == 1 and comp["timed_events"]["dynamo_frames"] >= 1
    assert results["flags"]["compiled_in_timed_phase"]
    assert "**compiled inside the timed calls**" in (run_dir / "report.md").read_text()


def test_a_forced_fallback_to_eager_is_reported(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = compiled_repo(tmp_path / "repo", EAGER_WORKER)
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu")
    assert r.rc == 1, r.err[-3000:]
    assert "kernel set compiled is not what it claims to be: fallback to eager" in r.err
    run_dir = Path(r.err.split("results in ")[1].split(",")[0])
    results = json.loads((run_dir / "results.json").read_text())
    s = results["checks"]["compile"]["sets"]["compiled"]
    assert s["status"] == "eager-fallback" and s["graph_runs"] == 0 and s["calls"] > 0
    assert results["flags"]["not_compiled"] == ["compiled"]
    assert "`compiled`: **FAIL**, eager-fallback" in (run_dir / "report.md").read_text()
