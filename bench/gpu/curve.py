"""The restore curve over model sizes, from one machine session's shim results
(``bench/gpu/run-sizes.sh`` with SHIM_ONLY=1, each size's gpu-shim-proof-<size>.json): a
markdown table on stdout and a plot of restore time by phase against checkpoint size.

    .venv/bin/python -m bench.gpu.curve bench/results/gpu-curve
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PHASES = ("verify", "setup", "criu", "fill", "cuda", "wake")


def rows(folder: Path) -> list[dict]:
    out = []
    for f in folder.glob("gpu-shim-proof-*.json"):
        d = json.loads(f.read_text())
        best = min(d["restores"], key=lambda r: r["first_response_s"])
        t, fill = best["report"]["timings"], best["report"].get("fillBytes") or 0
        out.append(
            {
                "params_b": d["model"]["params"] / 1e9,
                "gb": d["checkpoint"]["artifact_bytes"] / 1e9,
                "cold": d["cold_start_s"],
                "checkpoint": d["checkpoint"]["seconds"],
                "ckpt_cuda": d["checkpoint"]["phases"]["cuda"],
                "ckpt_criu": d["checkpoint"]["phases"]["criu"],
                "first": [r["first_response_s"] for r in d["restores"]],
                "identical": all(r["identical"] for r in d["restores"]),
                "phases": {p: t.get(p, 0.0) for p in PHASES},
                "total": t["total"],
                "fill_gb_s": fill / 1e9 / t["fill"] if t.get("fill") else 0.0,
            }
        )
    return sorted(out, key=lambda r: r["params_b"])


def table(rs: list[dict]) -> str:
    lines = [
        "| parameters | artifact GB | cold s | restore s (first answer) | speed-up | "
        "CRIU s | fill s (GB/s) | CUDA s | artifact GB / restore s | checkpoint s "
        "(CUDA, CRIU) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rs:
        first = min(r["first"])
        p = r["phases"]
        lines.append(
            f"| {r['params_b']:.2f} B | {r['gb']:.1f} | {r['cold']:.1f} | "
            f"{'-'.join(f'{x:.2f}' for x in sorted(r['first']))} | {r['cold'] / first:.1f}x | "
            f"{p['criu']:.2f} | {p['fill']:.2f} ({r['fill_gb_s']:.1f}) | {p['cuda']:.2f} | "
            f"{r['gb'] / r['total']:.1f} | {r['checkpoint']:.1f} ({r['ckpt_cuda']:.1f}, "
            f"{r['ckpt_criu']:.1f}) |"
        )
    return "\n".join(lines)


def plot(rs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["gb"] for r in rs]
    bottom = [0.0] * len(rs)
    for phase in PHASES:
        ys = [r["phases"][phase] for r in rs]
        if any(ys):
            ax.bar(xs, ys, width=1.2, bottom=bottom, label=phase)
            bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.plot(xs, [min(r["first"]) for r in rs], "k.-", label="first correct answer")
    for r in rs:
        ax.annotate(
            f"{r['params_b']:.1f} B",
            (r["gb"], min(r["first"])),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
        )
    ax.set_xlabel("artifact size, GB")
    ax.set_ylabel("restore, s")
    ax.set_title("Restore through containerd and the shim, one H100")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "bench/results/gpu-curve")
    rs = rows(folder)
    print(table(rs))
    plot(rs, folder / "curve.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
