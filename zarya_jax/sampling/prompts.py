"""Ragged prompts → one right-padded, bucketed array (docs/algorithms.md §4: fixed shapes, ragged batch).

Prompts are a list of token-id sequences (lists or 1-D integer arrays), or one integer array
`[B, L]` of B prompts of L tokens each (`as_prompt_list`).

Row b holds its prompt at indices 0 … lengths[b]−1 (logical positions equal indices) and `pad_id`
after. The padded width is the longest prompt rounded up to a multiple of `bucket`, so prompts of
similar length share one compiled program.
"""
from __future__ import annotations

import numpy as np


def as_prompt_list(prompts):
    """A `[B, L]` NumPy or jax array of ids → its B rows (as a list); anything else is returned as given
    (the list form, validated by `GenerationConfig.validate`). Raises ValueError for an array that is not
    2-D or not of an integer dtype."""
    if not hasattr(prompts, "ndim") or not hasattr(prompts, "dtype"):
        return prompts
    if prompts.ndim != 2 or not np.issubdtype(np.dtype(prompts.dtype), np.integer):
        raise ValueError(f"prompts: an array of ids must be 2-D [B, L] of an integer dtype, got "
                         f"{np.dtype(prompts.dtype).name}{tuple(prompts.shape)}")
    return list(np.asarray(prompts))


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
