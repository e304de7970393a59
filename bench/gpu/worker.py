"""GPU benchmark workload: a random-weight GPT-2-shaped model, compiled with
``torch.compile(mode="reduce-overhead")`` so CUDA graphs are captured, served on a TCP port.

Each connection gets the sha256 of the logits for a fixed (1, 128) input: a restored replica
is correct when its digest equals the one the source produced before its checkpoint. A
"KV cache" buffer is freed when a checkpoint is requested and re-allocated on restore, as an
inference server would. All GPU work runs on the main thread (CUDA graph trees are
per-thread), between polls of the socket and of the handshake files.

With --api-port, it also serves vLLM's sleep-mode endpoints there (``POST /sleep``,
``POST /wake_up``, ``GET /is_sleeping``), so a checkpoint can quiesce it through the ``vllm``
engine profile instead of the handshake: sleep frees the KV buffer, wake allocates it again,
and while asleep the digest port answers nothing.

With --engines N (N > 1) it is a process tree, as engines are (vLLM's API server in front of
its engine cores): this process serves the ports and never touches CUDA, and N engine
processes (this file with --rank, each its own model, seeded by rank, on the one GPU) answer
it over pipes. The digest is then the sha256 of the engines' digests, so a restore is correct
only when every engine came back bitwise identical.

With --pinned-gb G it also holds G GB of pinned host memory (``pin_memory=True``: a shared
mapping the driver registers), filled with a pattern, as vLLM's sleep mode keeps its weights
in; the digest then covers a sample of it (64 bytes of every MiB), so a restore that lost or
zeroed it answers differently.

With --sleep gpu|pinned|pageable its weights live in one range of the driver's virtual-memory
API, as vLLM's allocator keeps them, and its sleep (at a checkpoint's quiesce) keeps them on
the GPU, moves them to pinned host memory as vLLM's level 1 does, or to pageable memory copied
back in pinned pieces at wake (bench/gpu/sleep.py). It prints ``sleep_s`` and ``wake_s``.

    python worker.py --port 8000 --layers 24 --width 2048 --kv-gb 16 [--api-port 8001]
                     [--engines 2] [--pinned-gb 8] [--sleep pageable]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import time

import torch
import torch._inductor.async_compile
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import sleep  # bench/gpu, beside this file: the script's directory is on sys.path
import sleep_mode

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


class Engine:
    """One model on the GPU: its digest, and its KV buffer freed for a checkpoint."""

    def __init__(self, args: argparse.Namespace, seed: int = 0) -> None:
        t0 = time.time()
        torch.manual_seed(seed)
        # Weights are made on the CPU and copied over, as a real server loads them from disk.
        model = GPT(args.layers, args.width, args.heads).to(torch.bfloat16).eval()
        self.params = sum(p.numel() for p in model.parameters())
        mode = getattr(args, "sleep", "")
        # in one range of the driver's virtual-memory API, as vLLM's allocator keeps them
        self.sleeper = sleep.Sleeper(mode, sleep.place(model)) if mode else None
        if not mode:
            model = model.cuda()
        self.weights_s = time.time() - t0
        # before the warm-up: every answer covers it
        self.pinned = _pinned(getattr(args, "pinned_gb", 0.0), seed)
        self.fn = torch.compile(model, mode="reduce-overhead")
        gen = torch.Generator().manual_seed(1)
        self.idx = torch.randint(0, VOCAB, (1, 128), generator=gen).cuda()
        for _ in range(3):  # compile, record and replay the CUDA graphs
            self.infer()
        self.kv_elems = int(args.kv_gb / max(args.engines, 1) * 2**30 / 2)
        self.kv: torch.Tensor | None = None
        self.asleep = False
        self.allocate()

    def infer(self) -> str:
        with torch.inference_mode():
            out = self.fn(self.idx)
            h = hashlib.sha256(out.float().cpu().numpy().tobytes())
            if self.pinned is not None:
                h.update(self.pinned.view(-1, 1 << 20)[:, :64].contiguous().numpy().tobytes())
            return h.hexdigest()

    def allocate(self) -> None:
        if self.sleeper and self.asleep:
            print(f"woke mode={self.sleeper.mode} wake_s={self.sleeper.wake():.3f}",
                  file=sys.stderr, flush=True)  # fmt: skip
            self.asleep = False
        if self.kv_elems:
            self.kv = torch.empty(self.kv_elems, dtype=torch.bfloat16, device="cuda")

    def free(self) -> None:
        # torch.compile's worker pool holds forked copies of our NVIDIA mappings without
        # a CUDA context; CRIU cannot dump those, so end it (it restarts on demand).
        shutdown = getattr(torch._inductor.async_compile, "shutdown_compile_workers", None)
        if shutdown:
            shutdown()
        self.kv = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if self.sleeper and not self.asleep:
            print(f"slept mode={self.sleeper.mode} sleep_s={self.sleeper.sleep():.3f}",
                  file=sys.stderr, flush=True)  # fmt: skip
            self.asleep = True


def _pinned(gb: float, seed: int) -> torch.Tensor | None:
    """``gb`` GB of pinned host memory with a pattern made on the GPU and copied over."""
    if gb <= 0:
        return None
    mib = int(gb * 1e9) >> 20
    host = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    gen = torch.Generator(device="cuda").manual_seed(100 + seed)
    block = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, device="cuda", generator=gen)
    for at in range(0, host.numel(), block.numel()):
        n = min(block.numel(), host.numel() - at)
        host[at : at + n].copy_(block[:n].roll(at >> 20))
    torch.cuda.synchronize()
    return host


class Ranks:
    """The front's view of N engine processes, one line per command over their pipes."""

    def __init__(self, args: argparse.Namespace) -> None:
        model = [
            "--layers",
            str(args.layers),
            "--width",
            str(args.width),
            "--heads",
            str(args.heads),
            "--kv-gb",
            str(args.kv_gb),
            "--engines",
            str(args.engines),
            "--pinned-gb",
            str(args.pinned_gb / max(args.engines, 1)),
            *(["--sleep", args.sleep] if args.sleep else []),
        ]
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(r), *model],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(args.engines)
        ]
        self.params = sum(int(self._read(p).split("params=")[1].split()[0]) for p in self.procs)

    def ask(self, command: str) -> list[str]:
        for p in self.procs:  # all at once: each engine works on its own
            p.stdin.write(command + "\n")
            p.stdin.flush()
        return [self._read(p) for p in self.procs]

    @staticmethod
    def _read(p: subprocess.Popen) -> str:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"engine process {p.pid} exited ({p.wait()})")
        return line.strip()

    def infer(self) -> str:
        return hashlib.sha256("".join(self.ask("infer")).encode()).hexdigest()

    def allocate(self) -> None:
        self.ask("allocate")

    def free(self) -> None:
        self.ask("free")


def engine_process(args: argparse.Namespace) -> None:
    """One rank of --engines N: commands on stdin, answers on stdout, logs on stderr."""
    engine = Engine(args, seed=args.rank)
    print(f"ready params={engine.params} rank={args.rank}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "infer":
            answer = engine.infer()
        elif command in ("free", "allocate"):
            getattr(engine, command)()
            answer = "ok"
        else:
            answer = f"unknown command {command!r}"
        print(answer, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-gb", type=float, default=16.0)
    ap.add_argument("--api-port", type=int, default=0, help="vLLM's sleep-mode endpoints")
    ap.add_argument("--engines", type=int, default=1, help="engine processes behind a front")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--pinned-gb", type=float, default=0.0, help="pinned host memory held")
    ap.add_argument("--sleep", type=sleep_mode.arg, default=None,
                    help="weights in one virtual-memory range, and where they go asleep "
                         "(bench/gpu/sleep.py); unset: torch's allocator, on the GPU")  # fmt: skip
    args = ap.parse_args()
    if args.rank >= 0:
        return engine_process(args)
    t0 = time.time()
    engine = Ranks(args) if args.engines > 1 else Engine(args)
    weights = f" weights_s={engine.weights_s:.1f}" if isinstance(engine, Engine) else ""
    print(
        f"ready params={engine.params} engines={args.engines}{weights} "
        f"total_s={time.time() - t0:.1f}",
        flush=True,
    )
    state = {"asleep": False}

    srv = listen(args.port)
    api = listen(args.api_port) if args.api_port else None
    hs = Handshake()
    while True:
        if hs.enabled and hs.checkpoint_requested():
            engine.free()
            hs.signal_ready({"params": engine.params})
            info = hs.wait_for_restore()
            engine.allocate()
            print(f"resumed mode={info.mode} podIP={info.pod_ip}", flush=True)
        ready, _, _ = select.select([s for s in (srv, api) if s is not None], [], [], 0.02)
        for s in ready:
            conn, _ = s.accept()
            with conn:
                if s is api:
                    vllm_api(conn, state, engine.free, engine.allocate)
                elif not state["asleep"]:
                    conn.sendall((engine.infer() + "\n").encode())


def listen(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    return s


def vllm_api(conn: socket.socket, state: dict, free, allocate) -> None:
    """One request of vLLM's sleep-mode API, with its answers (on the main thread: the GPU
    work must be)."""
    conn.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 8192:
        chunk = conn.recv(4096)
        if not chunk:
            return
        head += chunk
    method, path = [*head.split(b"\r\n", 1)[0].decode().split(" "), "", ""][:2]
    status, body = 200, {}
    if method == "GET" and path == "/is_sleeping":
        body = {"is_sleeping": state["asleep"]}
    elif method == "POST" and path.startswith("/sleep"):
        if not state["asleep"]:
            free()
            state["asleep"] = True
    elif method == "POST" and path == "/wake_up":
        if state["asleep"]:
            allocate()
            state["asleep"] = False
            print("woken through the API", flush=True)
    else:
        status, body = 404, {"detail": "Not Found"}
    data = json.dumps(body).encode()
    reason = "OK" if status == 200 else "Not Found"
    conn.sendall(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )


if __name__ == "__main__":
    main()
