"""The pieces every decoding mode shares (docs/algorithms.md §4): the special ids, the prefill pass, the sampler
with the config's knobs, the repetition-penalty bookkeeping, the per-token log-probabilities and the
output assembly. Each mode's loop (`ar`, `mdm`, `slotted`, `spec`) is built from them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..nn import attention, kv_cache
from .. import model as model_lib
from . import primitives
from .config import GenerationConfig

Array = jax.Array


def layer_weights(trees: tuple, layer_loop: str = "auto") -> tuple:
    """The weight trees (params, an adapter, a draft model's params; None passes) as a decode program runs
    them under `GenerationConfig.layer_loop`: split per layer (`model.split_layers`) for "split", and for
    "auto" when the program is for a CPU (`attention.platform()`: the context mesh's, else the default
    backend's); stacked otherwise. Under `jax.jit`, before the decode loop: one copy per call, not per pass."""
    split = layer_loop == "split" or (layer_loop == "auto" and attention.platform() == "cpu")
    return tuple(map(model_lib.split_layers, trees)) if split else trees


def special_ids(config, gcfg: GenerationConfig) -> tuple[int | None, int]:
    """(eos id or None, pad id): EOS from the generation config, else the model's; pad = model pad,
    else EOS, else 0."""
    eos = gcfg.eos_token_id if gcfg.eos_token_id is not None else config.eos_token_id
    pad = config.pad_token_id if config.pad_token_id is not None else (eos if eos is not None else 0)
    return eos, pad


def prefill(params, config, tokens: Array, lengths: Array, cache_len: int, cache_dtype: str = "auto"
            ) -> tuple[Array, dict]:
    """One causal pass over the padded prompts [B, P]; commits the valid rows into a fresh cache of
    `cache_len` rows (K/V in `cache_dtype`, see `kv_cache.init`). Returns (logits of each row's last
    prompt token [B, V], cache)."""
    b, p = tokens.shape
    valid = jnp.arange(p)[None, :] < lengths[:, None]
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    # Causal within the valid rows (segment 1; padding 0): the training mask, so a fused kernel may serve it.
    hidden, kv = model_lib.apply(params, config, tokens, positions, segment_ids=valid.astype(jnp.int32),
                                 return_hidden=True)
    cache = kv_cache.commit(kv_cache.init(config, b, cache_len, cache_dtype), kv, valid)
    # Only the kept rows go through the output projection: [B, V], not [B, P, V] logits.
    return model_lib.lm_head(params, config, hidden[jnp.arange(b), lengths - 1]), cache


def initial_presence(tokens: Array, lengths: Array, vocab: int, gcfg: GenerationConfig) -> Array | None:
    """Repetition-penalty bookkeeping bool [B, V] (None when the penalty is off)."""
    if gcfg.repetition_penalty == 1.0:
        return None
    valid = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return primitives.presence_from(tokens, valid, vocab)


def add_presence(presence: Array | None, tokens: Array, keep: Array) -> Array | None:
    """Marks tokens [B, T] where keep [B, T]."""
    if presence is None:
        return None
    return presence | primitives.presence_from(tokens, keep, presence.shape[-1])


def sampler(config, gcfg: GenerationConfig):
    """key, logits [..., V], presence → ids, with the config's knobs and the mask token banned."""

    def draw(key, logits, presence):
        if presence is not None and logits.ndim == 3:
            presence = presence[:, None, :]
        return primitives.sample(key, logits, gcfg.temperature, gcfg.top_k, gcfg.top_p,
                                 gcfg.repetition_penalty, presence, config.mask_token_id)

    return draw


def logprobs_of(config, gcfg: GenerationConfig, logits: Array, tokens: Array) -> Array:
    """float32 [...]: log p(token) under the AR policy the config samples from — softmax of the
    logits [..., V] at the sampling temperature (1 when greedy) with the mask token banned, before
    top-k / top-p / repetition penalty (`primitives.token_logprob`)."""
    return primitives.token_logprob(logits, tokens, gcfg.temperature or 1.0, config.mask_token_id)


def emit(out: Array, logprobs: Array, g: Array, active: Array, new: Array, count: Array, logits: Array,
         eos: int | None, *, config, gcfg: GenerationConfig):
    """Writes one step's tokens into the output of a multi-token loop: of new int [B, t], the first
    `count` [B], cut after the first EOS (when stopping at EOS) and at the budget, land at offset g [B]
    of each active row of out [B, G]; logits [B, t, V] are the AR logits each token was drawn from (its
    `logprobs_of` goes into logprobs [B, G]). Returns (out, logprobs, g, finished [B]: active rows that
    hit EOS or the budget, written [B, t])."""
    b, t = new.shape
    budget = out.shape[1]
    idx = jnp.arange(t)[None, :]
    hit = jnp.zeros((b,), bool)
    if eos is not None and gcfg.stop_at_eos:
        is_eos = (new == eos) & (idx < count[:, None])
        hit = jnp.any(is_eos, axis=1)
        count = jnp.where(hit, jnp.argmax(is_eos, axis=1) + 1, count)
    count = jnp.minimum(count, budget - g)
    written = (idx < count[:, None]) & active[:, None]
    where = jnp.where(written, g[:, None] + idx, budget)  # out of range → dropped
    scatter = jax.vmap(lambda o, w, v: o.at[w].set(v, mode="drop"))
    out = scatter(out, where, new)
    logprobs = scatter(logprobs, where, logprobs_of(config, gcfg, logits, new))
    g = g + jnp.where(active, count, 0)
    return out, logprobs, g, active & (hit | (g >= budget)), written


def finish(out: Array, generated: Array, eos: int | None, gcfg: GenerationConfig, pad: int):
    """lengths [B] = first EOS + 1 (when stopping at EOS) else `generated`; tokens after it → pad."""
    g = out.shape[1]
    idx = jnp.arange(g)[None, :]
    lengths = generated
    if eos is not None and gcfg.stop_at_eos:
        is_eos = (out == eos) & (idx < generated[:, None])
        lengths = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1) + 1, generated)
    return jnp.where(idx < lengths[:, None], out, pad), lengths.astype(jnp.int32)
