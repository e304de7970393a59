"""vLLM: quiesce = sleep level 1 (the engine stops taking requests, drops the KV cache and
moves the weights to host memory, so the checkpoint holds them in CPU pages and the GPU part
is small); resume = wake_up (weights back to the GPU, KV cache re-allocated).

vLLM serves /sleep, /wake_up and /is_sleeping when started with VLLM_SERVER_DEV_MODE=1 and
--enable-sleep-mode.

    python3 -m examples.vllm.adapter [--engine-url http://127.0.0.1:8000]"""

from __future__ import annotations

import sys
from typing import Any

from examples.engine_adapter import Http, main
from restore_runtime.workload import RestoreComplete

SLEEP_LEVEL = 1  # level 2 would drop the weights, and a restored replica would have none


class VllmEngine:
    name = "vllm"

    def __init__(self, http: Http) -> None:
        self.http = http

    def sleeping(self) -> bool:
        return bool((self.http.call("GET", "/is_sleeping") or {}).get("is_sleeping"))

    def quiesce(self) -> dict[str, Any]:
        self.http.call("POST", "/sleep", params={"level": str(SLEEP_LEVEL)})
        # /sleep may return before the engine core has finished; wait for the state
        self.http.wait_until(self.sleeping, "vLLM to report is_sleeping")
        return {"sleepLevel": SLEEP_LEVEL}

    def resume(self, info: RestoreComplete) -> None:
        self.http.call("POST", "/wake_up")
        self.http.wait_until(lambda: not self.sleeping(), "vLLM to wake up")


if __name__ == "__main__":
    sys.exit(main(VllmEngine, default_port=8000))
