"""A hand-written Triton kernel set for the draft worker: ``silu_mul(gate, up, out, 0.0)``, the signature of the
exllamav3 modules' activation, out = silu(gate) * up computed in float32 and stored in out's dtype.

It needs a GPU and triton; ``unavailable(device)`` says why it cannot run elsewhere, and the measuring process
then skips the set with that reason (on a CPU run, and on a GPU without triton) instead of failing. Its
kernels are JIT-compiled by Triton on the first call of each dtype and block shape, into TRITON_CACHE_DIR
(inside the root, keyed by torch and triton's versions); the worker's prepare and the checks make those first
calls, so the timed calls compile nothing.
"""

from __future__ import annotations

from typing import Any

USES_TRITON = True  # the digests of this set form their own class, naming triton's version

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU machine may lack it; unavailable() says so
    triton = None


def unavailable(device: str) -> str | None:
    """Why this set cannot run on ``device`` ("cpu" or "cuda"), or None."""
    if triton is None:
        return "triton is not installed in the measuring interpreter"
    if device != "cuda":
        return "Triton kernels need a GPU (a CPU run measures torch's ops and the compiled set)"
    return None


if triton is not None:
    @triton.jit
    def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        g = tl.load(g_ptr + offs, mask=m).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=m).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(o_ptr + offs, y.to(o_ptr.dtype.element_ty), mask=m)


def silu_mul(gate: Any, up: Any, out: Any, _unused: float = 0.0) -> None:
    """out = silu(gate) * up, elementwise over contiguous tensors of one shape (on the current stream)."""
    if triton is None:
        raise RuntimeError(unavailable("cuda") or "triton is unavailable")
    if not (gate.is_contiguous() and up.is_contiguous() and out.is_contiguous()) or gate.shape != up.shape:
        raise ValueError("silu_mul needs contiguous gate, up and out of one shape")
    n = gate.numel()
    block = 1024
    _silu_mul_kernel[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block)
