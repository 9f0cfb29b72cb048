"""One decode pass as a program of its own: the unit every decoding mode repeats (docs/algorithms.md §4–§7), for the
device benchmark (cost of a pass against its window size) and the memory plan (`experiments.bench`).

Inside `generate` the KV cache never leaves a mode's compiled `while_loop`, which updates it in place
(`kv_cache.commit` is one scatter into the loop-carried buffer). Here a pass is its own `jax.jit` and
the cache is *donated*: the returned cache reuses the argument's buffers, so a Python loop of passes
holds one cache, not two.

- `window_rows(gcfg)`: the rows of one pass of each mode: AR 1; mode A 2K (`mdm.window_rows`); mode B one
  block (`slotted.block_layout`); Ψ-Spec F (F + 1 with the self drafter: the seed and F masks); fused
  Ψ-Spec (K+1)(K+2) with the self drafter, (K+1)² with the LoRA drafter (`fused.window_rows`).
- `cache_rows(gcfg, prompt_len)`: the rows of the cache each mode allocates.
- `cached_pass(params, cache, tokens, positions, *, config)`: a causal window [B, W] at logical
  `positions` against every committed cache row; returns (logits fp32 [B, W, V], the cache with the
  whole window committed). `decode_pass` is it under `jax.jit` with the cache donated; wrap `cached_pass`
  in your own `jax.jit(..., in_shardings=…, donate_argnames="cache")` to place it on a mesh.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..nn import kv_cache
from .. import model as model_lib
from . import ar, fused, mdm, slotted, spec, spec_model
from .config import GenerationConfig

Array = jax.Array


SPECULATIVE = (spec.TwoPass, spec_model.SpecModel, fused.Fused)  # a cache with Ψ-Spec's slack rows


def window_rows(gcfg: GenerationConfig) -> int:
    mode = gcfg.mode
    if isinstance(mode, ar.AR):
        return 1
    if isinstance(mode, mdm.MDM):
        return 2 * mdm.window_rows(gcfg)
    if isinstance(mode, slotted.Slotted):
        return slotted.block_layout(gcfg)[1]
    if isinstance(mode, fused.Fused):
        return fused.window_rows(gcfg)
    return mode.draft_length + (1 if mode.drafter == "self" else 0)


def cache_rows(gcfg: GenerationConfig, prompt_len: int) -> int:
    if isinstance(gcfg.mode, SPECULATIVE):
        return spec.cache_rows(gcfg, prompt_len)
    return prompt_len + gcfg.max_new_tokens


def cached_pass(params, cache: dict, tokens: Array, positions: Array, *, config) -> tuple[Array, dict]:
    logits, kv = model_lib.apply(params, config, tokens, positions, cache=cache)
    return logits, kv_cache.commit(cache, kv, jnp.ones(tokens.shape, bool))


decode_pass = functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))(cached_pass)
