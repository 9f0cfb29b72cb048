"""Autoregressive baseline (docs/algorithms.md §4): prefill + one `lax.while_loop` decode over a static KV cache.

Ragged prompts: row b's prompt occupies indices 0 … len_b−1 of the padded window; prefill commits only
those rows, so each cache row has its own length and each row decodes at its own positions
(len_b + i for the i-th new token). A row stops at its first EOS; the loop stops when every row has
stopped or `max_new_tokens` are generated. `run_uncached` recomputes the whole sequence each step
(same outputs; a baseline for the benchmark and a reference). The mode, `AR()`, has no knobs of its own.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..nn import kv_cache
from .. import model as model_lib
from .config import GenerationConfig
from .decoder import Decoder
from .decoding import add_presence, finish, initial_presence, logprobs_of, prefill, sampler, special_ids
from .mode import Mode

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class AR(Mode):
    """The autoregressive baseline: the shared sampling knobs only."""

    name = "ar"
    label = "AR"

    def short(self) -> str:
        return ""


def run(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
        debug: bool = False, knobs: AR | None = None) -> dict:
    """AR decode. tokens int32 [B, P] right-padded, lengths [B]. Returns {'tokens' [B, G], 'lengths',
    'logprobs' [B, G] (`decoding.logprobs_of` each token, 0 where none), 'num_forward_passes' [B],
    'loop_passes'} (+ 'trace': {'logits' [G, B, V]} — the logits each token was sampled from — when
    debug)."""
    b, p = tokens.shape
    g = gcfg.max_new_tokens
    eos, pad = special_ids(config, gcfg)
    draw = sampler(config, gcfg)
    stop = eos is not None and gcfg.stop_at_eos
    logits, cache = prefill(params, config, tokens, lengths, p + g, gcfg.kv_cache_dtype)

    def take(s, logits):
        """Token i of every active row, sampled from `logits` (the pass over token i − 1, or the prefill's)."""
        i = s["i"]
        active = ~s["done"]
        tok = jnp.where(active, draw(jax.random.fold_in(key, i), logits, s["presence"]), pad)
        new = dict(s, i=i + 1, tok=tok, out=s["out"].at[:, i].set(tok),
                   logprobs=s["logprobs"].at[:, i].set(jnp.where(active, logprobs_of(config, gcfg, logits, tok), 0.0)),
                   done=s["done"] | (active & (tok == eos)) if stop else s["done"],
                   generated=s["generated"] + active, presence=add_presence(s["presence"], tok[:, None], active[:, None]))
        if debug:
            new["trace"] = s["trace"].at[i].set(logits)
        return new

    state = dict(i=jnp.int32(0), cache=cache, tok=jnp.full((b,), pad, jnp.int32), out=jnp.full((b, g), pad, jnp.int32),
                 logprobs=jnp.zeros((b, g), jnp.float32), done=jnp.zeros((b,), bool), generated=jnp.zeros((b,), jnp.int32),
                 nfe=jnp.ones((b,), jnp.int32), passes=jnp.int32(1),
                 presence=initial_presence(tokens, lengths, config.vocab_size, gcfg))
    if debug:
        state["trace"] = jnp.zeros((g, b, config.vocab_size), jnp.float32)

    def cond(s):
        return (s["i"] < g) & jnp.any(~s["done"])

    # Each step is the pass over the last token, then the next token: no pass after the last one, and no
    # `lax.cond` in the body (XLA hoists no loop-invariant work, e.g. a CPU's f32 copy of bf16 weights, out of
    # a conditional, so a step under one redoes it).
    def body(s):
        live = ~s["done"]
        lg, kv = model_lib.apply(params, config, s["tok"][:, None], (lengths + s["i"] - 1)[:, None], cache=s["cache"])
        s = dict(s, cache=kv_cache.commit(s["cache"], kv, live[:, None]), nfe=s["nfe"] + live, passes=s["passes"] + 1)
        return take(s, lg[:, 0])

    s = jax.lax.while_loop(cond, body, take(state, logits))
    out, out_lengths = finish(s["out"], s["generated"], eos, gcfg, pad)
    result = dict(tokens=out, lengths=out_lengths, logprobs=s["logprobs"], num_forward_passes=s["nfe"],
                  loop_passes=s["passes"])
    if debug:
        result["trace"] = {"logits": s["trace"]}
    return result


def run_uncached(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
                 debug: bool = False, knobs: AR | None = None) -> dict:
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
    state = dict(i=jnp.int32(0), buf=buf, out=jnp.full((b, g), pad, jnp.int32),
                 logprobs=jnp.zeros((b, g), jnp.float32), done=jnp.zeros((b,), bool),
                 generated=jnp.zeros((b,), jnp.int32), nfe=jnp.zeros((b,), jnp.int32),
                 presence=initial_presence(tokens, lengths, config.vocab_size, gcfg))

    def cond(s):
        return (s["i"] < g) & jnp.any(~s["done"])

    def body(s):
        i = s["i"]
        active = ~s["done"]
        valid = jnp.arange(total)[None, :] < (lengths + i)[:, None]
        logits, _ = model_lib.apply(params, config, s["buf"], positions, segment_ids=valid.astype(jnp.int32))
        last = logits[rows, lengths + i - 1]
        tok = jnp.where(active, draw(jax.random.fold_in(key, i), last, s["presence"]), pad)
        buf = s["buf"].at[rows, lengths + i].set(tok)
        done = s["done"] | (active & (tok == eos)) if stop else s["done"]
        logprobs = s["logprobs"].at[:, i].set(jnp.where(active, logprobs_of(config, gcfg, last, tok), 0.0))
        return dict(i=i + 1, buf=buf, out=s["out"].at[:, i].set(tok), logprobs=logprobs, done=done,
                    generated=s["generated"] + active, nfe=s["nfe"] + active,
                    presence=add_presence(s["presence"], tok[:, None], active[:, None]))

    s = jax.lax.while_loop(cond, body, state)
    out, out_lengths = finish(s["out"], s["generated"], eos, gcfg, pad)
    return dict(tokens=out, lengths=out_lengths, logprobs=s["logprobs"], num_forward_passes=s["nfe"],
                loop_passes=s["i"])


DECODER = Decoder(run)
UNCACHED = Decoder(run_uncached)  # generate(..., use_cache=False)
AR.decoder = DECODER
