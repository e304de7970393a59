"""The benchmark table and chart, from every result file in bench/results: bench-cpu.json
(`make bench`, this machine), gpu-shim-proof-*.json (bench/gpu/shim_proof.py: containerd + the
shim on an H200, committed; with its huge-pages trial and replicas at once when it ran them)
and gpu-bench-*.json (bench/gpu/proof.py: snapshotctl on an H200, committed).

    python -m bench.report [--results bench/results]

Writes bench.md (the table in the layout of the published Snapshot table, plus concurrency
and restore phases), bench.json (the same rows) and bench.png (cold start vs restore, and
the slowest of N restores at once)."""

from __future__ import annotations

import argparse
import json
import re
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


PHASES = ("verify", "setup", "criu", "cuda", "wake")


def _gpu_row(
    d: dict, f: Path, path: str, restore_s: float, correct: bool, phases: dict[str, float]
) -> Row:
    """A GPU result's row: the model and checkpoint from ``d``, the restore as given."""
    warm = d.get("cold_start_warm_cache_s")
    return Row(
        model=f"GPT-2-shaped {d['model']['params'] / 1e9:.2f} B (random weights)",
        engine=f"{GPU}, {path}",
        parallelism="1x H200",
        weights_gb=round(d["model"]["params"] * 2 / 1e9, 2),  # bfloat16
        checkpoint_gb=round(d["checkpoint"]["artifact_bytes"] / 1e9, 2),
        checkpoint_s=round(d["checkpoint"]["phases"]["total"], 2),
        cold_start_s=round(d["cold_start_s"], 2),
        cold_start_warm_cache_s=round(warm, 2) if warm else None,
        restore_s=round(restore_s, 2),
        speedup=round(d["cold_start_s"] / restore_s, 1),
        speedup_vs_warm_cache=round(warm / restore_s, 1) if warm else None,
        correct=correct,
        source=f.name,
        restore_phases_s={k: round(v, 2) for k, v in phases.items() if k in PHASES},
    )


def gpu_rows(results: Path) -> list[Row]:
    rows = []
    for f in sorted(results.glob("gpu-bench-*.json"), key=lambda p: _params(p)):
        d = json.loads(f.read_text())
        if d.get("ok"):
            restore = statistics.median(r["first_response_s"] for r in d["restore"])
            rows.append(
                _gpu_row(
                    d,
                    f,
                    "snapshotctl",
                    restore,
                    d["summary"]["all_identical"],
                    d["restore"][0]["phases"],
                )
            )
    return rows


SHIM_PROOF = re.compile(r"^gpu-shim-proof-[\d.]+b\.json$")
GPU = "PyTorch torch.compile + CUDA graphs"


def _shim_results(results: Path) -> list[tuple[Path, dict]]:
    out = []
    for f in sorted(results.glob("gpu-shim-proof-*.json"), key=lambda p: _params(p)):
        d = json.loads(f.read_text())
        if SHIM_PROOF.match(f.name) and d.get("ok"):
            out.append((f, d))
    return out


def shim_rows(results: Path) -> list[Row]:
    """The production path: one row per size, and one more where the huge-pages trial ran."""
    rows = []
    for f, d in _shim_results(results):
        runs = [("", d["restore"])]
        if (thp := d.get("restore_thp_always", {})).get("identical"):
            runs.append((", huge pages always", thp))
        for label, r in runs:
            rows.append(
                _gpu_row(
                    d,
                    f,
                    f"containerd + shim{label}",
                    r["first_response_s"],
                    r["identical"],
                    r["report"]["timings"],
                )
            )
    return rows


def gpu_concurrency(results: Path) -> dict[str, dict[str, float]]:
    """model -> N -> the slowest replica's first answer (s), where replicas were run."""
    out = {}
    for _, d in _shim_results(results):
        rounds = d.get("concurrency", {}).get("rounds", {})
        ok = {n: r["slowest_first_response_s"] for n, r in rounds.items() if r.get("all_identical")}
        if ok:
            out[f"GPT-2-shaped {d['model']['params'] / 1e9:.2f} B, 1x H200"] = ok
    return out


def _params(path: Path) -> int:
    return json.loads(path.read_text()).get("model", {}).get("params", 0)


def cpu_rows(results: Path) -> tuple[list[Row], dict]:
    f = results / "bench-cpu.json"
    if not f.exists():
        return [], {}
    d = json.loads(f.read_text())
    rows = []
    for name, w in d["workloads"].items():
        rows.append(
            Row(
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
            )
        )
    return rows, d


def fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    return f"{v:g}" if isinstance(v, float) else str(v)


def markdown(rows: list[Row], cpu: dict, gpu_n: dict[str, dict[str, float]]) -> str:
    head = [
        "model",
        "engine",
        "parallelism",
        "weights GB",
        "checkpoint GB",
        "checkpoint s",
        "cold start s",
        "cold start, warm compile cache s",
        "restore s",
        "speed-up",
        "speed-up vs warm cache",
        "first answer correct",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r.model,
            r.engine,
            r.parallelism,
            r.weights_gb,
            r.checkpoint_gb,
            r.checkpoint_s,
            r.cold_start_s,
            r.cold_start_warm_cache_s,
            r.restore_s,
            f"{r.speedup:g}x",
            f"{r.speedup_vs_warm_cache:g}x" if r.speedup_vs_warm_cache else None,
            r.correct,
        ]
        out.append("| " + " | ".join(fmt(c) for c in cells) + " |")
    out += [
        "",
        "Restore phases (seconds; the shim's or snapshotctl's report):",
        "",
        "| model, path | verify | setup | criu | cuda | wake |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.restore_phases_s
        path = r.engine.split(", ", 1)[-1]
        cells = " | ".join(fmt(p.get(k)) for k in PHASES)
        out.append(f"| {r.model}, {path} | {cells} |")
    if gpu_n:
        out += [
            "",
            "Replicas restored at once from one artifact on one GPU (containerd + "
            "the shim; seconds to the slowest replica's first bitwise-identical answer):",
            "",
            "| model | N | slowest |",
            "|---|---|---|",
        ]
        for model, curve in gpu_n.items():
            out += [f"| {model} | {n} | {s:g} |" for n, s in curve.items()]
    if cpu:
        out += [
            "",
            "Concurrent restores from one artifact (CPU, pods through containerd; "
            "seconds to the first correct answer, all pods started at once):",
            "",
            "| model | N | slowest | median | fastest |",
            "|---|---|---|---|---|",
        ]
        for w in cpu["workloads"].values():
            for n, c in w["concurrency"].items():
                out.append(
                    f"| {w['description']} | {n} | {c['max']} | {c['median']} | {c['min']} |"
                )
        out += [
            "",
            "CPU spread over the runs (min / median / max, seconds):",
            "",
            "| model | cold start | checkpoint | restore |",
            "|---|---|---|---|",
        ]
        for w in cpu["workloads"].values():
            cells = [w[k] for k in ("cold_start_s", "checkpoint_s", "restore_s")]
            out.append(
                f"| {w['description']} | "
                + " | ".join(f"{c['min']} / {c['median']} / {c['max']}" for c in cells)
                + " |"
            )
    return "\n".join(out) + "\n"


def chart(rows: list[Row], curves: dict[str, dict[str, float]], path: Path) -> None:
    """Cold start vs restore per row; beside it, the slowest of N restores at once."""
    fig, (ax, cx) = plt.subplots(
        1, 2, figsize=(15, 0.9 * len(rows) + 1.5), gridspec_kw={"width_ratios": [3, 1]}
    )
    y = range(len(rows))
    h = 0.27
    ax.barh(
        [i - h for i in y], [r.cold_start_s for r in rows], h, label="cold start", color="#b0b0b0"
    )
    ax.barh(
        list(y),
        [r.cold_start_warm_cache_s or 0 for r in rows],
        h,
        label="cold start, warm compile cache",
        color="#d8d8d8",
    )
    ax.barh(
        [i + h for i in y],
        [r.restore_s for r in rows],
        h,
        label="restore (Snapshot)",
        color="#76b900",
    )
    for i, r in zip(y, rows, strict=True):
        ax.text(r.restore_s, i + h, f"  {r.restore_s:g}s ({r.speedup:g}x)", va="center", fontsize=8)
        ax.text(r.cold_start_s, i - h, f"  {r.cold_start_s:g}s", va="center", fontsize=8)
    ax.set_yticks(list(y), [f"{r.model}\n{r.engine}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds to the first correct response")
    ax.set_title("Cold start vs restore from a snapshot")
    ax.legend(loc="lower right", fontsize=8)
    for label, curve in curves.items():
        ns = [int(n) for n in curve]
        cx.plot(ns, list(curve.values()), marker="o", label=label)
    cx.set_xticks([1, 2, 4])
    cx.set_ylim(bottom=0)
    cx.set_xlabel("restores at once from one artifact")
    cx.set_ylabel("slowest first correct answer, s")
    cx.set_title("Replicas at once")
    cx.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    cpu, cpu_data = cpu_rows(args.results)
    rows = shim_rows(args.results) + gpu_rows(args.results) + cpu
    if not rows:
        raise SystemExit(f"no results in {args.results}: run `make bench` first")
    gpu_n = gpu_concurrency(args.results)
    curves = dict(gpu_n)
    for w in cpu_data.get("workloads", {}).values():
        curves[f"{w['description']}, {cpu_data['machine']['cpus']} vCPU"] = {
            n: c["max"] for n, c in w["concurrency"].items()
        }
    text = markdown(rows, cpu_data, gpu_n)
    (args.results / "bench.md").write_text(text)
    (args.results / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    chart(rows, curves, args.results / "bench.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
