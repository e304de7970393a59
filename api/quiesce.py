"""How a workload is quiesced before its checkpoint and woken after (a PodSnapshot's
``spec.quiesce``, recorded in the manifest, so signed): the handshake files (api/handshake.py,
the default), nothing, or a stock engine's own HTTP API on the pod's loopback."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Engine(StrEnum):
    HANDSHAKE = "handshake"  # the workload (or an adapter beside it) answers the files
    NONE = "none"  # frozen as it is
    VLLM = "vllm"  # POST /sleep?level=1, GET /is_sleeping; POST /wake_up
    SGLANG = "sglang"  # /pause_generation, /release_memory_occupation; and back
    TRTLLM = "tensorrt-llm"  # drained: no request running or queued (GET /metrics)


#: the port each engine serves on by default (its own documentation's)
DEFAULT_PORTS = {Engine.VLLM: 8000, Engine.SGLANG: 30000, Engine.TRTLLM: 8000}


class Quiesce(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    engine: Engine = Engine.HANDSHAKE
    #: the engine's HTTP port inside the pod (its default when unset)
    port: int | None = Field(default=None, ge=1, le=65535)
    #: how long quiescing (and waking, after a restore) may take
    timeout_seconds: int = Field(default=300, ge=1, le=3600)

    @property
    def over_http(self) -> bool:
        return self.engine in DEFAULT_PORTS

    @property
    def engine_port(self) -> int:
        return self.port or DEFAULT_PORTS.get(self.engine, 0)
