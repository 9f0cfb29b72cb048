"""Ragged prompts → one right-padded, bucketed array (SPEC §4: fixed shapes, ragged batch).

Row b holds its prompt at indices 0 … lengths[b]−1 (logical positions equal indices) and `pad_id`
after. The padded width is the longest prompt rounded up to a multiple of `bucket`, so prompts of
similar length share one compiled program.
"""
from __future__ import annotations

import numpy as np


def bucket_length(n: int, bucket: int) -> int:
    """Smallest multiple of `bucket` that is ≥ n (and ≥ bucket)."""
    return max(bucket, -(-n // bucket) * bucket)


def pad_prompts(prompts, bucket: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """list of B token-id lists → (tokens np.int32 [B, P], lengths np.int32 [B]), P a multiple of bucket."""
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    width = bucket_length(int(lengths.max()), bucket)
    tokens = np.full((len(prompts), width), pad_id, np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = np.asarray(p, np.int32)
    return tokens, lengths
