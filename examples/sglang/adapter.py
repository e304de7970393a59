"""SGLang: quiesce = pause generation, then release the KV cache (release_memory_occupation
with tags ["kv_cache"]); the weights and CUDA graphs stay on the GPU and go into the CUDA
checkpoint. resume = resume_memory_occupation, continue generation.

Needs `--enable-memory-saver`. /pause_generation and /continue_generation exist in recent
SGLang versions; where they do not, the calls are skipped (the release itself waits for
running requests).

    python3 -m examples.sglang.adapter [--engine-url http://127.0.0.1:30000] \\
        [--register-url 'http://router:30000/add_worker?url={url}']"""

from __future__ import annotations

import sys
from typing import Any

from examples.engine_adapter import Http, main
from restore_runtime.workload import RestoreComplete

RELEASED = ["kv_cache"]


class SglangEngine:
    name = "sglang"

    def __init__(self, http: Http) -> None:
        self.http = http

    def quiesce(self) -> dict[str, Any]:
        self.http.call("POST", "/pause_generation", body={}, ok_missing=True)
        self.http.call("POST", "/release_memory_occupation", body={"tags": RELEASED})
        return {"released": RELEASED}

    def resume(self, info: RestoreComplete) -> None:
        self.http.call("POST", "/resume_memory_occupation", body={"tags": RELEASED})
        self.http.call("POST", "/continue_generation", body={}, ok_missing=True)


if __name__ == "__main__":
    sys.exit(main(SglangEngine, default_port=30000))
