#!/usr/bin/env python3
"""One kernel of each exl3 variant on the same input, against an FP64 reference (docs/exl3.md states the
expected errors before the run). Run with the realized profile first on PYTHONPATH:

    PYTHONPATH=.hermetic/profiles/exl3 python3 bench/exl3_kernels.py

silu_mul(x, y, z) computes z = silu(x) * y on FP16 tensors. Errors are in units of the FP16 ulp of the exact
result. Exit 1 when a prediction fails.
"""

from __future__ import annotations

import json
import sys

import torch

N = 1 << 22


def ulp_errors(z: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    a = ref.abs()
    exponent = torch.floor(torch.log2(a.clamp_min(2.0 ** -14)))
    ulp = torch.where(a < 2.0 ** -14, torch.full_like(a, 2.0 ** -24), torch.pow(2.0, exponent - 10))
    return (z.double() - ref).abs() / ulp


def main() -> int:
    import exllamav3_ext as stock  # noqa: F401  (both variants in one interpreter)
    import exllamav3_facc_ext as facc
    gen = torch.Generator().manual_seed(1234)
    x = (torch.rand(N, generator=gen, dtype=torch.float64) * 16 - 8).half()
    y = (torch.rand(N, generator=gen, dtype=torch.float64) * 4 - 2).half()
    ref = x.double() * torch.sigmoid(x.double()) * y.double()
    xd, yd = x.cuda(), y.cuda()
    out = {}
    for name, mod in (("stock", stock), ("facc", facc)):
        z = torch.empty_like(xd)
        mod.silu_mul(xd, yd, z, 0.0)
        torch.cuda.synchronize()
        e = ulp_errors(z.cpu(), ref)
        out[name] = {"max_ulp": round(e.max().item(), 4), "mean_ulp": round(e.mean().item(), 5),
                     "share_over_half_ulp": round((e > 0.5001).double().mean().item(), 6)}
    checks = {
        "facc max error <= 0.51 ulp (one rounding of an FP32 result)": out["facc"]["max_ulp"] <= 0.51,
        "stock max error > 1 ulp (FP16 intermediates)": out["stock"]["max_ulp"] > 1.0,
        "stock mean error >= 2x facc mean error": out["stock"]["mean_ulp"] >= 2 * out["facc"]["mean_ulp"],
    }
    print(json.dumps({"n": N, "device": torch.cuda.get_device_name(), "errors": out, "checks": checks}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
