"""TensorRT-LLM (trtllm-serve): it has no call to free GPU memory, so its state stays resident
and goes whole into the CUDA checkpoint. quiesce = stop being routed to (the readiness file
that the pod's readiness probe checks goes away) and wait until no request is in flight;
resume = the readiness file comes back.

    python3 -m examples.tensorrt_llm.adapter [--engine-url http://127.0.0.1:8000]"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from examples.engine_adapter import Http, main
from restore_runtime.workload import RestoreComplete

# The example Deployment's readinessProbe: `test -f /tmp/snapshot-serving && curl /health`.
SERVING_FLAG = Path(os.environ.get("SNAPSHOT_SERVING_FLAG", "/tmp/snapshot-serving"))


class TrtllmEngine:
    name = "tensorrt-llm"

    def __init__(self, http: Http, serving_flag: Path = SERVING_FLAG) -> None:
        self.http = http
        self.flag = serving_flag
        self.flag.touch()

    def in_flight(self) -> int:
        # trtllm-serve's /metrics: a JSON list of iteration stats, newest last
        stats = self.http.call("GET", "/metrics") or []
        last = stats[-1] if isinstance(stats, list) and stats else {}
        return int(last.get("numActiveRequests", 0)) + int(last.get("numQueuedRequests", 0))

    def quiesce(self) -> dict[str, Any]:
        self.flag.unlink(missing_ok=True)
        self.http.wait_until(lambda: self.in_flight() == 0, "in-flight requests to finish")
        return {"resident": True}

    def resume(self, info: RestoreComplete) -> None:
        self.http.call("GET", "/health")
        self.flag.touch()


if __name__ == "__main__":
    sys.exit(main(TrtllmEngine, default_port=8000))
