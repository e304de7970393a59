"""``make cluster-smoke``'s summary: the table of what tests/test_cluster_story.py measured,
then, as the last line, one JSON object (kubelet_version, containerd_version, restored_pods,
fallback_ok, restore_s)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "cluster-smoke.json"
KEYS = ("kubelet_version", "containerd_version", "restored_pods", "fallback_ok", "restore_s")
LABELS = {
    "kubelet_version": "kubelet",
    "containerd_version": "containerd",
    "restored_pods": "Deployment pods restored (of 2)",
    "fallback_ok": "tampered artifact: cold start + reason",
    "restore_s": "Deployment applied -> first answer (s)",
}


def main(path: Path = RESULTS) -> int:
    figures = json.loads(path.read_text())
    missing = [k for k in KEYS if k not in figures]
    if missing:
        print(f"{path}: no {', '.join(missing)}: the story did not finish", file=sys.stderr)
        return 1
    print("Snapshot on a real node: helm + kubectl, kubelet + containerd 2.x + the shim")
    for k in KEYS:
        print(f"  {LABELS[k]:42} {figures[k]!s:>12}")
    print(json.dumps({k: figures[k] for k in KEYS}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
