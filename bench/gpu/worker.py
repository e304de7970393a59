"""GPU benchmark workload: a random-weight GPT-2-shaped model, compiled with
``torch.compile(mode="reduce-overhead")`` so CUDA graphs are captured, served on a TCP port.

Each connection gets the sha256 of the logits for a fixed (1, 128) input: a restored replica
is correct when its digest equals the one the source produced before its checkpoint. A
"KV cache" buffer is freed when a checkpoint is requested and re-allocated on restore, as an
inference server would. All GPU work runs on the main thread (CUDA graph trees are
per-thread), between polls of the socket and of the handshake files.

    python worker.py --port 8000 --layers 24 --width 2048 --kv-gb 16
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import time

import torch
import torch._inductor.async_compile
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from restore_runtime.workload import Handshake

VOCAB = 50257


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(1024, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.ln(x) @ self.emb.weight.T


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-gb", type=float, default=16.0)
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    # Weights are made on the CPU and copied over, as a real server loads them from disk.
    model = GPT(args.layers, args.width, args.heads).to(torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    model = model.cuda()
    t_weights = time.time() - t0
    fn = torch.compile(model, mode="reduce-overhead")
    idx = torch.randint(0, VOCAB, (1, 128), generator=torch.Generator().manual_seed(1)).cuda()

    def infer() -> str:
        with torch.inference_mode():
            out = fn(idx)
            return hashlib.sha256(out.float().cpu().numpy().tobytes()).hexdigest()

    for _ in range(3):  # compile, record and replay the CUDA graphs
        infer()
    kv_elems = int(args.kv_gb * 2**30 / 2)
    kv = torch.empty(kv_elems, dtype=torch.bfloat16, device="cuda") if kv_elems else None
    print(f"ready params={n_params} weights_s={t_weights:.1f} total_s={time.time() - t0:.1f}",
          flush=True)  # fmt: skip

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", args.port))
    srv.listen(64)
    srv.settimeout(0.02)
    hs = Handshake()
    while True:
        if hs.enabled and hs.checkpoint_requested():
            # torch.compile's worker pool holds forked copies of our NVIDIA mappings without
            # a CUDA context; CRIU cannot dump those, so end it (it restarts on demand).
            shutdown = getattr(torch._inductor.async_compile, "shutdown_compile_workers", None)
            if shutdown:
                shutdown()
            del kv
            kv = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            hs.signal_ready({"params": n_params})
            info = hs.wait_for_restore()
            kv = torch.empty(kv_elems, dtype=torch.bfloat16, device="cuda") if kv_elems else None
            print(f"resumed mode={info.mode} podIP={info.pod_ip}", flush=True)
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        with conn:
            conn.sendall((infer() + "\n").encode())


if __name__ == "__main__":
    main()
