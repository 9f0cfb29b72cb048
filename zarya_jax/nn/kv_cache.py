"""Static KV cache `[layers, batch, max_len, kv_heads, head_dim]` with per-row lengths (docs/algorithms.md §4), K/V in
the model's compute dtype or another (`init(..., dtype)`, e.g. bf16 for an fp32 model).

The cache's row order is the *physical* order: rows are appended in commit order, whatever their
logical positions. The model returns a window's K/V; `commit` appends a chosen subset of the window's
rows (in window order) after each row's current length. Rows not kept (mask tokens' K/V, draft rows)
are simply never written, so nothing has to be rolled back.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..config import ModelConfig

Array = jax.Array


def init(config: ModelConfig, batch: int, max_len: int, dtype: str = "auto") -> dict:
    """An empty cache. dtype: of K/V ("auto": the model's compute dtype; "bfloat16" halves an fp32 model's
    cache — the model reads it back in its compute dtype, and `commit` rounds the written rows)."""
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    dt = config.jnp_dtype if dtype == "auto" else jnp.dtype(dtype)
    return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt), "length": jnp.zeros((batch,), jnp.int32)}


def nbytes(cache: dict) -> int:
    """Bytes of the K and V buffers (of arrays or of `jax.eval_shape`'s abstract ones)."""
    return sum(cache[k].size * cache[k].dtype.itemsize for k in ("k", "v"))


def max_len(cache: dict) -> int:
    return cache["k"].shape[2]


def commit(cache: dict, window_kv: tuple[Array, Array], keep: Array) -> dict:
    """Appends the kept window rows. window_kv: ([layers, b, t, k, q], same); keep bool [b, t].

    Kept rows land contiguously at `length, length+1, …` in window order; rows past the cache's end
    are dropped (callers size the cache so this never happens).
    """
    k_win, v_win = window_kv
    s = max_len(cache)
    keep = keep.astype(bool)
    slot = cache["length"][:, None] + jnp.cumsum(keep, axis=1) - 1
    index = jnp.where(keep, slot, s)  # out of range → dropped

    rows = jnp.arange(keep.shape[0])[:, None]

    def write(buf, win):  # buf [layers, b, s, k, q], win [layers, b, t, k, q]: one scatter at [·, row, index]
        return buf.at[:, rows, index].set(win.astype(buf.dtype), mode="drop")

    return {"k": write(cache["k"], k_win), "v": write(cache["v"], v_win),
            "length": cache["length"] + keep.sum(axis=1).astype(jnp.int32)}

