"""`hermetic run --peer N` on the CPU: the pair code path (rank 1 on its own card; on the CPU both ranks run on
the CPU and their exchange is the P2P extension's CPU path) with every check, the pair's digest class, its A/A
control and pair-vs-solo comparisons, the three no-multicast variables, and the two cards' locks taken in index
order, with real hermetic processes waiting on each other, and one killed.

What needs two GPUs (peer access, CUDA events on each card, NVML's link) is written but has not run: docs/run.md
says what and with which command.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from hermetic import fs
from hermetic.run.analysis import PAIR_AA, PAIR_VS_SOLO
from hermetic.run.digests import pair_class, split_by_class
from hermetic.run.pipeline import NO_MULTICAST, card_locks
from tests.support.cli import REPO, Hermetic, hermetic_env
from tests.support.runs import run_hermetic, small_repo

HOST = socket.gethostname()
CARD0, CARD1 = f"cpu-{HOST}.lock", f"cpu-{HOST}-card1.lock"

# the reference worker behind a gate: it waits (holding the run's locks) until the test creates the file
GATED_WORKER = """\
import os, time
from draft_worker import load_states, make_worker as reference  # noqa: F401


def make_worker(ctx):
    deadline = time.monotonic() + 300
    while not os.path.exists("{gate}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return reference(ctx)
"""

# rank 1's results come back one ulp off in their first element: the pair's outputs are no longer the solo's
LOSSY_WORKER = """\
import torch
from draft_worker import DraftWorker, load_states  # noqa: F401


class LossyPair(DraftWorker):
    def _from_peer(self, out, x, stream):
        super()._from_peer(out, x, stream)
        first = out.view(-1)[:1]
        first.copy_(torch.nextafter(first, first + 1))


def make_worker(ctx):
    return LossyPair(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"], ctx.get("peer_device"))
"""

# a factory written before pairs existed: it drops ctx["peer_device"]
DEAF_WORKER = """\
from draft_worker import DraftWorker, load_states  # noqa: F401


def make_worker(ctx):
    return DraftWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"])
"""


@pytest.fixture(scope="module")
def run_root(shared_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shared root with the P2P extension realized, and a lock folder of this module's own."""
    locks = tmp_path_factory.mktemp("pair-locks")
    h = Hermetic(shared_root, hermetic_env(tmp_path_factory.mktemp("home")))
    h("realize", REPO / "recipes" / "p2p.toml", check=True)
    return shared_root, locks


class Reader:
    """A hermetic process started with --json whose stdout records are read as they come."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self.p, self.lines, self.err = p, [], ""
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._e.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line)

    def _read_err(self) -> None:
        assert self.p.stderr is not None
        self.err = self.p.stderr.read()

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def waiting_for(self) -> str | None:
        """The lock this run says it waits for (its lock-wait record's path), or None."""
        for r in self.records():
            if r.get("event") == "lock-wait" or r.get("type") == "lock-wait":
                return str(r.get("path"))
        return None

    def finish(self, timeout: float = 300) -> tuple[int, dict[str, Any]]:
        rc = self.p.wait(timeout=timeout)
        self._t.join(timeout=30)
        self._e.join(timeout=30)
        return rc, self.records()[-1] if self.records() else {}


def _free(path: Path) -> bool:
    """Whether nobody holds the flock on ``path`` (taken and let go at once)."""
    lk = fs.FileLock(path, what="the test")
    if lk.acquire(blocking=False):
        lk.release()
        return True
    return False


def _wait(what: str, cond: Any, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.05)


def _holds(locks: Path, name: str, pid: int) -> bool:
    p = locks / name
    return p.exists() and f"pid {pid} " in p.read_text()


def _receipt(result: dict[str, Any]) -> dict[str, Any]:
    return json.loads(Path(result["receipt"]).read_text())


# the pair on the CPU: every check --------------------------------------------------------------------------
def test_a_pair_run_on_the_cpu_passes_every_check_and_its_class_is_recorded_and_compared(
        run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo")
    h = run_hermetic(run_root, tmp_path)
    first = h("run", runner, "--device", "cpu", "--peer", "1", "--record-digests", "--json")
    assert first.rc == 0, first.err[-3000:]
    receipt = _receipt(first.result)
    assert receipt["status"] == "ok"
    # the receipt's pair: both cards (the CPU), the link ("cpu"), the locks in index order
    pair = receipt["pair"]
    assert [c["index"] for c in pair["cards"]] == [0, 1] and {c["facts"] for c in pair["cards"]} == {"cpu"}
    assert pair["link"] == {"kind": "cpu"} and pair["devices"] == ["cpu", "cpu"]
    assert pair["lock_order"] == [CARD0, CARD1]
    assert [Path(p).name for p in receipt["locks"]["paths"]] == [CARD0, CARD1]
    # every check: exactness on both ranks (the solo's 48 comparisons and the pair's 48), the exchange's copy
    # bit-exact, the pair's outputs equal to the solo's, the digests of both classes
    checks = receipt["checks"]
    assert checks["exactness"]["passed"] and checks["exactness"]["comparisons"] == 96
    assert checks["pair"]["passed"] and checks["pair"]["peer_copy_exact"] is True
    assert checks["pair"]["transport"] == "cpu" and checks["pair"]["equal_to_solo"]["compared"] == 12
    assert checks["pair"]["equal_to_solo"]["mismatches"] == []
    solo_cls = receipt["device_class"]
    pair_cls = pair_class(solo_cls, "cpu")
    assert pair_cls.startswith("cpux2-cpu-") and pair_cls.endswith(solo_cls[len("cpu-"):])
    assert {c: v["status"] for c, v in checks["digests"]["classes"].items()} == {solo_cls: "recorded",
                                                                                  pair_cls: "recorded"}
    ref = runner.parent / "digests" / f"{pair_cls}.txt"
    solo_ref = runner.parent / "digests" / f"{solo_cls}.txt"
    digests = [line for line in ref.read_text().splitlines() if line.startswith("s")]
    assert len(digests) == 12 and digests == [line for line in solo_ref.read_text().splitlines()
                                              if line.startswith("s")]  # the same bits as the solo run
    # the three variables that keep NVLink multicast off, in the measuring process's environment
    assert {k: receipt["environment"]["env"][k] for k in NO_MULTICAST} == NO_MULTICAST
    # the pair's cells measured beside the solo ones, in the same interleaved blocks
    results = json.loads((Path(first.result["run_dir"]) / "results.json").read_text())
    order = [s["label"] for s in results["samples"] if s["rep"] == 0 and s["call"] == 0]
    assert order == [s["label"] for s in results["samples"] if s["rep"] == 1 and s["call"] == 0][::-1]
    assert {"greedy-b2/torch@pair", "greedy-b2/torch@pair#aa", "mixed-b2/torch@pair"} <= set(order)
    comps = {c["name"]: c for c in results["analysis"]["comparisons"]}
    assert comps[PAIR_AA]["a"] == "greedy-b2/torch@pair" and comps[PAIR_AA]["b"] == "greedy-b2/torch@pair#aa"
    for cell in ("greedy-b2", "mixed-b2"):
        c = comps[PAIR_VS_SOLO + cell]
        assert (c["a"], c["b"]) == (f"{cell}/torch", f"{cell}/torch@pair") and "sign_ci" in c and "decision" in c
    report = (Path(first.result["run_dir"]) / "report.md").read_text()
    assert "* pair: rank 0 on card 0, rank 1 on card 1 (cpu, cpu); link cpu" in report
    assert "the copy bit-exact" in report and "12 compared, 0 differ -> **pass**" in report
    assert "| pair vs solo: greedy-b2 | greedy-b2/torch | greedy-b2/torch@pair |" in report
    assert "## The pair's exchange on the CPU" in report
    # a second run compares both classes with what the first recorded
    again = h("run", runner, "--device", "cpu", "--peer", "1", "--json")
    assert again.rc == 0, again.err[-3000:]
    assert {c: v["status"] for c, v in _receipt(again.result)["checks"]["digests"]["classes"].items()} == {
        solo_cls: "match", pair_cls: "match"}
    # and a pair digest tampered with fails the run, naming its key
    lines = ref.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith("s0"))
    key, digest = lines[n].split()
    lines[n] = f"{key} {'0' if digest[0] != '0' else '1'}{digest[1:]}"
    ref.write_text("\n".join(lines) + "\n")
    bad = h("run", runner, "--device", "cpu", "--peer", "1")
    assert bad.rc == 1, bad.err[-3000:]
    assert f"digest drifted: {key}" in bad.err


def test_a_solo_run_also_keeps_multicast_off(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo")
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu", "--json")
    assert r.rc == 0, r.err[-3000:]
    receipt = _receipt(r.result)
    assert receipt["pair"] is None and "pair" not in receipt["checks"]
    assert {k: receipt["environment"]["env"][k] for k in NO_MULTICAST} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_a_pair_whose_exchange_is_one_ulp_off_fails_against_the_solo_outputs(run_root: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo", LOSSY_WORKER)
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu", "--peer", "1", "--json")
    assert r.rc == 1, r.err[-3000:]
    receipt = _receipt(r.result)
    pair = receipt["checks"]["pair"]
    assert not pair["passed"] and pair["peer_copy_exact"] is True  # the extension's copy is exact: the worker is not
    assert pair["equal_to_solo"]["mismatches"] and receipt["checks"]["exactness"]["passed"]
    assert "differ -> **FAIL**" in Path(receipt["report"]).read_text()
    assert "warning: the pair's checks failed: s00/d4/torch" in r.err


def test_a_factory_that_drops_the_peer_device_fails_the_pair_run_saying_so(run_root: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo", DEAF_WORKER)
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu", "--peer", "1")
    assert r.rc == 1, r.err[-3000:]
    assert "ignored the pair's peer_device 'cpu'" in r.err and "Traceback" not in r.err


def test_peer_must_name_another_card(run_root: tuple[Path, Path], tmp_path: Path) -> None:
    runner = small_repo(tmp_path / "repo")
    r = run_hermetic(run_root, tmp_path)("run", runner, "--device", "cpu", "--gpu", "1", "--peer", "1")
    assert r.rc == 2 and "error: --peer: --peer 1 needs a second card, other than --gpu 1" in r.err, r.err
    assert "Traceback" not in r.err


# the two cards' locks ---------------------------------------------------------------------------------------
def test_a_pair_waits_for_a_solo_run_on_its_lower_card_holding_nothing(run_root: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """A solo run holds card 0; a pair asked for cards 1 and 0 (in that order) waits for card 0 without taking
    card 1 first (index order), so no run can hold card 1 while waiting for card 0 and deadlock with it."""
    locks = run_root[1]
    gate = tmp_path / "gate"
    runner = small_repo(tmp_path / "repo", GATED_WORKER.format(gate=gate))
    h = run_hermetic(run_root, tmp_path)
    solo = Reader(h.popen("run", runner, "--device", "cpu", "--json"))
    pair: Reader | None = None
    try:
        _wait("the solo run holds card 0", lambda: _holds(locks, CARD0, solo.p.pid))
        pair = Reader(h.popen("run", runner, "--device", "cpu", "--gpu", "1", "--peer", "0", "--json"))
        _wait("the pair says it waits", lambda: pair.waiting_for() is not None or pair.p.poll() is not None)
        assert pair.waiting_for() == str(locks / CARD0), (pair.records()[-3:], pair.err[-2000:])
        time.sleep(0.5)  # it stays waiting, holding nothing: card 1 is free
        assert pair.p.poll() is None and _free(locks / CARD1)
    finally:
        gate.touch()
    rc, res = solo.finish()
    assert rc == 0, solo.err[-3000:]
    assert pair is not None
    rc, res = pair.finish()
    assert rc == 0, pair.err[-3000:]
    receipt = _receipt(res)
    assert receipt["pair"]["cards"][0]["index"] == 1 and receipt["pair"]["lock_order"] == [CARD0, CARD1]
    assert receipt["locks"]["waited_s"] > 0.4 and receipt["checks"]["pair"]["passed"]


def test_two_pair_runs_asking_for_crossed_cards_at_once_both_finish(run_root: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    locks = run_root[1]
    gate = tmp_path / "gate"
    runner = small_repo(tmp_path / "repo", GATED_WORKER.format(gate=gate))
    h = run_hermetic(run_root, tmp_path)
    runs = [Reader(h.popen("run", runner, "--device", "cpu", "--gpu", a, "--peer", b, "--json",
                           "--lock-timeout", "240"))
            for a, b in (("0", "1"), ("1", "0"))]
    try:
        def settled() -> bool:  # one holds both cards and the other waits for card 0 (holding nothing)
            return any(_holds(locks, CARD0, r.p.pid) and _holds(locks, CARD1, r.p.pid) for r in runs) and any(
                r.waiting_for() for r in runs)
        _wait("one pair holds both cards and the other waits", settled)
        holder = next(r for r in runs if _holds(locks, CARD0, r.p.pid))
        waiter = next(r for r in runs if r is not holder)
        assert waiter.waiting_for() == str(locks / CARD0)
    finally:
        gate.touch()
    done = [r.finish() for r in runs]
    for (rc, _), r in zip(done, runs, strict=True):
        assert rc == 0, r.err[-3000:]
    receipts = [_receipt(res) for _, res in done]
    assert all(rc["pair"]["lock_order"] == [CARD0, CARD1] and rc["checks"]["pair"]["passed"] for rc in receipts)
    waited = sorted(rc["locks"]["waited_s"] for rc in receipts)
    assert waited[0] < 0.5 < waited[1]  # one took both at once, the other waited for it


def test_a_killed_pair_run_leaves_no_process_and_releases_both_locks(run_root: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    locks = run_root[1]
    gate = tmp_path / "gate"  # never opened: the run is killed while its measuring process waits behind it
    runner = small_repo(tmp_path / "repo", GATED_WORKER.format(gate=gate))
    h = run_hermetic(run_root, tmp_path)
    p = h.popen("run", runner, "--device", "cpu", "--peer", "1")
    try:
        _wait("the pair holds both cards", lambda: _holds(locks, CARD0, p.pid) and _holds(locks, CARD1, p.pid))

        def children() -> list[psutil.Process]:
            out = []
            for proc in psutil.process_iter(["cmdline"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                if "hermetic.run.child" in cmd and str(run_root[0]) in cmd:
                    out.append(proc)
            return out
        _wait("its measuring process runs", lambda: bool(children()))
        assert not _free(locks / CARD0) and not _free(locks / CARD1)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
        _wait("no measuring process is left", lambda: not children(), timeout=30)
        assert _free(locks / CARD0) and _free(locks / CARD1)
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=60)
        gate.touch()


# the pure parts ---------------------------------------------------------------------------------------------
def test_card_locks_follow_the_card_index_whatever_order_they_are_asked_in() -> None:
    assert card_locks("cpu", {1: "", 0: ""}) == card_locks("cpu", {0: "", 1: ""})
    assert [n for n, _ in card_locks("cpu", {3: "", 1: ""})] == [f"cpu-{HOST}-card1.lock", f"cpu-{HOST}-card3.lock"]
    gpus = card_locks("gpu", {1: "GPU-aaaa", 0: "GPU-ffff"})  # by index, not by the UUID's spelling
    assert [n for n, _ in gpus] == ["gpu-GPU-ffff.lock", "gpu-GPU-aaaa.lock"]


def test_a_pairs_class_names_both_cards_and_the_link() -> None:
    assert pair_class("sm90-torch2.11.0_cu130", "nvlink") == "sm90x2-nvlink-torch2.11.0_cu130"
    assert pair_class("sm90-torch2.11.0_cu130", "pcie", "sm80") == "sm90+sm80-pcie-torch2.11.0_cu130"
    assert pair_class("cpu-avx2-amd-torch2.14.1-t2", "cpu") == "cpux2-cpu-avx2-amd-torch2.14.1-t2"
    env = {"kernel_sets": {"torch": {"ops": "torch"}, "compiled": {"compile": "inductor"}}, "triton": "3.8.0"}
    groups = split_by_class({"s00/d4/torch": "a", "s00/d4/torch@pair": "b", "s00/d4/compiled@pair": "c"},
                            "cpu-avx2-amd-torch2.14.1-t2", "cpu", env, pair_link="cpu")
    assert groups == {"cpu-avx2-amd-torch2.14.1-t2": {"s00/d4/torch": "a"},
                      "cpux2-cpu-avx2-amd-torch2.14.1-t2": {"s00/d4/torch": "b"},
                      "cpux2-cpu-avx2-amd-torch2.14.1-t2-inductor-cpp-triton3.8.0": {"s00/d4/compiled": "c"}}
