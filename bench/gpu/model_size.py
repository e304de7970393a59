"""The parameter count of bench/gpu/worker.py's model, from its shape (no torch needed)."""

from __future__ import annotations

VOCAB, POSITIONS = 50257, 1024  # as worker.py builds it


def gpt_params(layers: int, width: int, vocab: int = VOCAB, positions: int = POSITIONS) -> int:
    """Embeddings (tied output) + per block 12 d^2 + 13 d (qkv, proj, fc, out with biases,
    two LayerNorms) + the final LayerNorm."""
    return (vocab + positions) * width + layers * (12 * width * width + 13 * width) + 2 * width
