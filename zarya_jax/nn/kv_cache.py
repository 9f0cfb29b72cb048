"""Static KV cache `[layers, batch, kv_heads, max_len, head_dim]` with per-row lengths (docs/algorithms.md §4), K/V in
the model's compute dtype or another (`init(..., dtype)`, e.g. bf16 for an fp32 model).

The cache's row order is the *physical* order: rows are appended in commit order, whatever their
logical positions. The model returns a window's K/V; `commit` appends a chosen subset of the window's
rows (in window order) after each row's current length. Rows not kept (mask tokens' K/V, draft rows)
are simply never written, so nothing has to be rolled back.

Layout, for the chips' sake: heads before rows, so each head's `[rows, head_dim]` is the contiguous
matrix attention multiplies (a window of several queries is a matrix product on a TPU, which wants
its operand in that order), and rows a multiple of 16, so that matrix tiles exactly (8 × 128 tiles,
bf16 packed in pairs). `commit` scatters single `head_dim` rows (every other index given), which any
layout serves. With rows first, or rows not a multiple of the tile, the TPU compiler kept the loop-
carried cache in one layout for the scatter and copied the whole cache into the other before every
Ψ-Spec cycle: twice the cache per chip.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..config import ModelConfig

Array = jax.Array
ROW_TILE = 16  # rows are allocated in multiples of this (module doc)


def init(config: ModelConfig, batch: int, max_len: int, dtype: str = "auto") -> dict:
    """An empty cache of at least `max_len` rows (rounded up to `ROW_TILE`; `max_len(cache)` says how many). dtype: of K/V ("auto": the model's compute dtype; "bfloat16" halves an fp32 model's
    cache — the model reads it back in its compute dtype, and `commit` rounds the written rows)."""
    shape = (config.num_layers, batch, config.num_kv_heads, -(-max_len // ROW_TILE) * ROW_TILE, config.head_dim)
    dt = config.jnp_dtype if dtype == "auto" else jnp.dtype(dtype)
    return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt), "length": jnp.zeros((batch,), jnp.int32)}


def nbytes(cache: dict) -> int:
    """Bytes of the K and V buffers (of arrays or of `jax.eval_shape`'s abstract ones)."""
    return sum(cache[k].size * cache[k].dtype.itemsize for k in ("k", "v"))


def max_len(cache: dict) -> int:
    return cache["k"].shape[3]


def of_window(window_kv: tuple[Array, Array]) -> dict:
    """A window's K/V ([layers, b, t, k, q] × 2) as a cache to attend to (a full one: pass a `cache_mask`)."""
    return {name: jnp.swapaxes(x, 2, 3) for name, x in zip(("k", "v"), window_kv)}


def rows(cache: dict, i: int, n: int) -> tuple[Array, Array]:
    """The first n rows of batch row i as a window holds them: (K, V), each [layers, n, kv_heads, head_dim]."""
    return tuple(jnp.swapaxes(cache[name][:, i, :, :n], 1, 2) for name in ("k", "v"))


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

    layers, b, heads = cache["k"].shape[:3]
    at = (jnp.arange(layers)[:, None, None, None], jnp.arange(b)[None, :, None, None],
          jnp.arange(heads)[None, None, :, None], index[None, :, None, :])

    def write(buf, win):  # buf [layers, b, k, s, q] at [layer, row, head, index] ← win [layers, b, t, k, q]
        return buf.at[at].set(jnp.swapaxes(win, 2, 3).astype(buf.dtype), mode="drop")

    return {"k": write(cache["k"], k_win), "v": write(cache["v"], v_win),
            "length": cache["length"] + keep.sum(axis=1).astype(jnp.int32)}

