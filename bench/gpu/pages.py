"""What a checkpoint's memory is made of, for the page-restore figures: per kind of mapping
(private anonymous, private file, shared), the bytes CRIU restores and how many of them are
whole zero pages (which a restore need not copy: a fresh private anonymous page reads as
zero).

    python bench/gpu/pages.py ARTIFACT_DIR      # prints the JSON

Reads CRIU's images with pycriu; finds zero pages as the engine's checkpoint does
(restore_runtime/criu/sparse.py)."""

from __future__ import annotations

import json
import mmap
import sys
from pathlib import Path

from restore_runtime.criu.sparse import PAGE, PE_PRESENT, VMA_ANON_PRIVATE, mark_zero

#: VMA status bits (CRIU's criu/include/image.h)
KINDS = {
    VMA_ANON_PRIVATE: "anon-private",
    1 << 6: "file-private",
    1 << 7: "file-shared",
    1 << 8: "anon-shared",
}


def _kind(vmas: list[dict], addr: int) -> str:
    for v in vmas:
        if v["start"] <= addr < v["end"]:
            return next((k for bit, k in KINDS.items() if v["status"] & bit), "other")
    return "no-vma"


def stats(criu_dir: Path) -> dict:
    from pycriu import images

    def load(name: str) -> list[dict]:
        with open(criu_dir / name, "rb") as f:
            return images.load(f, pretty=False)["entries"]

    kinds: dict[str, dict[str, int]] = {}
    for mm in sorted(criu_dir.glob("mm-*.img")):
        pid = mm.name[3:-4]
        vmas = load(mm.name)[0]["vmas"]
        entries = load(f"pagemap-{pid}.img")
        pages = criu_dir / f"pages-{entries[0]['pages_id']}.img"
        if not pages.stat().st_size:
            continue
        with open(pages, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            at = 0
            for e in entries[1:]:
                if not e.get("flags", 0) & PE_PRESENT:
                    continue
                n = e.get("nr_pages") or e["compat_nr_pages"]
                k = kinds.setdefault(_kind(vmas, e["vaddr"]), {"pages": 0, "zero_pages": 0})
                zero = bytearray(n)
                mark_zero(m, at, n, zero, 0)
                k["pages"] += n
                k["zero_pages"] += zero.count(1)
                at += n
    total = sum(k["pages"] for k in kinds.values())
    zero_anon = kinds.get("anon-private", {}).get("zero_pages", 0)
    return {
        "bytes": total * PAGE,
        "by_kind": {
            k: {"bytes": v["pages"] * PAGE, "zero_bytes": v["zero_pages"] * PAGE}
            for k, v in kinds.items()
        },
        # what eliding private anonymous zero pages would leave to copy
        "zero_anon_private_fraction": round(zero_anon / total, 4) if total else 0.0,
    }


if __name__ == "__main__":
    print(json.dumps(stats(Path(sys.argv[1]) / "criu"), indent=2))
