"""The artifact's memory file (``memory/pages.bin``) and its index (``memory/index.json``).

The pages of large private anonymous mappings are moved out of CRIU's page images at
checkpoint. CRIU restores those mappings empty (the tree stopped); the engine then fills
them from ``pages.bin`` with many threads at once, each chunk hashed against the manifest's
chunk digests in the same pass (restore_runtime/memfill.py). Both files are listed in the
manifest like any other, so the signature covers them. An artifact without them restores
as before.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MEMORY_DIR = "memory"
MEMORY_PAGES = f"{MEMORY_DIR}/pages.bin"
MEMORY_INDEX = f"{MEMORY_DIR}/index.json"
#: the most an index may hold (a GPU worker has a few thousand)
MAX_RANGES = 1_000_000


class MemoryRange(BaseModel):
    """``length`` bytes at ``offset`` of pages.bin belong at ``vaddr`` of process ``pid`` (its
    PID as the images name it: inside the container's PID namespace)."""

    model_config = ConfigDict(extra="forbid")

    pid: int = Field(ge=1)
    vaddr: int = Field(ge=0)
    length: int = Field(gt=0)
    offset: int = Field(ge=0)


class MemoryIndex(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    ranges: list[MemoryRange] = Field(max_length=MAX_RANGES)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes) -> MemoryIndex:
        return cls.model_validate_json(data)
