"""Restore from the OCI store vs the node's volume (`make bench-oci`): the same artifact,
restored through the real node stack (containerd's CRI, our shim, CRIU), from
- the volume: the artifact in the node's store (hostPath or shared storage);
- OCI, cold: pushed to Debian's docker-registry on loopback, the node cache emptied before
  each restore, so the shim pulls it first (phase ``pull``);
- OCI, warm: the node cache already holds it (a pre-pulled or earlier restore).
Each RUNS times, for the CPU demo's digits forest and the large forest, timed from
RunPodSandbox to the first correct answer. Loopback: the pull figures are the software's
ceiling, not a network's.

    python -m bench.oci_store [--runs 3] [--out bench/results]

Writes bench/results/oci-store.json."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
import uuid

from api.annotations import ARTIFACT
from bench.cpu import WORKLOADS, Bench, arguments, bench_node, spread, write_result
from devnode.containerd import admitted
from devnode.oci_registry import docker_registry
from restore_runtime.artifact import oci
from restore_runtime.artifact.cache import CACHE_DIR

ACCESS = oci.RegistryAccess(plain_http=frozenset({"127.0.0.1"}))


def workload(bench: Bench, registry: str, model: str, runs: int) -> dict:
    _, reference, ctr, _, ctl = bench.cold(model)
    art = bench.node.checkpoint(ctr, f"{model}-{uuid.uuid4().hex[:6]}", control_dir=ctl)
    bench.cleanup()
    size = art.manifest.size_bytes
    t0 = time.monotonic()
    ref = oci.push(
        art.path,
        oci.OciRef.parse(f"oci://{registry}/bench/{model}:{art.path.name}"),
        ACCESS,
        {oci.MANIFEST_DIGEST_KEY: art.digest},
    )
    push_s = time.monotonic() - t0
    pulled = {**admitted(art), ARTIFACT: ref.uri}
    cache_entry = bench.node.store / CACHE_DIR / art.digest.removeprefix("sha256:")
    modes = {
        "volume": (admitted(art), False),
        "oci_cold": (pulled, True),
        "oci_warm": (pulled, False),
    }
    out: dict = {
        "description": WORKLOADS[model],
        "artifact_bytes": size,
        "push_s": round(push_s, 3),
        "push_MBps": round(size / push_s / 1e6, 1),
    }
    correct = []
    for mode, (pod_annotations, empty_cache) in modes.items():
        times, pulls = [], []
        for _ in range(runs):
            if empty_cache:
                shutil.rmtree(cache_entry, ignore_errors=True)
            seconds, ok, report = bench.restore(model, art, reference, annotations=pod_annotations)
            times.append(seconds)
            correct.append(ok)
            if "pull" in report["timings"]:
                pulls.append(report["timings"]["pull"])
            bench.cleanup()
        out[mode] = {"restore_s": spread(times)}
        if pulls:
            pull = statistics.median(pulls)
            out[mode] |= {"pull_s": round(pull, 3), "pull_MBps": round(size / pull / 1e6, 1)}
        print(f"  {model} {mode}: restore {statistics.median(times):.2f}s", flush=True)
    out["all_correct"] = all(correct)
    return out


def main() -> int:
    args = arguments(__doc__)
    with (
        bench_node("bench.oci_store") as (bench, result),
        docker_registry(bench.work / "registry") as reg,
    ):
        for model in args.workload or list(WORKLOADS):
            print(f"{model}: {WORKLOADS[model]}", flush=True)
            result["workloads"][model] = workload(bench, reg.address, model, args.runs)
    write_result(args.out, "oci-store.json", result)
    print(
        json.dumps(
            {
                m: {k: w[k]["restore_s"]["median"] for k in ("volume", "oci_cold", "oci_warm")}
                for m, w in result["workloads"].items()
            }
        )
    )
    return 0 if all(w["all_correct"] for w in result["workloads"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
