"""`hermetic run` on the CPU: the whole protocol, the exactness and digest checks, the memory guard, the device
lock, strict runner files and the GPU preconditions (fed facts recorded on an H200 through NVML).

Runs use the real reference worker and the real P2P extension, realized once in the session's shared root;
small variants of the worker live in a throw-away repository under tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hermetic import fs, sandbox
from hermetic.errors import BadInput
from hermetic.run.gpu import GpuFacts, check_preconditions
from hermetic.run.spec import load_runner
from tests.support import cli
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.runs import SLOW_WORKER, run_hermetic, small_repo
from tests.support.terminal import PtyReader, screen

ULP_WORKER = """\
import torch
from draft_worker import Call, DraftWorker, load_states  # noqa: F401


class OneUlpCall(Call):
    # the switch bumps the confidence of row 0 at step 0 by one ulp when that row is greedy
    def _forward(self):
        super()._forward()
        if self.graph == "switch":
            c = self.confidence[0, 0:1]
            bumped = torch.nextafter(c, torch.full_like(c, 2.0))
            self.confidence[0, 0:1].copy_(torch.where(self.mask[0:1], c, bumped))


class OneUlpWorker(DraftWorker):
    call_class = OneUlpCall


def make_worker(ctx):
    return OneUlpWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""

LEAKY_WORKER = """\
from draft_worker import DraftWorker, load_states  # noqa: F401


def make_worker(ctx):
    with open("{leak}", "w") as f:  # a cache in the real HOME, named by a careless library
        f.write("cached")
    return DraftWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""

HUNGRY_WORKER = """\
import torch
from draft_worker import DraftWorker, load_states  # noqa: F401

HOARD = []


def make_worker(ctx):
    for _ in range(40):  # 40 x 64 MiB, touched: resident, not just reserved
        HOARD.append(torch.ones(16 << 20, dtype=torch.float32))
    return DraftWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""

@pytest.fixture(scope="module")
def run_root(shared_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shared root with the P2P extension realized, and a lock folder of the tests' own."""
    locks = tmp_path_factory.mktemp("locks")
    h = Hermetic(shared_root, hermetic_env(tmp_path_factory.mktemp("home")))
    h("realize", REPO / "recipes" / "p2p.toml", check=True)
    return shared_root, locks


def test_full_protocol_on_the_cpu(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    h = run_hermetic(run_root, tmp_path)
    r = h("run", REPO / "runner" / "worker.toml", "--device", "cpu", "--json")
    assert r.rc == 0, r.err[-3000:]
    res = r.result
    assert res["ok"] and res["status"] == "ok"
    receipt = json.loads(Path(res["receipt"]).read_text())
    run_dir = Path(res["run_dir"])
    assert receipt["kind"] == "run" and receipt["device"] == "cpu" and receipt["refs"]
    # 240 comparisons per kernel set: torch's ops and the compiled set
    assert receipt["checks"]["exactness"]["passed"] and receipt["checks"]["exactness"]["comparisons"] == 480
    dig = receipt["checks"]["digests"]
    assert len(dig["classes"]) == 2 and any(c.startswith(dig["class"] + "-inductor-cpp-") for c in dig["classes"])
    for cls, one in dig["classes"].items():
        reference = REPO / "manifests" / "digests" / f"{cls}.txt"
        assert one["status"] == ("match" if reference.exists() else "unknown-class"), (cls, one)
    comp = receipt["checks"]["compile"]
    assert comp["passed"] and comp["timed_clean"] and comp["sets"]["compiled"]["status"] == "compiled"
    assert not receipt["memory_guard"]["tripped"] and receipt["memory_guard"]["peak_rss"] > 0
    assert receipt["limits"]["address_space"] == 32 << 30
    assert receipt["environment"]["threads"] == 2
    audit = receipt["outside_root_audit"]
    assert audit.get("available", True) is not False
    assert receipt["sandbox"]["used"] is (sandbox.bwrap_path()[0] is not None)  # auto: where bwrap works
    if receipt["sandbox"]["used"]:  # inside it nothing outside can be ours, whatever else the machine writes
        assert audit["clean"] is True and audit["counts"]["ours"] == 0, audit["files"][:5]
    # the protocol: cells interleaved, the order reversed every repetition, the first call of a block dropped
    results = json.loads((run_dir / "results.json").read_text())
    samples = results["samples"]
    order = {rep: [s["label"] for s in samples if s["rep"] == rep and s["call"] == 0] for rep in range(5)}
    assert order[1] == order[0][::-1] and order[2] == order[0]
    assert len(set(order[0])) == 9 and "greedy-d5-b4/torch#aa" in order[0] and "greedy-d5-b4/compiled" in order[0]
    assert all(s["discarded"] == (s["call"] == 0) for s in samples)
    comps = {c["name"]: c for c in results["analysis"]["comparisons"]}
    assert "sign_ci" in comps["A/A control"] and "skipped" in comps["facc vs stock kernels"]
    assert (run_dir / "report.md").read_text().startswith("# hermetic run: draft on the cpu")
    assert (run_dir / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(run_root[1].glob("cpu-*.lock"))
    # the checks said when they compiled the compiled set, and for which shape (tens of seconds otherwise silent)
    doing = [rec["doing"] for rec in r.records if rec.get("event") == "progress" and rec.get("doing")]
    assert any(d.startswith("compiling kernel set compiled (torch.compile, Inductor) for depth ") for d in doing)
    # the comparisons of kernel sets a CPU never measures: one line, not a row each
    report = (run_dir / "report.md").read_text()
    assert "| facc vs stock kernels |" not in report and "\nNot compared on the cpu, which does not measure " \
        "kernel sets stock, facc" in report
    # the measuring process saw the P2P recipe's toolchain as its CUDA, never a system one (torch logs the
    # CUDA_HOME it takes into worker.log where no GPU is found)
    seen = receipt["environment"]["env"]
    assert seen["CUDA_HOME"].startswith(str(run_root[0] / "store")) and seen["CUDA_HOME"].endswith("/nvidia/cu13")
    assert seen["PATH"].split(":")[0] == seen["CUDA_HOME"] + "/bin"
    assert "/usr/local" not in (run_dir / "worker.log").read_text()
    # nothing that decides no bit is reported as changed (the interpreter's path, how the capability was chosen):
    # a matching reference, pinned, names no difference from this run
    if dig["status"] == "match" and dig["drift"]["pinned"]:
        assert dig["drift"]["differences"] == [], dig["drift"]


def test_the_avx2_class_is_measured_and_matched_here_through_aten_cpu_capability(run_root: tuple[Path, Path],
                                                                                   tmp_path: Path) -> None:
    """torch dispatches its CPU kernels at AVX2 when told to; the class follows, and its committed reference
    (recorded the same way on this project's AVX-512 machine) matches."""
    h = run_hermetic(run_root, tmp_path)
    r = h("run", REPO / "runner" / "worker.toml", "--device", "cpu", "--repetitions", "2", "--json",
          env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert r.rc == 0, r.err[-3000:]
    receipt = json.loads(Path(r.result["receipt"]).read_text())
    assert receipt["environment"]["cpu_capability"] == "AVX2"
    assert receipt["environment"]["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    dig = receipt["checks"]["digests"]
    assert dig["class"].startswith("cpu-avx2-") and dig["class"].endswith("-t2")
    for cls, one in dig["classes"].items():  # torch's ops' class and the compiled set's
        reference = REPO / "manifests" / "digests" / f"{cls}.txt"
        assert one["status"] == ("match" if reference.exists() else "unknown-class"), (cls, one)
        if reference.exists():
            assert one["compared"] == 24
    if (REPO / "manifests" / "digests" / f"{dig['class']}.txt").exists():
        assert dig["drift"]["pinned"]


def test_a_one_ulp_switch_fails_the_exactness_check(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo", ULP_WORKER)
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu")
    assert r.rc == 1, r.err[-3000:]
    assert "drifted: all-greedy confidence" in r.err and "row=0" in r.err
    run_dir = Path(r.err.split("results in ")[1].split(",")[0])
    results = json.loads((run_dir / "results.json").read_text())
    bad = results["exactness_mismatches"]
    assert bad and {m["check"] for m in bad} <= {"all-greedy confidence", "greedy-row confidence"}
    assert all(m["row"] == 0 and m["positions"] == 1 for m in bad)
    assert "| all-greedy confidence |" in (run_dir / "report.md").read_text()


def test_a_tampered_reference_digest_fails(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo")
    h = run_hermetic(run_root, tmp_path)
    first = h("run", runner, "--device", "cpu", "--record-digests", "--json")
    assert first.rc == 0, first.err[-3000:]
    (ref,) = (runner.parent / "digests").glob("cpu-*.txt")
    # the reference pins the receipt of the run that recorded it, and the facts that receipt names
    receipt_path = Path(first.result["receipt"])
    receipt = json.loads(receipt_path.read_text())
    assert receipt["checks"]["digests"]["status"] == "recorded"
    pins = [line.split(" ", 3)[1:] for line in ref.read_text().splitlines() if line.startswith("pin ")]
    assert ["receipt", f"receipts/{receipt_path.name}", "sha256:" + fs.sha256_file(receipt_path)[0]] in pins
    assert (ref.parent / "receipts" / receipt_path.name).read_bytes() == receipt_path.read_bytes()  # it ships
    p2p = receipt["modules"]["hermetic_p2p"]
    assert p2p["sha256"] == fs.sha256_file(Path(p2p["file"]))[0]
    assert ["module", "hermetic_p2p", "sha256:" + p2p["sha256"]] in pins
    assert ["runtime", "torch", receipt["environment"]["torch"]] in pins
    lines = ref.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith("s0"))
    key, digest = lines[n].split()
    lines[n] = f"{key} {'0' if digest[0] != '0' else '1'}{digest[1:]}"
    ref.write_text("\n".join(lines) + "\n")
    again = h("run", runner, "--device", "cpu")
    assert again.rc == 1, again.err[-3000:]
    assert f"digest drifted: {key}" in again.err
    # the drift report: nothing the reference pinned changed, so the bits moved under the same modules and runtime
    # it names the receipt where it ships, beside the reference
    shipped = ref.parent / "receipts" / receipt_path.name
    assert (f"since the reference run (receipt {shipped}; sha256 {fs.sha256_file(receipt_path)[0][:16]}): "
            "modules unchanged; runtime unchanged; inputs unchanged") in again.err


def test_the_memory_guard_stops_a_worker_past_its_limit(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo", HUNGRY_WORKER, memory="1500M")
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu", "--json")
    assert r.rc == 1, r.err[-3000:]
    res = r.result
    receipt = json.loads(Path(res["receipt"]).read_text())
    guard = receipt["memory_guard"]
    assert guard["tripped"] and guard["stopped"]["rss"] > guard["limit"] == 1500 << 20
    assert receipt["status"] == "failed" and "memory guard" in receipt["reason"]
    plan = str(Path(res["run_dir"]) / "plan.json")
    assert not [p for p in psutil.process_iter(["cmdline"]) if plan in " ".join(p.info["cmdline"] or [])]


@pytest.mark.skipif(sandbox.bwrap_path()[0] is None, reason="bubblewrap is not installed here")
def test_a_worker_writing_to_the_real_home_fails_in_the_sandbox_and_is_ours_without(run_root: tuple[Path, Path],
                                                                                   tmp_path: Path) -> None:
    leak = tmp_path / "home" / ".cache" / "careless" / "kernels.bin"
    leak.parent.mkdir(parents=True)
    runner = small_repo(tmp_path / "repo", LEAKY_WORKER.format(leak=leak))
    h = run_hermetic(run_root, tmp_path)
    r = h("run", runner, "--device", "cpu", "--json")
    assert r.rc == 1, r.err[-3000:]
    err = r.result["error"]
    assert err["kind"] == "sandbox-refused" and err["where"] == str(leak), err
    assert f"error: {leak}: python" in r.err and "Read-only file system" in r.err
    assert not leak.exists()
    receipt = json.loads(Path(err["hint"].rsplit("the run's receipt: ", 1)[1]).read_text())
    assert receipt["status"] == "failed" and str(leak) in receipt["reason"]
    assert receipt["sandbox"]["used"] and receipt["sandbox"]["refused"][0]["path"] == str(leak)
    # without the sandbox the run passes, the file lands, and the audit says it is ours
    r = h("run", runner, "--device", "cpu", "--json", "--sandbox", "off")
    assert r.rc == 0, r.err[-3000:]
    receipt = json.loads(Path(r.result["receipt"]).read_text())
    assert receipt["sandbox"]["used"] is False and leak.exists()
    ours = [f for f in receipt["outside_root_audit"]["files"] if f["ours"] == "yes"]
    assert [f["path"] for f in ours] == [str(leak)], ours
    assert "python" in ours[0]["reason"] and receipt["outside_root_audit"]["clean"] is False


def test_a_second_run_waits_for_the_lock_then_gives_up(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    runner = small_repo(tmp_path / "repo", SLOW_WORKER.format(gate=gate))
    h = run_hermetic(run_root, tmp_path)
    first = h.popen("run", runner, "--device", "cpu")
    try:
        lock = next(iter(run_root[1].glob("cpu-*.lock")), None)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the first run holds the lock once it names itself in the file
            lock = next(iter(run_root[1].glob("cpu-*.lock")), None)
            if lock and f"pid {first.pid} " in lock.read_text():
                break
            time.sleep(0.1)
        else:
            pytest.fail("the first run never took the lock")
        second = h("run", runner, "--device", "cpu", "--lock-timeout", "1")
        assert second.rc == 3, second.err
        assert "waiting up to 1 s" in second.err and f"held by pid {first.pid}" in second.err
        assert "timed out after 1 s" in second.err
    finally:
        gate.touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]


def test_on_a_terminal_each_phase_shows_once_and_the_lock_wait_moves(run_root: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """A real run whose stderr is a pseudo-terminal, waiting for a CPU lock this test holds for a few seconds."""
    import socket

    runner = small_repo(tmp_path / "repo")
    root, locks = run_root
    lock = fs.FileLock(locks / f"cpu-{socket.gethostname()}.lock", what="the test")
    assert lock.acquire(blocking=False)
    lock.note(f"pid {os.getpid()} on the test since now\n")
    term = PtyReader(columns=160)
    env = {**run_hermetic(run_root, tmp_path).env, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen(cli.command(root, "run", runner, "--device", "cpu", "--lock-timeout", "120"),
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=term.slave, env=env, cwd=REPO)
    try:
        moves = term.wait_for(r"\d+ s waited, \d+ s left", timeout=60, count=3)
    finally:
        lock.release()
    out, _ = p.communicate(timeout=300)
    raw = term.finish()
    assert p.returncode == 0, screen(raw)[-20:]
    # the wait row said who holds the lock, and moved: waited up, left down, every second
    assert len(moves) >= 3, raw[-3000:]
    pairs = [tuple(int(x) for x in re.findall(r"\d+", m)) for m in moves]
    assert all(w + left == 120 for w, left in pairs) and [w for w, _ in pairs] == sorted(w for w, _ in pairs)
    assert f"held by pid {os.getpid()} on the test since now" in raw
    lines = screen(raw)
    for phase in ("run load", "run checks", "run warm-up", "run measure"):
        finished = [ln for ln in lines if ln.startswith(phase)]
        assert len(finished) == 1 and finished[0].startswith(f"{phase}: done, "), lines
    took = [ln for ln in lines if ln.startswith("took the lock on this machine's CPU measurements after")]
    assert len(took) == 1
    order = [next(i for i, ln in enumerate(lines) if ln.startswith(x))
             for x in ("took the lock", "run load", "run checks", "run warm-up", "run measure", "run small")]
    assert order == sorted(order)
    assert not [ln for ln in lines if "━" in ln or " s waited" in ln], lines  # no bar or wait row left behind
    assert out == b""  # stdout carries data only (none without --json)


@pytest.mark.parametrize(("edit", "message"), [
    (("[protocol]", "[protocol]\nrepetition = 4"), "unknown key 'repetition' in [protocol]"),
    (("repetitions = 3", 'repetitions = "3"'), "repetitions must be a number"),
    (('mask = "alternate"', 'mask = "half"'), "mask 'half' is not one of"),
    (('b = "mixed-b2"', 'b = "mixed-b3"'), "compare.b 'mixed-b3' names no cell"),
    (('graph = "switch"', 'graph = "original"'), "the original graph is greedy only"),
    (('"../recipes/p2p.toml"]\nkernels = ["torch"]\nthreads', '"../../outside.toml"]\nkernels = ["torch"]\nthreads'),
     "leaves the repository"),
    (("threads = 1\n", 'threads = 1\ncpus = "4095"\n'), "names no CPU this machine lets hermetic use"),
    (("threads = 1\n", 'threads = 1\ncpus = "0-1,1-0"\n'), "the range 1-0 runs backwards"),   # one cpus rule
    (("threads = 1\n", 'threads = 1\ncpus = "0-"\n'), "'0-' is not a CPU number or a range N-M"),
])
def test_bad_runner_files_name_file_line_and_key(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    runner = small_repo(tmp_path / "repo")
    text = runner.read_text()
    assert edit[0] in text
    runner.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(BadInput) as e:
        load_runner(runner)
    assert message in e.value.what and str(runner) in (e.value.where or "")
    assert ":" in (e.value.where or "")[len(str(runner)):]  # a line number follows the file


def test_bad_runner_exits_2_without_a_traceback(tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo")
    runner.write_text(runner.read_text().replace("calls = 3", "calls = -1"))
    p = cli.run(tmp_path / "root", "run", runner, env=hermetic_env(pip="machine"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"{runner}:" in p.stderr and "protocol.calls" in p.stderr
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("*.json"))


# GPU preconditions, fed facts recorded on an H200 through NVML (bench/gpu_run_check.sh stage 3) ----------------
H200 = GpuFacts.from_json(json.loads((REPO / "tests" / "data" / "gpu" / "h200-facts.json").read_text()))


def _pre(facts: GpuFacts, **kw: object) -> list[str]:
    args: dict = {"power_cap_w": 700.0, "min_free_memory": 8 << 30, "archs": ("9.0",), "toolchain_cuda": "13.0"}
    args.update(kw)
    return [f.key for f in check_preconditions(facts, **args)]


def test_recorded_h200_facts_pass_with_the_cards_power_cap() -> None:
    assert H200.name == "NVIDIA H200" and H200.power_limit_w == 700.0
    assert _pre(H200) == []


def test_each_precondition_fails_on_its_own() -> None:
    from dataclasses import replace
    assert _pre(H200, power_cap_w=225.0) == ["gpu.power_cap_w"]       # the example file's production cap
    busy = replace(H200, processes=({"pid": 4242, "used_memory": 1 << 30},))
    assert _pre(busy) == ["gpu.processes"]
    assert _pre(busy, own_pids=frozenset({4242})) == []                 # our own context is not a tenant
    assert _pre(replace(H200, memory_free=1 << 30)) == ["gpu.min_free_memory"]
    assert _pre(H200, archs=("8.0",)) == ["gpu.arch"]
    assert _pre(H200, archs=("8.0+PTX",)) == []                         # PTX is compiled for newer GPUs
    assert _pre(replace(H200, cuda_driver="12.8"), toolchain_cuda="13.0") == ["gpu.driver"]


def test_the_frozen_states_are_what_the_script_writes(tmp_path: Path) -> None:
    out = tmp_path / "states.json"
    subprocess.run([sys.executable, str(REPO / "runner" / "make_states.py"), "--out", str(out)], check=True,
                   capture_output=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.read_bytes() == (REPO / "runner" / "states" / "synthetic.json").read_bytes()
