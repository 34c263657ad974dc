#!/usr/bin/env python3
"""The P2P extension on real devices: device-local copy and accumulate (our kernels) against torch, the CPU
path, and, with two GPUs, a peer copy with its bandwidth next to a plain device-to-device copy.

    PYTHONPATH=.hermetic/profiles/p2p python3 bench/p2p_check.py
"""

from __future__ import annotations

import json
import sys

import torch


def main() -> int:
    import hermetic_p2p as p2p
    out: dict[str, object] = {"devices": p2p.device_count()}
    a = torch.arange(1 << 20, dtype=torch.float32)
    b = torch.empty_like(a)
    p2p.cpu_copy(b, a)
    acc = a.clone()
    p2p.accumulate(acc, a)
    ok = bool(torch.equal(b, a)) and bool(torch.equal(acc, 2 * a))
    if torch.cuda.is_available():
        s = torch.cuda.current_stream().cuda_stream
        da, db = a.cuda(), torch.empty(1 << 20, device="cuda")
        p2p.local_copy(db, da, s)
        dacc = da.clone()
        p2p.accumulate(dacc, da, s)
        torch.cuda.synchronize()
        ok = ok and bool(torch.equal(db, da)) and bool(torch.equal(dacc, 2 * da))
        if torch.cuda.device_count() > 1:
            out["can_access_peer"] = p2p.can_access_peer(0, 1)
            out["peer_enabled"] = p2p.enable_peer_access(0, 1)
            n = 1 << 28
            src = torch.ones(n, dtype=torch.uint8, device="cuda:1")
            dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")
            for label, fn in (("peer_copy", lambda: p2p.peer_copy(dst, src, s)),
                              ("torch_copy", lambda: dst.copy_(src))):
                fn()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    fn()
                end.record()
                torch.cuda.synchronize()
                out[f"{label}_GBps"] = round(10 * n / (start.elapsed_time(end) / 1e3) / 1e9, 1)
            ok = ok and bool(torch.equal(dst.cpu(), src.cpu()))
    out["ok"] = ok
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
