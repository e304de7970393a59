"""The restore curve over model sizes, from one machine session's shim results
(``bench/gpu/run-sizes.sh`` with SHIM_ONLY=1, each size's gpu-shim-proof-<size>[-<sleep
mode>].json): a markdown table on stdout and a plot of restore time by phase against
checkpoint size, one bar per sleep mode of the stand-in.

    .venv/bin/python -m bench.gpu.curve bench/results/gpu-curve ["plot title"]
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
        if not d.get("restores"):
            continue  # a run cut short: its JSON says where
        in_pod = d.get("restores_in_pod", [])
        best = min(d["restores"] + in_pod, key=lambda r: r["first_response_s"])
        t, fill = best["report"]["timings"], best["report"].get("fillBytes") or 0
        out.append(
            {
                "params_b": d["model"]["params"] / 1e9,
                "sleep": d["model"].get("sleep", "-"),
                "in_pod": [r["first_response_s"] for r in in_pod],
                "wake_s": best.get("wake_s"),
                "sleep_s": d["checkpoint"].get("sleep_s"),
                "gb": d["checkpoint"]["artifact_bytes"] / 1e9,
                "cold": d["cold_start_s"],
                "checkpoint": d["checkpoint"]["seconds"],
                "ckpt_cuda": d["checkpoint"]["phases"]["cuda"],
                "ckpt_criu": d["checkpoint"]["phases"]["criu"],
                "first": [r["first_response_s"] for r in d["restores"]],
                "identical": all(r["identical"] for r in d["restores"] + in_pod),
                "phases": {p: t.get(p, 0.0) for p in PHASES},
                "total": t["total"],
                "fill_gb_s": fill / 1e9 / t["fill"] if t.get("fill") else 0.0,
            }
        )
    return sorted(out, key=lambda r: (r["params_b"], MODES.get(r["sleep"], 9)))


#: the stand-in's sleep modes in the order they are shown (bench/gpu/sleep.py)
MODES = {"gpu": 0, "pinned": 1, "pageable": 2}


def table(rs: list[dict]) -> str:
    lines = [
        "| parameters | weights asleep | artifact GB | cold s | restore s, in a pod | "
        "restore s, `ctr run` | speed-up | CRIU s | fill s (GB/s) | CUDA s | wake s | "
        "artifact GB / first answer s | checkpoint s (CUDA, CRIU, sleep) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def spread(xs: list[float]) -> str:
        return "-".join(f"{x:.2f}" for x in sorted({min(xs), max(xs)})) if xs else "-"

    for r in rs:
        first = min(r["in_pod"] or r["first"])
        p = r["phases"]
        wake = r["wake_s"] if r["wake_s"] is not None else p["wake"]
        sleep = f", {r['sleep_s']:.1f}" if r["sleep_s"] is not None else ""
        lines.append(
            f"| {r['params_b']:.2f} B | {r['sleep']} | {r['gb']:.1f} | {r['cold']:.1f} | "
            f"{spread(r['in_pod'])} | {spread(r['first'])} | {r['cold'] / first:.1f}x | "
            f"{p['criu']:.2f} | {p['fill']:.2f} ({r['fill_gb_s']:.1f}) | {p['cuda']:.2f} | "
            f"{wake:.2f} | {r['gb'] / first:.1f} | {r['checkpoint']:.1f} "
            f"({r['ckpt_cuda']:.1f}, {r['ckpt_criu']:.1f}{sleep}) |"
        )
    return "\n".join(lines)


def plot(rs: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({round(r["params_b"], 2) for r in rs})
    modes = sorted({r["sleep"] for r in rs}, key=lambda m: MODES.get(m, 9))
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = dict(zip(PHASES, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    labelled: set[str] = set()
    for r in rs:
        x = (
            sizes.index(round(r["params_b"], 2))
            + (modes.index(r["sleep"]) - (len(modes) - 1) / 2) * width
        )
        bottom = 0.0
        for phase in PHASES:
            y = r["phases"][phase] if phase != "wake" else (r["wake_s"] or r["phases"]["wake"])
            if y:
                ax.bar(x, y, width * 0.9, bottom=bottom, color=colors[phase],
                       label=None if phase in labelled else phase)  # fmt: skip
                labelled.add(phase)
                bottom += y
        first = min(r["in_pod"] or r["first"])
        ax.plot([x], [first], "k_", markersize=12)
        ax.annotate(f"{r['sleep']}\n{first:.1f} s", (x, max(first, bottom)),
                    textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)  # fmt: skip
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the labels
    ax.set_xticks(range(len(sizes)), [f"{s:.2f} B" for s in sizes])
    ax.set_xlabel("parameters (weights asleep: on the GPU, pinned or pageable host memory)")
    ax.set_ylabel("restore, s (bars: phases; dash: first correct answer)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "bench/results/gpu-curve")
    title = argv[1] if len(argv) > 1 else "Restore through containerd and the shim, one H100"
    rs = rows(folder)
    print(table(rs))
    plot(rs, folder / "curve.png", title)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
