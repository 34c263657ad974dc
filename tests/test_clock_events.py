"""Which NVML clock-event reasons invalidate a sample (thermal or hardware slowdown, power brake, board and
reliability limits) and which only flag it (the software power cap): one definition, hermetic/run/child.py's,
taken from nvidia-ml-py's constants where it has them."""

from __future__ import annotations

from types import SimpleNamespace

from hermetic.run.child import INVALIDATING_REASONS, POWER_CAP_REASONS, reason_mask

BOARD_LIMIT, RELIABILITY, HW_SLOWDOWN, SW_POWER_CAP, GPU_IDLE, APP_CLOCKS = 0x200, 0x400, 0x8, 0x4, 0x1, 0x2


def test_the_masks_without_bindings_hold_every_slowdown_and_limit() -> None:
    invalid = reason_mask(None, INVALIDATING_REASONS)
    assert invalid == 0x8 | 0x20 | 0x40 | 0x80 | BOARD_LIMIT | RELIABILITY
    assert reason_mask(None, POWER_CAP_REASONS) == SW_POWER_CAP
    assert not invalid & (SW_POWER_CAP | GPU_IDLE | APP_CLOCKS)  # a capped or idle sample still stands


def test_the_bindings_constants_win() -> None:
    nv = SimpleNamespace(nvmlClocksThrottleReasonBoardLimit=0x1000)  # as if NVML moved the bit
    assert reason_mask(nv, INVALIDATING_REASONS) & 0x1000 and not reason_mask(nv, INVALIDATING_REASONS) & BOARD_LIMIT


def test_nvidia_ml_py_names_them_all() -> None:
    import pynvml  # nvidia-ml-py, in the dev extra: the suite skips nothing
    for name, bit in {**INVALIDATING_REASONS, **POWER_CAP_REASONS}.items():
        assert getattr(pynvml, name) == bit, name
