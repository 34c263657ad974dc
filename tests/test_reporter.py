"""The reporter on a real pseudo-terminal: one live display for the command, each phase's bar finished,
stopped and left as one line, a wait row that moves. (test_run.py drives the same display through a real
`hermetic run` waiting for a real lock.)"""

from __future__ import annotations

import io
import json
import os
import re
import time

from hermetic.reporter import Reporter, plural
from tests.support.terminal import PtyReader, screen


def test_each_phase_is_seen_once_and_the_wait_row_moves() -> None:
    term = PtyReader()
    stream = os.fdopen(os.dup(term.slave), "w")
    r = Reporter(stderr=stream)
    assert r.interactive
    r.event("start", "realized p2p")
    wait = r.wait("waiting for the GPU's lock", 10, "held by pid 7 on h since T")
    for waited in (1, 2, 3):
        wait.update(waited, "held by pid 7 on h since T")
        time.sleep(0.4)  # the display redraws 4 times a second
    wait.close("took the lock on the GPU after 3.0 s")
    for phase, total in (("run load", 1), ("run checks", 8), ("run measure", 25)):
        task = r.task(phase, total, "steps")
        for _ in range(total):
            task.advance(1)
        time.sleep(0.3)
        r.event("note", f"inside {phase}")  # printed above the display, not into it
        task.close()
    fetch_a, fetch_b = r.task("a.whl", 100, "bytes", closing_line=False), r.task("b.whl", 50, "bytes")
    fetch_a.advance(100)
    fetch_b.advance(50)
    time.sleep(0.3)  # two rows at once, in the one display
    fetch_a.close()
    fetch_b.close()
    r.event("end", "done")
    r.close()
    stream.close()
    raw = term.finish()

    # the wait row said who holds the lock and moved: waited up, left down
    moves = re.findall(r"(\d+) s waited, (\d+) s left", raw)
    assert {("1", "9"), ("2", "8"), ("3", "7")} <= set(moves)
    assert "held by pid 7 on h since T" in raw
    assert "━" in raw  # bars were drawn (rich's bar glyph)
    lines = screen(raw)
    assert lines[0] == "realized p2p" and lines[1] == "took the lock on the GPU after 3.0 s"
    for phase, total in (("run load", 1), ("run checks", 8), ("run measure", 25)):
        finished = [ln for ln in lines if ln.startswith(phase)]
        assert len(finished) == 1, lines
        steps = "step" if total == 1 else "steps"  # "1 of 1 step", never "1 steps of 1 steps"
        assert re.fullmatch(rf"{phase}: done, {total} of {total} {steps} in \d+\.\d s", finished[0])
        assert lines.index(f"inside {phase}") == lines.index(finished[0]) - 1
    assert [ln for ln in lines if "whl" in ln] == ["b.whl: done, 50 B of 50 B in 0.3 s"]
    assert lines[-1] == "done"
    assert not [ln for ln in lines if "━" in ln or "waited" in ln]  # no bar or wait row is left behind


def test_without_a_terminal_a_wait_is_plain_lines_with_the_time_waited_and_left() -> None:
    err, out = io.StringIO(), io.StringIO()
    plain = Reporter(stderr=err)
    assert not plain.interactive
    wait = plain.wait("waiting for the GPU's lock", 60, "held by pid 7")
    wait.last -= 20  # as if the last line were 20 s ago
    wait.update(20.0, "held by pid 8")
    wait.close("took the lock after 21.0 s")
    assert err.getvalue().splitlines() == ["still waiting for the GPU's lock (held by pid 8): 20 s waited, 40 s left",
                                           "took the lock after 21.0 s"]
    records = Reporter(json_mode=True, stdout=out, stderr=io.StringIO())
    wait = records.wait("waiting for the GPU's lock", 60)
    wait.last -= 20
    wait.update(20.0, "held by pid 8")
    (rec,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert rec["event"] == "waiting" and rec["waited_s"] == 20.0 and rec["left_s"] == 40.0
    assert rec["detail"] == "held by pid 8"


def test_levels_and_streams_data_on_stdout_whatever_the_level() -> None:
    """-q keeps warnings and data, -v adds detail; data goes to stdout, the rest to stderr; --json puts every
    record, detail and data included, on stdout as one line each."""
    def said(**kw: bool) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        r = Reporter(stdout=out, stderr=err, **kw)
        r.event("step", "a step")
        r.detail("object", "an object line")
        r.data("show", "the listing")
        r.warn("a warning")
        r.result("show", True, 0)
        return out.getvalue(), err.getvalue()

    assert said() == ("the listing\n", "a step\nwarning: a warning\n")
    assert said(quiet=True) == ("the listing\n", "warning: a warning\n")
    assert said(verbose=True) == ("the listing\n", "a step\nan object line\nwarning: a warning\n")
    assert said(quiet=True, verbose=True) == said(quiet=True)
    out, err = said(json_mode=True)
    assert [json.loads(line).get("event", "result") for line in out.splitlines()] == \
        ["step", "show", "warning", "result"]
    out, _err = said(json_mode=True, verbose=True)
    assert [json.loads(line).get("event", "result") for line in out.splitlines()] == \
        ["step", "object", "show", "warning", "result"]


def test_counts_read_as_english() -> None:
    assert [plural(n, "objects") for n in (0, 1, 2)] == ["0 objects", "1 object", "2 objects"]
    assert [plural(1, w) for w in ("steps", "modules", "kernel sets", "mismatches", "entries", "patches")] == \
        ["1 step", "1 module", "1 kernel set", "1 mismatch", "1 entry", "1 patch"]
    err = io.StringIO()
    task = Reporter(stderr=err).task("compiling p2p", 2, "objects")
    task.advance(1)
    task.close()
    assert re.fullmatch(r"compiling p2p: stopped, 1 of 2 objects in \d+\.\d s\n", err.getvalue())


def test_a_long_step_says_what_it_does_and_its_seconds_count_on_a_terminal() -> None:
    term = PtyReader()
    stream = os.fdopen(os.dup(term.slave), "w")
    r = Reporter(stderr=stream)
    task = r.task("compiling p2p", 2, "objects", closing_line=False)
    task.advance(1)
    task.doing("running default/hermetic_p2p: p2p.cpp", since=time.monotonic() - 61)
    time.sleep(1.6)  # the row redraws 4 times a second, the seconds with it
    task.doing("")
    time.sleep(0.4)
    task.close()
    r.close()
    stream.close()
    raw = term.finish()
    seen = re.findall(r"compiling p2p: running default/hermetic_p2p: p2p\.cpp, 1 min (\d\d) s", raw)
    assert len(set(seen)) >= 2 and min(int(s) for s in seen) >= 1, raw[-2000:]  # counting: 1 min 01 s, 02 s...
    assert "1 of 2 objects" in raw
    assert not screen(raw), screen(raw)  # no closing line asked for: nothing is left


def test_without_a_terminal_what_a_step_does_is_said_when_it_changes_and_every_30_s() -> None:
    out = io.StringIO()
    r = Reporter(json_mode=True, stdout=out, stderr=io.StringIO())
    task = r.task("run checks", 192, "steps")
    began = time.monotonic() - 3
    task.doing("compiling kernel set compiled (torch.compile, Inductor) for depth 4, batch 1", since=began)
    task.doing("compiling kernel set compiled (torch.compile, Inductor) for depth 4, batch 1", since=began)
    task.said -= 31  # type: ignore[attr-defined]  # as if said 31 s ago: said again
    task.doing("compiling kernel set compiled (torch.compile, Inductor) for depth 4, batch 1", since=began - 31)
    task.doing("")
    task.doing("compiling kernel set compiled (torch.compile, Inductor) for depth 4, batch 2", since=began)
    said = [json.loads(line) for line in out.getvalue().splitlines()]
    doing = [(rec["doing"][-7:], rec["doing_s"]) for rec in said if rec.get("doing")]
    assert [d for d, _ in doing] == ["batch 1", "batch 1", "batch 2"]
    assert doing[0][1] >= 3 and doing[1][1] >= 34
    assert said[1]["message"].startswith("run checks: compiling kernel set compiled (torch.compile, Inductor) for "
                                         "depth 4, batch 1, ")
