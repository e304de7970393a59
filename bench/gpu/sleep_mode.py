"""The stand-in's sleep modes as a command line names them (bench/gpu/sleep.py), read
without torch: ``shim_proof.py`` checks them where torch may be absent."""

from __future__ import annotations

import argparse

#: where the weights wait: on the GPU, in pinned or in pageable host memory
MODES = ("gpu", "pinned", "pageable")


def parse(text: str) -> tuple[str, int | None]:
    """``gpu``, ``pinned``, ``pageable`` or ``pageable-N`` (N pinning threads) into (mode,
    N or None)."""
    name, dash, pinners = text.partition("-")
    if name in MODES and not dash:
        return name, None
    if name == "pageable" and pinners.isdigit() and int(pinners) > 0:
        return name, int(pinners)
    raise ValueError(f"sleep mode {text!r}: one of {', '.join(MODES)}, or pageable-N")


def arg(text: str) -> str:
    """An argparse ``type``: the text, once it parses."""
    try:
        parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
