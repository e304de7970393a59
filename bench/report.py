"""The benchmark table and chart, from every result file in bench/results: bench-cpu.json
(`make bench`, this machine) and gpu-bench-*.json (bench/gpu/proof.py on an H200, committed).

    python -m bench.report [--results bench/results]

Writes bench.md (the table in the layout of the published Snapshot table, plus concurrency
and restore phases), bench.json (the same rows) and bench.png (cold start vs restore)."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt


@dataclass
class Row:
    model: str
    engine: str
    parallelism: str
    weights_gb: float
    checkpoint_gb: float
    checkpoint_s: float
    cold_start_s: float
    cold_start_warm_cache_s: float | None
    restore_s: float
    speedup: float
    speedup_vs_warm_cache: float | None
    correct: bool
    source: str
    restore_phases_s: dict[str, float]


def gpu_rows(results: Path) -> list[Row]:
    rows = []
    for f in sorted(results.glob("gpu-bench-*.json"), key=lambda p: _params(p)):
        d = json.loads(f.read_text())
        if not d.get("ok"):
            continue
        restore = statistics.median(r["first_response_s"] for r in d["restore"])
        warm = d.get("cold_start_warm_cache_s")
        phases = d["restore"][0]["phases"]
        rows.append(Row(
            model=f"GPT-2-shaped {d['model']['params'] / 1e9:.2f} B (random weights)",
            engine="PyTorch torch.compile + CUDA graphs",
            parallelism="1x H200",
            weights_gb=round(d["model"]["params"] * 2 / 1e9, 2),  # bfloat16
            checkpoint_gb=round(d["checkpoint"]["artifact_bytes"] / 1e9, 2),
            checkpoint_s=round(d["checkpoint"]["phases"]["total"], 2),
            cold_start_s=round(d["cold_start_s"], 2),
            cold_start_warm_cache_s=round(warm, 2) if warm else None,
            restore_s=round(restore, 2),
            speedup=round(d["cold_start_s"] / restore, 1),
            speedup_vs_warm_cache=round(warm / restore, 1) if warm else None,
            correct=d["summary"]["all_identical"],
            source=f.name,
            restore_phases_s={k: round(v, 2) for k, v in phases.items()
                              if k in ("verify", "setup", "criu", "cuda", "wake")},
        ))  # fmt: skip
    return rows


def _params(path: Path) -> int:
    return json.loads(path.read_text()).get("model", {}).get("params", 0)


def cpu_rows(results: Path) -> tuple[list[Row], dict]:
    f = results / "bench-cpu.json"
    if not f.exists():
        return [], {}
    d = json.loads(f.read_text())
    rows = []
    for name, w in d["workloads"].items():
        rows.append(Row(
            model=w["description"],
            engine="scikit-learn (CPU), containerd + shim",
            parallelism=f"1 process, {d['machine']['cpus']} vCPU",
            weights_gb=round(w["weights_bytes"] / 1e9, 3),
            checkpoint_gb=round(w["checkpoint_bytes"] / 1e9, 3),
            checkpoint_s=round(w["checkpoint_s"]["median"], 2),
            cold_start_s=round(w["cold_start_s"]["median"], 2),
            cold_start_warm_cache_s=None,
            restore_s=round(w["restore_s"]["median"], 2),
            speedup=round(w["speedup"], 1),
            speedup_vs_warm_cache=None,
            correct=w["all_correct"],
            source=f"{f.name}:{name}",
            restore_phases_s=w["restore_phases_median_s"],
        ))  # fmt: skip
    return rows, d


def fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    return f"{v:g}" if isinstance(v, float) else str(v)


def markdown(rows: list[Row], cpu: dict) -> str:
    head = ["model", "engine", "parallelism", "weights GB", "checkpoint GB", "checkpoint s",
            "cold start s", "cold start, warm compile cache s", "restore s", "speed-up",
            "speed-up vs warm cache", "first answer correct"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.model, r.engine, r.parallelism, r.weights_gb, r.checkpoint_gb,
                 r.checkpoint_s, r.cold_start_s, r.cold_start_warm_cache_s, r.restore_s,
                 f"{r.speedup:g}x", f"{r.speedup_vs_warm_cache:g}x"
                 if r.speedup_vs_warm_cache else None, r.correct]  # fmt: skip
        out.append("| " + " | ".join(fmt(c) for c in cells) + " |")
    out += ["", "Restore phases (seconds; the shim's or snapshotctl's report):", "",
            "| model | verify | setup | criu | cuda | wake |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        p = r.restore_phases_s
        out.append(f"| {r.model} | " + " | ".join(fmt(p.get(k)) for k in
                                                   ("verify", "setup", "criu", "cuda", "wake"))
                   + " |")  # fmt: skip
    if cpu:
        out += ["", "Concurrent restores from one artifact (CPU, pods through containerd; "
                "seconds to the first correct answer, all pods started at once):", "",
                "| model | N | slowest | median | fastest |", "|---|---|---|---|---|"]  # fmt: skip
        for w in cpu["workloads"].values():
            for n, c in w["concurrency"].items():
                out.append(f"| {w['description']} | {n} | {c['max']} | {c['median']} | "
                           f"{c['min']} |")  # fmt: skip
        out += [
            "",
            "CPU spread over the runs (min / median / max, seconds):",
            "",
            "| model | cold start | checkpoint | restore |",
            "|---|---|---|---|",
        ]
        for w in cpu["workloads"].values():
            cells = [w[k] for k in ("cold_start_s", "checkpoint_s", "restore_s")]
            out.append(f"| {w['description']} | " + " | ".join(
                f"{c['min']} / {c['median']} / {c['max']}" for c in cells) + " |")  # fmt: skip
    return "\n".join(out) + "\n"


def chart(rows: list[Row], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(rows) + 1.5))
    y = range(len(rows))
    h = 0.27
    ax.barh([i - h for i in y], [r.cold_start_s for r in rows], h, label="cold start",
            color="#b0b0b0")  # fmt: skip
    ax.barh(list(y), [r.cold_start_warm_cache_s or 0 for r in rows], h,
            label="cold start, warm compile cache", color="#d8d8d8")  # fmt: skip
    ax.barh([i + h for i in y], [r.restore_s for r in rows], h, label="restore (Snapshot)",
            color="#76b900")  # fmt: skip
    for i, r in zip(y, rows, strict=True):
        ax.text(r.restore_s, i + h, f"  {r.restore_s:g}s ({r.speedup:g}x)", va="center",
                fontsize=8)  # fmt: skip
        ax.text(r.cold_start_s, i - h, f"  {r.cold_start_s:g}s", va="center", fontsize=8)
    ax.set_yticks(list(y), [f"{r.model}\n{r.engine}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the first correct response")
    ax.set_title("Cold start vs restore from a snapshot")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    cpu, cpu_data = cpu_rows(args.results)
    rows = gpu_rows(args.results) + cpu
    if not rows:
        raise SystemExit(f"no results in {args.results}: run `make bench` first")
    (args.results / "bench.md").write_text(markdown(rows, cpu_data))
    (args.results / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    chart(rows, args.results / "bench.png")
    print(markdown(rows, cpu_data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
