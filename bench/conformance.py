"""CRI conformance: runs critest (built from cri-tools) against a private containerd twice,
with runtime handler ``runc`` and with ``snapshot``, and compares the results. Every test
that passes under runc must pass under snapshot.

    python -m bench.conformance [--out bench/results] [--focus REGEX]

Images are served by devnode's loopback registry (our busybox under every name), so tests
that need particular images (nginx, images with set users or digests) fail under both
handlers alike; the comparison is what counts.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

from devnode.containerd import Containerd
from devnode.cri import TOOLS_BIN

DEFAULT_IMAGE = "registry.k8s.io/e2e-test-images/busybox:1.29-2"


def run_critest(
    node: Containerd, handler: str, report_dir: Path, focus: str | None, seed: int
) -> dict:
    images = report_dir / "test-images.yaml"
    images.write_text(
        f"defaultTestContainerImage: {DEFAULT_IMAGE}\nwebServerTestImage: {DEFAULT_IMAGE}\n"
    )
    cmd = [
        str(TOOLS_BIN / "critest"),
        f"-runtime-endpoint=unix://{node.address}",
        f"-image-endpoint=unix://{node.address}",
        f"-runtime-handler={handler}",
        f"-test-images-file={images}",
        f"-ginkgo.junit-report={report_dir / (handler + '.xml')}",
        "-ginkgo.no-color",
        "-ginkgo.timeout=25m",
        "-ginkgo.v",
        f"-ginkgo.seed={seed}",
        # a spec stuck for a minute prints where it waits (the log is written as it runs)
        "-ginkgo.poll-progress-after=60s",
        "-ginkgo.poll-progress-interval=60s",
    ]
    if focus:
        cmd.append(f"-ginkgo.focus={focus}")
    t0 = time.monotonic()
    with (report_dir / f"{handler}.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    results: dict[str, str] = {}
    for xml in report_dir.glob(f"{handler}.xml"):
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "")
            if case.find("skipped") is not None:
                results[name] = "skipped"
            elif case.find("failure") is not None or case.find("error") is not None:
                results[name] = "failed"
            else:
                results[name] = "passed"
    counts = {
        k: sum(1 for v in results.values() if v == k) for k in ("passed", "failed", "skipped")
    }
    return {"counts": counts, "seconds": round(time.monotonic() - t0, 1), "results": results}


def compare(res: dict, seed: int) -> dict:
    """One containerd line's summary: counts per handler, and which tests pass under runc
    but not under snapshot (the regressions; there must be none)."""
    regressions = sorted(
        n
        for n, v in res["runc"]["results"].items()
        if v == "passed" and res["snapshot"]["results"].get(n) != "passed"
    )
    return {
        "ginkgo_seed": seed,
        "runc": res["runc"]["counts"] | {"seconds": res["runc"]["seconds"]},
        "snapshot": res["snapshot"]["counts"] | {"seconds": res["snapshot"]["seconds"]},
        "passed_under_runc_not_snapshot": regressions,
        "failed_under_both": sorted(
            n
            for n, v in res["runc"]["results"].items()
            if v == "failed" and res["snapshot"]["results"].get(n) == "failed"
        ),
    }


def run_line(major: int, handlers: list[str], report_dir: Path, focus: str | None) -> tuple:
    # Each handler gets a fresh node and the same spec order: the image tests see which
    # names share an image (the loopback registry serves busybox under every name), so
    # images left by the first run, or another order, would change their outcome.
    seed = random.randrange(1, 1 << 30)
    res, version = {}, ""
    for h in handlers:
        node = Containerd(
            Path(f"/tmp/snapshot-conf-{uuid.uuid4().hex[:6]}"),
            bin_dirs=[str(Path(sys.executable).parent)],
            major=major,
        )
        try:
            node.start()
            version = node.ctr("version").stdout.split("Server:")[-1].split()[1]
            res[h] = run_critest(node, h, report_dir, focus, seed)
        finally:
            node.stop()
    return version, seed, res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--focus")
    ap.add_argument(
        "--handler",
        action="append",
        choices=["runc", "snapshot"],
        help="run only this handler (repeatable); comparing needs both",
    )
    ap.add_argument(
        "--containerd",
        action="append",
        type=int,
        choices=[1, 2],
        help="containerd 1.7 or 2.x (repeatable; default both)",
    )
    args = ap.parse_args()
    handlers = args.handler or ["runc", "snapshot"]
    report_dir = Path(args.out).absolute() / "conformance"
    report_dir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "conformance.json"
    summary = json.loads(out.read_text()) if out.exists() else {}
    summary.update(
        critest="v1.37.0", command=" ".join(["python -m bench.conformance", *sys.argv[1:]])
    )
    lines = summary.setdefault("containerd", {})
    failed = False
    for major in args.containerd or [1, 2]:
        version, seed, res = run_line(major, handlers, report_dir, args.focus)
        if len(res) == 1:
            ((h, r),) = res.items()
            print(
                json.dumps(
                    {
                        version: {
                            h: r["counts"],
                            "failed": sorted(n for n, v in r["results"].items() if v == "failed"),
                        }
                    },
                    indent=2,
                )
            )
            continue
        lines[version] = compare(res, seed)
        failed |= bool(lines[version]["passed_under_runc_not_snapshot"])
        print(
            json.dumps(
                {version: {k: v for k, v in lines[version].items() if k != "failed_under_both"}},
                indent=2,
            )
        )
    out.write_text(json.dumps(summary, indent=2) + "\n")
    for f in report_dir.glob("*.xml"):
        f.unlink()  # the per-test XML is large; the summary and logs are kept
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
