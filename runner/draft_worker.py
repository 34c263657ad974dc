"""The reference worker: a speculative-decoding draft worker with two tensor-parallel ranks on one device.

One draft step (EAGLE-style): the last token's embedding and the target model's hidden state are fused by a
linear layer, one gated MLP block (silu(gate) * up) and a vocabulary head give logits; a greedy row (T0)
proposes the argmax with its softmax probability as confidence; a sampled row (T1) draws from softmax(logits
/ T) with frozen Gumbel noise and returns the whole distribution as its q payload. `depth` steps run in one
call, each feeding its proposal and hidden state to the next.

Tensor parallelism over two logical ranks: the MLP is column/row parallel (each rank holds half of the
intermediate features; the two partial outputs are summed where a real pair would all-reduce) and the head is
vocabulary parallel (each rank computes half of the logits; they are gathered where a pair would
all-gather). Both exchanges go through the realized P2P extension (`accumulate`, `local_copy` / `cpu_copy`).
On a GPU rank 1 runs on a second stream and the call is captured as one CUDA graph that joins both ranks; the
MLP activation is the realized exllamav3 kernel (`silu_mul`, stock or facc) or the hand-written Triton one
(runner/draft_triton.py). On a CPU the call is eager. A compiled kernel set (an object with ``compile(fn)``:
torch.compile, Inductor's C++ on a CPU and Triton on a GPU) compiles each rank's whole MLP (both matmuls, the
activation, the down projection); the rank exchange and the head stay as they are.

Two graphs: "original" (greedy only, as shipped) and "switch" (per-row greedy/sampled mask). With an
all-greedy mask the switch graph runs the very same greedy operations and must match the original bit for bit.

Weights and sampling noise come from an integer hash (`det_uniform`), identical on every machine and torch
version; request states are frozen fixtures (runner/states/, written by runner/make_states.py).

A pair (``peer_device``, `hermetic run --peer N`): rank 1 runs on its own card, with its own copy of its half of
the weights, in the same process. Each exchange goes through the P2P extension as built: rank 1's input is
copied to its card and its partial results back (`peer_copy` between two GPUs, with peer access where the link
allows it and staged through the host where not; `cpu_copy` on the CPU), then summed (`accumulate`) or gathered
on rank 0's card. A pair call runs eagerly (no CUDA graph spans the two cards); rank 1's work is on a stream of
its own card, which rank 0's stream waits for before the exchange.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import torch

DEFAULTS = {"hidden": 512, "intermediate": 1536, "vocab": 8192, "eps": 1e-6}


def det_uniform(n: int, seed: int) -> torch.Tensor:
    """n values in [0, 1) from an integer hash of (index, seed): float64, identical everywhere."""
    m = 0xFFFFFFFF
    x = torch.arange(n, dtype=torch.int64)
    x = (x * 0x2545F491 + (seed * 0x1B873593 & m) + 0x3C6EF372) & m
    for mult, shift in ((0x7FEB352D, 15), (0x046A9D47, 13), (0x5BD1E995, 16)):
        x = x ^ (x >> shift)
        x = (x * mult) & m
    x = x ^ (x >> 16)
    return x.to(torch.float64) / 2.0 ** 32


def det_normalish(shape: tuple[int, ...], seed: int, scale: float) -> torch.Tensor:
    """Deterministic weights: uniform in [-scale*sqrt(3), scale*sqrt(3)) (variance scale^2), float32."""
    n = 1
    for s in shape:
        n *= s
    u = det_uniform(n, seed)
    return ((u * 2 - 1) * (scale * 3 ** 0.5)).to(torch.float32).reshape(shape)


def load_states(path: str | Path) -> list[dict[str, Any]]:
    """Request states: last token, the target model's hidden state (float32, exact), noise seed, temperature."""
    data = json.loads(Path(path).read_text())
    states = []
    for s in data["states"]:
        raw = base64.b64decode(s["hidden_f32"])
        hidden = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()
        states.append({"token": int(s["token"]), "hidden": hidden, "seed": int(s["seed"]),
                       "temperature": float(s["temperature"])})
    return states


class Weights:
    def __init__(self, p: dict[str, Any], device: torch.device, dtype: torch.dtype) -> None:
        h, i, v = p["hidden"], p["intermediate"], p["vocab"]
        if i % 2 or v % 2:
            raise ValueError("intermediate and vocab must be even (two ranks)")

        def w(shape: tuple[int, ...], seed: int, scale: float) -> torch.Tensor:
            return det_normalish(shape, seed, scale).to(device=device, dtype=dtype).contiguous()

        self.embed = w((v, h), 1, 1.0)
        self.fuse = w((h, 2 * h), 2, (2 * h) ** -0.5)
        self.norm1 = (1 + det_normalish((h,), 3, 0.1)).to(device=device, dtype=dtype)
        self.norm2 = (1 + det_normalish((h,), 4, 0.1)).to(device=device, dtype=dtype)
        # rank r holds rows/columns [r*i/2, (r+1)*i/2) of the MLP and [r*v/2, (r+1)*v/2) of the head
        gate, up, down = w((i, h), 5, h ** -0.5), w((i, h), 6, h ** -0.5), w((h, i), 7, i ** -0.5)
        head = w((v, h), 8, h ** -0.5 * 4)
        hi, hv = i // 2, v // 2
        self.gate = [gate[r * hi:(r + 1) * hi].contiguous() for r in range(2)]
        self.up = [up[r * hi:(r + 1) * hi].contiguous() for r in range(2)]
        self.down = [down[:, r * hi:(r + 1) * hi].contiguous() for r in range(2)]
        self.head = [head[r * hv:(r + 1) * hv].contiguous() for r in range(2)]


class Call:
    """One prepared worker call: static input and output buffers, and (on a GPU) its captured graph."""

    def __init__(self, worker: DraftWorker, graph: str, depth: int, batch: int, kernels: str) -> None:
        if graph not in ("original", "switch"):
            raise ValueError(f"unknown graph {graph!r}")
        self.w, self.graph, self.depth, self.batch, self.kernels = worker, graph, depth, batch, kernels
        dev, p = worker.device, worker.params
        h, v = p["hidden"], p["vocab"]
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.hidden = torch.zeros(batch, h, dtype=worker.dtype, device=dev)
        self.mask = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.inv_temp = torch.ones(batch, 1, dtype=torch.float32, device=dev)
        self.gumbel = torch.zeros(batch, depth, v, dtype=torch.float32, device=dev)
        self.proposals = torch.zeros(batch, depth, dtype=torch.int64, device=dev)
        self.confidence = torch.zeros(batch, depth, dtype=torch.float32, device=dev)
        self.q = torch.zeros(batch, depth, v, dtype=torch.float32, device=dev) if graph == "switch" else None
        self.cuda_graph: Any = None
        if worker.device.type == "cuda" and worker.peer is None:
            self._capture()

    # inputs ---------------------------------------------------------------------------------------------
    def load(self, states: list[dict[str, Any]], mask: list[int]) -> None:
        if len(states) != self.batch or len(mask) != self.batch:
            raise ValueError("states and mask must have the call's batch size")
        if any(mask) and self.graph == "original":
            raise ValueError("the original graph is greedy only")
        v, h = self.w.params["vocab"], self.w.params["hidden"]
        if any(s["hidden"].numel() != h or not 0 <= s["token"] < v for s in states):
            raise ValueError(f"request states do not fit the worker (hidden {h}, vocab {v}): "
                             "write matching states with runner/make_states.py --hidden H --vocab V")
        self.tokens.copy_(torch.tensor([s["token"] for s in states]))
        self.hidden.copy_(torch.stack([s["hidden"] for s in states]))
        self.mask.copy_(torch.tensor([bool(m) for m in mask]))
        self.inv_temp.copy_(torch.tensor([[1.0 / s["temperature"]] for s in states]))
        noise = torch.stack([_gumbel(s["seed"], self.depth, v) for s in states])
        self.gumbel.copy_(noise)

    def __call__(self) -> None:
        if self.cuda_graph is not None:
            self.cuda_graph.replay()
        else:
            self._forward()

    def outputs(self) -> dict[str, torch.Tensor]:
        out = {"proposals": self.proposals, "confidence": self.confidence}
        if self.q is not None:
            out["q"] = self.q
        return out

    # the computation ------------------------------------------------------------------------------------
    def _capture(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the capture: library handles, workspaces
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.cuda_graph):
            self._forward()
        torch.cuda.synchronize()

    def _forward(self) -> None:
        w, p = self.w, self.w.params
        wt = w.weights
        tok, hid = self.tokens, self.hidden
        for t in range(self.depth):
            e = wt.embed.index_select(0, tok)
            x = torch.cat([e, hid], dim=1) @ wt.fuse.t()
            hn = _rms(x, wt.norm1, p["eps"])
            x = x + w.mlp(hn, self.kernels).to(x.dtype)
            hid = x
            logits = w.head(_rms(x, wt.norm2, p["eps"]))  # float32 [B, V]
            probs = torch.softmax(logits, dim=-1)
            conf_g, tok_g = probs.max(dim=-1)
            if self.graph == "switch":
                pt = torch.softmax(logits * self.inv_temp, dim=-1)
                tok_s = torch.argmax(torch.log(pt) + self.gumbel[:, t], dim=-1)
                conf_s = pt.gather(1, tok_s[:, None])[:, 0]
                tok_n = torch.where(self.mask, tok_s, tok_g)
                conf = torch.where(self.mask, conf_s, conf_g)
                assert self.q is not None
                self.q[:, t].copy_(torch.where(self.mask[:, None], pt, torch.zeros_like(pt)))
            else:
                tok_n, conf = tok_g, conf_g
            self.proposals[:, t].copy_(tok_n)
            self.confidence[:, t].copy_(conf)
            tok = tok_n


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _mlp_math(hn: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One rank's MLP as torch's ops, what a compiled set compiles (the same arithmetic as the eager path)."""
    a = torch.nn.functional.silu(hn @ gate.t()) * (hn @ up.t())
    return (a @ down.t()).float()


def _gumbel(seed: int, depth: int, vocab: int) -> torch.Tensor:
    u = det_uniform(depth * vocab, seed + 1_000_003).clamp(1e-12, 1 - 1e-12)
    return (-torch.log(-torch.log(u))).to(torch.float32).reshape(depth, vocab)


class DraftWorker:
    """The worker as the runner sees it: ``prepare(...)`` returns a ready ``Call`` (``call_class``)."""

    call_class = Call

    def __init__(self, params: dict[str, Any], device: str, kernels: dict[str, Any], p2p: Any,
                 peer_device: str | None = None) -> None:
        self.params = {**DEFAULTS, **params}
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.kernels = kernels
        self.p2p = p2p
        self.weights = Weights(self.params, self.device, self.dtype)
        # a pair: rank 1 on its own card (``peer``), holding its own copy of its half of the weights
        self.peer = torch.device(peer_device) if peer_device else None
        self.peer_device = peer_device  # what the runner checks it was given
        self.rank1 = None
        if self.peer is not None:
            wt = self.weights
            self.rank1 = {name: getattr(wt, name)[1].to(self.peer, copy=True).contiguous()
                          for name in ("gate", "up", "down", "head")}
        if self.device.type == "cuda":
            with torch.cuda.device(self.peer if self.peer is not None else self.device):
                self.rank1_stream: Any = torch.cuda.Stream()
        else:
            self.rank1_stream = None
        self.compiled: dict[str, Any] = {}  # compiled set -> its compiled MLP (both ranks share it)

    def prepare(self, *, graph: str, depth: int, batch: int, kernels: str) -> Call:
        if kernels not in self.kernels:
            raise ValueError(f"kernels {kernels!r} not available here (have: {sorted(self.kernels)})")
        return self.call_class(self, graph, depth, batch, kernels)

    # tensor-parallel pieces -----------------------------------------------------------------------------
    def _stream_ptr(self) -> int:
        return torch.cuda.current_stream().cuda_stream if self.device.type == "cuda" else 0

    def _act(self, g: torch.Tensor, u: torch.Tensor, kernels: str) -> torch.Tensor:
        mod = self.kernels[kernels]
        if mod is None:  # torch's own ops (the CPU path)
            return torch.nn.functional.silu(g) * u
        out = torch.empty_like(g)
        mod.silu_mul(g, u, out, 0.0)
        return out

    def _mlp_rank(self, hn: torch.Tensor, r: int, kernels: str) -> torch.Tensor:
        wt = self.weights
        mod = self.kernels[kernels]
        if r == 1 and self.rank1 is not None:  # a pair: rank 1's own weights, on its own card
            gate, up, down = self.rank1["gate"], self.rank1["up"], self.rank1["down"]
        else:
            gate, up, down = wt.gate[r], wt.up[r], wt.down[r]
        if hasattr(mod, "compile"):  # a compiled set: the rank's whole MLP is one graph
            if kernels not in self.compiled:
                self.compiled[kernels] = mod.compile(_mlp_math)
            return self.compiled[kernels](hn, gate, up, down)
        a = self._act(hn @ gate.t(), hn @ up.t(), kernels)
        return (a @ down.t()).float()

    # a pair: rank 1 on its own card ----------------------------------------------------------------------
    def _to_peer(self, x: torch.Tensor, stream: int) -> torch.Tensor:
        """Rank 0's tensor copied to rank 1's card through the P2P extension."""
        out = torch.empty(x.shape, dtype=x.dtype, device=self.peer)
        if self.device.type == "cuda":
            self.p2p.peer_copy(out, x.contiguous(), stream)
        else:
            self.p2p.cpu_copy(out, x.contiguous())
        return out

    def _from_peer(self, out: torch.Tensor, x: torch.Tensor, stream: int) -> None:
        """Rank 1's tensor copied into ``out`` on rank 0's card through the P2P extension."""
        if self.device.type == "cuda":
            self.p2p.peer_copy(out, x, stream)
        else:
            self.p2p.cpu_copy(out, x)

    def _pair_mlp(self, hn: torch.Tensor, kernels: str) -> torch.Tensor:
        if self.device.type != "cuda":
            hn1 = self._to_peer(hn, 0)
            y0 = self._mlp_rank(hn, 0, kernels)
            y1 = self._mlp_rank(hn1, 1, kernels).contiguous()
            y1_home = torch.empty_like(y0)
            self._from_peer(y1_home, y1, 0)
            self.p2p.accumulate(y0, y1_home, 0)
            return y0
        main, s1 = torch.cuda.current_stream(self.device), self.rank1_stream
        s1.wait_stream(main)  # hn is ready on rank 0's card
        with torch.cuda.device(self.peer), torch.cuda.stream(s1):
            hn1 = self._to_peer(hn, s1.cuda_stream)
            y1 = self._mlp_rank(hn1, 1, kernels).contiguous()
            y1_home = torch.empty(y1.shape, dtype=y1.dtype, device=self.device)
            self._from_peer(y1_home, y1, s1.cuda_stream)
        y0 = self._mlp_rank(hn, 0, kernels)
        main.wait_stream(s1)
        y1_home.record_stream(main)
        self.p2p.accumulate(y0, y1_home, main.cuda_stream)
        return y0

    def _pair_head(self, hn: torch.Tensor, parts: torch.Tensor) -> None:
        wt, r1 = self.weights, self.rank1
        assert r1 is not None
        if self.device.type != "cuda":
            hn1 = self._to_peer(hn, 0)
            parts[0].copy_((hn @ wt.head[0].t()).float())
            l1 = (hn1 @ r1["head"].t()).float().contiguous()
            self._from_peer(parts[1], l1, 0)
            return
        main, s1 = torch.cuda.current_stream(self.device), self.rank1_stream
        s1.wait_stream(main)
        with torch.cuda.device(self.peer), torch.cuda.stream(s1):
            hn1 = self._to_peer(hn, s1.cuda_stream)
            l1 = (hn1 @ r1["head"].t()).float().contiguous()
            self._from_peer(parts[1], l1, s1.cuda_stream)
        parts[0].copy_((hn @ wt.head[0].t()).float())
        main.wait_stream(s1)

    def timing_streams(self) -> list[Any]:
        """The stream of each card a call runs on (rank 0's first): the runner brackets each with CUDA events."""
        if self.device.type != "cuda":
            return []
        main = torch.cuda.current_stream(self.device)
        return [main] if self.peer is None else [main, self.rank1_stream]

    def mlp(self, hn: torch.Tensor, kernels: str) -> torch.Tensor:
        """Both ranks' partial MLP outputs, summed by the P2P extension where a pair would all-reduce."""
        if self.peer is not None:
            return self._pair_mlp(hn, kernels)
        if self.rank1_stream is None:
            y0 = self._mlp_rank(hn, 0, kernels)
            y1 = self._mlp_rank(hn, 1, kernels)
            self.p2p.accumulate(y0, y1, 0)
            return y0
        main = torch.cuda.current_stream()
        s1 = self.rank1_stream
        s1.wait_stream(main)
        with torch.cuda.stream(s1):
            y1 = self._mlp_rank(hn, 1, kernels)
        y0 = self._mlp_rank(hn, 0, kernels)
        main.wait_stream(s1)
        # y1's block belongs to stream s1 and is reused only by s1, which first waits for main: no race
        self.p2p.accumulate(y0, y1, main.cuda_stream)
        return y0

    def head(self, hn: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel logits, gathered by the P2P extension where a pair would all-gather."""
        wt = self.weights
        b = hn.shape[0]
        hv = wt.head[0].shape[0]
        parts = torch.empty(2, b, hv, dtype=torch.float32, device=self.device)
        if self.peer is not None:
            self._pair_head(hn, parts)
        elif self.rank1_stream is None:
            parts[0].copy_((hn @ wt.head[0].t()).float())
            l1 = (hn @ wt.head[1].t()).float().contiguous()
            self.p2p.cpu_copy(parts[1], l1)
        else:
            main = torch.cuda.current_stream()
            s1 = self.rank1_stream
            s1.wait_stream(main)
            with torch.cuda.stream(s1):
                l1 = (hn @ wt.head[1].t()).float().contiguous()
            parts[0].copy_((hn @ wt.head[0].t()).float())
            main.wait_stream(s1)
            self.p2p.local_copy(parts[1], l1, main.cuda_stream)
        return parts.permute(1, 0, 2).reshape(b, 2 * hv)


def make_worker(ctx: dict[str, Any]) -> DraftWorker:
    """The runner's entry point: ``ctx`` carries params, device, the kernel modules and the P2P module, and for
    a pair the device of rank 1's card (``peer_device``)."""
    return DraftWorker(ctx["params"], ctx["device"], ctx["kernels"], ctx["p2p"], ctx.get("peer_device"))
