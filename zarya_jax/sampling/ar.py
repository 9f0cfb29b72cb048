"""Autoregressive baseline (SPEC §4): prefill + one `lax.while_loop` decode over a static KV cache.

Ragged prompts: row b's prompt occupies indices 0 … len_b−1 of the padded window; prefill commits only
those rows, so each cache row has its own length and each row decodes at its own positions
(len_b + i for the i-th new token). A row stops at its first EOS; the loop stops when every row has
stopped or `max_new_tokens` are generated. `run_uncached` recomputes the whole sequence each step
(same outputs; a baseline for the benchmark and a reference).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..nn import kv_cache
from ..nn import model as model_lib
from . import primitives
from .config import GenerationConfig
from .decoder import Decoder

Array = jax.Array


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
    logits, kv = model_lib.apply(params, config, tokens, positions, segment_ids=valid.astype(jnp.int32))
    cache = kv_cache.commit(kv_cache.init(config, b, cache_len, cache_dtype), kv, valid)
    return logits[jnp.arange(b), lengths - 1], cache


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


def finish(out: Array, generated: Array, eos: int | None, gcfg: GenerationConfig, pad: int):
    """lengths [B] = first EOS + 1 (when stopping at EOS) else `generated`; tokens after it → pad."""
    g = out.shape[1]
    idx = jnp.arange(g)[None, :]
    lengths = generated
    if eos is not None and gcfg.stop_at_eos:
        is_eos = (out == eos) & (idx < generated[:, None])
        lengths = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1) + 1, generated)
    return jnp.where(idx < lengths[:, None], out, pad), lengths.astype(jnp.int32)


def run(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
        debug: bool = False, dyn: dict | None = None) -> dict:
    """AR decode. tokens int32 [B, P] right-padded, lengths [B]. Returns {'tokens' [B, G], 'lengths',
    'num_forward_passes' [B], 'loop_passes'} (+ 'trace': {'logits' [G, B, V]} — the logits each
    token was sampled from — when debug)."""
    b, p = tokens.shape
    g = gcfg.max_new_tokens
    eos, pad = special_ids(config, gcfg)
    draw = sampler(config, gcfg)
    stop = eos is not None and gcfg.stop_at_eos
    logits, cache = prefill(params, config, tokens, lengths, p + g, gcfg.kv_cache_dtype)
    state = dict(i=jnp.int32(0), cache=cache, logits=logits, out=jnp.full((b, g), pad, jnp.int32),
                 done=jnp.zeros((b,), bool), generated=jnp.zeros((b,), jnp.int32),
                 nfe=jnp.ones((b,), jnp.int32), passes=jnp.int32(1),
                 presence=initial_presence(tokens, lengths, config.vocab_size, gcfg))
    if debug:
        state["trace"] = jnp.zeros((g, b, config.vocab_size), jnp.float32)

    def cond(s):
        return (s["i"] < g) & jnp.any(~s["done"])

    def body(s):
        i = s["i"]
        active = ~s["done"]
        tok = jnp.where(active, draw(jax.random.fold_in(key, i), s["logits"], s["presence"]), pad)
        out = s["out"].at[:, i].set(tok)
        done = s["done"] | (active & (tok == eos)) if stop else s["done"]
        go = (i + 1 < g) & jnp.any(~done)

        def forward(_):
            pos = (lengths + i)[:, None]
            lg, kv = model_lib.apply(params, config, tok[:, None], pos, cache=s["cache"])
            return lg[:, 0], kv_cache.commit(s["cache"], kv, (~done)[:, None])

        logits, cache = jax.lax.cond(go, forward, lambda _: (s["logits"], s["cache"]), None)
        new = dict(i=i + 1, cache=cache, logits=logits, out=out, done=done,
                   generated=s["generated"] + active, nfe=s["nfe"] + (go & ~done),
                   passes=s["passes"] + go, presence=add_presence(s["presence"], tok[:, None], active[:, None]))
        if debug:
            new["trace"] = s["trace"].at[i].set(s["logits"])
        return new

    s = jax.lax.while_loop(cond, body, state)
    out, out_lengths = finish(s["out"], s["generated"], eos, gcfg, pad)
    result = dict(tokens=out, lengths=out_lengths, num_forward_passes=s["nfe"], loop_passes=s["passes"])
    if debug:
        result["trace"] = {"logits": s["trace"]}
    return result


def run_uncached(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
                 debug: bool = False, dyn: dict | None = None) -> dict:
    """AR decode without a KV cache: every step is one causal pass over the whole [B, P + G] buffer.
    Same outputs as `run` (up to float rounding); used as the uncached baseline."""
    b, p = tokens.shape
    g = gcfg.max_new_tokens
    total = p + g
    eos, pad = special_ids(config, gcfg)
    draw = sampler(config, gcfg)
    stop = eos is not None and gcfg.stop_at_eos
    buf = jnp.concatenate([tokens, jnp.full((b, g), pad, jnp.int32)], axis=1)
    positions = jnp.broadcast_to(jnp.arange(total, dtype=jnp.int32), (b, total))
    rows = jnp.arange(b)
    state = dict(i=jnp.int32(0), buf=buf, out=jnp.full((b, g), pad, jnp.int32), done=jnp.zeros((b,), bool),
                 generated=jnp.zeros((b,), jnp.int32), nfe=jnp.zeros((b,), jnp.int32),
                 presence=initial_presence(tokens, lengths, config.vocab_size, gcfg))

    def cond(s):
        return (s["i"] < g) & jnp.any(~s["done"])

    def body(s):
        i = s["i"]
        active = ~s["done"]
        valid = jnp.arange(total)[None, :] < (lengths + i)[:, None]
        logits, _ = model_lib.apply(params, config, s["buf"], positions, segment_ids=valid.astype(jnp.int32))
        tok = jnp.where(active, draw(jax.random.fold_in(key, i), logits[rows, lengths + i - 1], s["presence"]),
                        pad)
        buf = s["buf"].at[rows, lengths + i].set(tok)
        done = s["done"] | (active & (tok == eos)) if stop else s["done"]
        return dict(i=i + 1, buf=buf, out=s["out"].at[:, i].set(tok), done=done,
                    generated=s["generated"] + active, nfe=s["nfe"] + active,
                    presence=add_presence(s["presence"], tok[:, None], active[:, None]))

    s = jax.lax.while_loop(cond, body, state)
    out, out_lengths = finish(s["out"], s["generated"], eos, gcfg, pad)
    return dict(tokens=out, lengths=out_lengths, num_forward_passes=s["nfe"], loop_passes=s["i"])


DECODER = Decoder(run)
UNCACHED = Decoder(run_uncached)
