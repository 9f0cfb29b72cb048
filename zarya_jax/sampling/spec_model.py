"""Classic speculative sampling with an independent draft model (docs/algorithms.md §7.6): mode "spec-model".

The baseline Uno and Zarya's self-drafting are compared with: a separate small Qwen3 (its own params,
its own `ModelConfig` with the base's vocabulary and special ids, its own static KV cache) drafts F
tokens one at a time, and one AR pass of the base verifies them by the rule of Ψ-Spec
(`spec.accept_drafts`), so the output distribution is exactly the AR model's.

One cycle, per batch row, with the committed text ending in `prev, seed` (seed at logical position
n−1); the base cache holds the text except the seed, the draft cache the text except `prev, seed`:
1. Draft: F forwards of the draft model against its cache, each committing its own K/V (so the next
   one sees it). The first is the window `[prev, seed]` at n−2, n−1 (in the first cycle the prefill
   already holds `prev`: that row is masked out and not committed); its seed row gives q_1. Forward j
   (j = 1 … F−1) feeds d_j at n+j−1 and gives q_{j+1}. q_j is built by the same rule as the AR
   sampler's (temperature / top-k / top-p / repetition penalty over the text so far and d_1 … d_{j−1},
   `spec.target`), and d_j is drawn from it by the mode's `proposal` (`spec.proposal`: d_j ~ q_j,
   argmax q_j, or tempered q_j), so the drafts fed forward are the proposed ones.
2. Verify: the base over `[seed, d_1 … d_F]` at n−1 … n+F−1 against its cache: row i gives p_{i+1},
   the AR distribution of position n+i (row F: the bonus position).
3. `spec.accept_drafts`: d_j accepted left to right with probability min(1, p_j(d_j)/q_j(d_j)), q_j the
   distribution d_j was drawn from; at the first rejection a correction ~ normalize(max(0, p_j − q_j));
   if all F pass, a bonus ~ p_{F+1}.
   Greedy: accept iff d_j = argmax p_j; the correction/bonus is argmax p.
4. Commit: the base keeps the verify rows of `seed, d_1 … d_m` (AR K/V, computed against the cache);
   the draft cache's length is cut back to the new text minus its last two tokens (its rows are at
   their logical positions, and everything before the new `prev` was committed during the draft), so
   rejected drafts are simply forgotten. The correction/bonus is the next seed, d_m (or the seed) the
   next `prev`.
The draft cache lags one token behind the base's so that a cycle that accepts all F drafts needs no
extra draft forward: d_F's K/V, never computed, is the next cycle's `prev` row.

Each emitted token's AR logits are a verify row (d_j: row j−1, the correction/bonus: row m), so its
log-probability under the AR policy (`decoding.logprobs_of`) costs nothing.

Fixed shapes, one `lax.while_loop` inside one jit (the draft steps a `lax.scan`); finished rows stop
committing. Statistics (`spec.summarize`): `accepted_per_cycle` (mean m, of F), `tokens_per_cycle`
(mean m+1), `tokens_per_forward` (generated tokens / base decode passes, one per cycle),
`acceptance_by_position` (per draft d_j: P(accepted | examined)), and `draft_forwards` (mean draft
model passes per row, its prefill included: 1 + F per cycle), reported apart as they cost far less.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ConfigError, ModelConfig
from ..nn import hf_params, kv_cache
from .. import model as model_lib
from . import decoding, spec
from .config import GenerationConfig
from .decoder import Decoder

Array = jax.Array
SHARED_IDS = ("vocab_size", "mask_token_id", "eos_token_id", "pad_token_id")


@dataclasses.dataclass(frozen=True)
class SpecModel(spec.Speculative):
    """Speculative sampling with a draft model (`generate`'s `draft_params`, `draft_config`): the knobs of
    `spec.Speculative`, draft_length F the draft model's tokens per cycle (it drafts every cycle)."""

    name = "spec-model"
    label = "spec, draft model"
    drafter = "model"

    def lookahead(self) -> int:
        return self.draft_length

    def short(self) -> str:
        return f"F={self.draft_length}" + self.proposal_label()


def draft_step_mask(b: int, has_prev: Array) -> Array:
    """bool [b, 2, 2]: the first draft window `[prev, seed]`, causal; without `prev` (the first cycle,
    where the prefill holds it) the seed row does not see that row."""
    return jnp.stack([jnp.broadcast_to(jnp.asarray([True, False]), (b, 2)),
                      jnp.stack([jnp.broadcast_to(has_prev, (b,)), jnp.ones((b,), bool)], -1)], axis=1)


def draft_tokens(draft_params, draft_config: ModelConfig, cache: dict, prev: Array, seed: Array, n: Array,
                 has_prev: Array, active: Array, presence: Array | None, key: Array, *, draw, draft_length: int):
    """Step 1 of the cycle (module doc): F draft-model forwards against `cache` (the text minus `prev,
    seed`); `draw` (the proposal's, `spec.proposal`) draws each d_j, the token the next forward is fed.
    Returns (drafts int [b, F], their draft logits fp32 [b, F, V], the cache with `prev` (when
    `has_prev`), the seed and d_1 … d_{F−1} committed for the active rows)."""
    b = seed.shape[0]
    pos = (n - 2)[:, None] + jnp.arange(2, dtype=jnp.int32)[None, :]
    logits, kv = model_lib.apply(draft_params, draft_config, jnp.stack([prev, seed], 1), pos, cache=cache,
                                 window_mask=draft_step_mask(b, has_prev))
    keep = jnp.stack([jnp.broadcast_to(has_prev, (b,)), jnp.ones((b,), bool)], 1) & active[:, None]
    cache = kv_cache.commit(cache, kv, keep)
    d1 = draw(jax.random.fold_in(key, 0), logits[:, 1], presence)  # the committed text's set holds the seed

    def step(carry, j):
        c, tok, pres = carry
        pres = decoding.add_presence(pres, tok[:, None], jnp.ones((b, 1), bool))
        lg, kv = model_lib.apply(draft_params, draft_config, tok[:, None], (n + j - 1)[:, None], cache=c)
        c = kv_cache.commit(c, kv, active[:, None])
        nxt = draw(jax.random.fold_in(key, j), lg[:, 0], pres)
        return (c, nxt, pres), (nxt, lg[:, 0])

    (cache, _, _), (rest, rest_logits) = jax.lax.scan(step, (cache, d1, presence),
                                                      jnp.arange(1, draft_length, dtype=jnp.int32))
    drafts = jnp.concatenate([d1[:, None], jnp.moveaxis(rest, 0, 1)], axis=1)
    q_logits = jnp.concatenate([logits[:, 1:], jnp.moveaxis(rest_logits, 0, 1)], axis=1)
    return drafts, q_logits, cache


@functools.partial(jax.jit, static_argnames=("config", "draft_config", "gcfg"))
def spec_model_decode(params, draft_params, prompts: Array, lengths: Array, key: Array, max_cycles: Array,
                      tau: Array | None = None, *, config: ModelConfig, draft_config: ModelConfig,
                      gcfg: GenerationConfig) -> dict:
    """Speculative decode with a draft model (module doc). prompts int [b, P] right-padded, lengths int [b]
    ≥ 1; max_cycles int32 scalar (traced; cycle k's randomness is fold_in(key, k)); tau float32 scalar or
    None (traced `proposal_temperature`; None: the mode's).

    Returns {'tokens' [b, G], 'lengths' [b], 'logprobs' [b, G], 'num_forward_passes' [b] (base passes),
    'draft_forwards' [b], 'loop_passes', 'row_cycles' [b], 'accepted_sum', 'accepted_at' [F],
    'reached_at' [F], 'cache', 'draft_cache', 'seed' [b], 'positions' [b]}.
    """
    F = gcfg.mode.draft_length
    b, P = prompts.shape
    greedy = gcfg.temperature == 0
    eos, _ = decoding.special_ids(config, gcfg)
    prompts = prompts.astype(jnp.int32)
    lengths = lengths.astype(jnp.int32)
    dist, _ = spec.target(config, gcfg)
    qdist, qdraw = spec.proposal(config, gcfg, tau)
    rows = spec.cache_rows(gcfg, P)
    cache, seed = spec.prefill_but_last(params, config, prompts, lengths, rows, gcfg.kv_cache_dtype)
    dcache, _ = spec.prefill_but_last(draft_params, draft_config, prompts, lengths, rows, gcfg.kv_cache_dtype)
    idx_f = jnp.arange(F, dtype=jnp.int32)[None, :]
    idx_v = jnp.arange(F + 1, dtype=jnp.int32)[None, :]

    state = dict(cache=cache, dcache=dcache, prev=jnp.zeros((b,), jnp.int32), seed=seed, n=lengths,
                 **spec.loop_state(prompts, lengths, config, gcfg, F))

    def body(s):
        k_draft, k_acc = jax.random.split(jax.random.fold_in(key, s["cycle"]))
        active, n = ~s["done"], s["n"]
        drafts, q_logits, dcache = draft_tokens(draft_params, draft_config, s["dcache"], s["prev"], s["seed"], n,
                                                s["cycle"] > 0, active, s["presence"], k_draft, draw=qdraw,
                                                draft_length=F)
        window = jnp.concatenate([s["seed"][:, None], drafts], axis=1)  # [seed, d_1 … d_F]
        # row i's penalty set: the committed text (seed included) and d_1 … d_i, for q_{i+1} and p_{i+1} alike
        pres = spec.presence_rows(s["presence"], window)
        q = qdist(q_logits, None if pres is None else pres[:, :F])
        logits_v, kv_v = model_lib.apply(params, config, window, (n - 1)[:, None] + idx_v, cache=s["cache"])
        p = dist(logits_v, pres)
        m, nxt = spec.accept_drafts(p, q, drafts, k_acc, greedy=greedy)
        c = kv_cache.commit(s["cache"], kv_v, (idx_v <= m[:, None]) & active[:, None])
        # the draft cache keeps the new text minus its last two tokens (d_m or the seed, then nxt)
        dcache = {**dcache, "length": jnp.where(active, n + m - 1, s["dcache"]["length"])}

        # Emitted: d_1 … d_m, then the correction/bonus (m+1 tokens); verify row i holds token i's AR logits.
        ext = jnp.concatenate([drafts, jnp.zeros((b, 1), jnp.int32)], axis=1)
        new = jnp.where(idx_v < m[:, None], ext, nxt[:, None])
        out, logprobs, g, finished, write = decoding.emit(s["out"], s["logprobs"], s["g"], active, new, m + 1,
                                                          logits_v, eos, config=config, gcfg=gcfg)
        act = active.astype(jnp.int32)
        reached = (idx_f <= jnp.minimum(m, F - 1)[:, None]) & active[:, None]  # d_1 … d_{m+1} examined
        accepted = (idx_f < m[:, None]) & active[:, None]
        return dict(cache=c, dcache=dcache,
                    prev=jnp.where(active, jnp.take_along_axis(window, m[:, None], axis=1)[:, 0], s["prev"]),
                    seed=jnp.where(active, nxt, s["seed"]), n=jnp.where(active, n + m + 1, n), out=out,
                    logprobs=logprobs, g=g, done=s["done"] | finished, cycle=s["cycle"] + 1,
                    row_cycles=s["row_cycles"] + act, accepted_sum=s["accepted_sum"] + jnp.sum(m * act),
                    accepted_at=s["accepted_at"] + accepted.sum(0).astype(jnp.int32),
                    reached_at=s["reached_at"] + reached.sum(0).astype(jnp.int32),
                    presence=decoding.add_presence(s["presence"], new, write))

    s = jax.lax.while_loop(spec.running(max_cycles, gcfg), body, state)
    return {"tokens": s["out"], "lengths": s["g"], "logprobs": s["logprobs"],
            "num_forward_passes": 1 + s["row_cycles"], "draft_forwards": 1 + F * s["row_cycles"],
            "loop_passes": 1 + s["cycle"], "row_cycles": s["row_cycles"], "accepted_sum": s["accepted_sum"],
            "accepted_at": s["accepted_at"], "reached_at": s["reached_at"], "cache": s["cache"],
            "draft_cache": s["dcache"], "seed": s["seed"], "positions": s["n"]}


def check_compatible(config: ModelConfig, draft_config) -> None:
    """A draft model's config against the base's: a `ModelConfig` reading and writing the base's ids (same
    vocabulary and special ids) and reaching every position the base does. Raises ConfigError (a
    ValueError) naming the field."""
    if not isinstance(draft_config, ModelConfig):
        raise ConfigError(f"draft_config: expected a ModelConfig, got {type(draft_config).__name__}")
    for name in SHARED_IDS:
        mine, base = getattr(draft_config, name), getattr(config, name)
        if mine != base:
            raise ConfigError(f"draft model {name}={mine}, but the base model has {name}={base}: a draft model "
                              "must read and write the base's token ids (same vocabulary and special ids)")
    if draft_config.max_position_embeddings < config.max_position_embeddings:
        raise ConfigError(f"draft model max_position_embeddings={draft_config.max_position_embeddings} < the base's "
                          f"{config.max_position_embeddings}: it must reach every position the base decodes")


def check_draft_model(config: ModelConfig, gcfg: GenerationConfig, draft_params, draft_config) -> None:
    """The decoder's check: the draft model given, compatible (`check_compatible`) and its params of its
    config. Raises a ValueError naming the problem."""
    if draft_params is None or draft_config is None:
        raise ConfigError(f"mode {gcfg.mode.name!r} needs the draft model: pass draft_params and its draft_config "
                          "(a ModelConfig) to generate()")
    check_compatible(config, draft_config)
    hf_params.check_params(draft_params, draft_config)


def run(params, tokens: Array, lengths: Array, key: Array, *, config: ModelConfig, gcfg: GenerationConfig,
        debug: bool = False, knobs: SpecModel | None = None, draft_params=None,
        draft_config: ModelConfig | None = None) -> dict:
    """The decoder's run: `spec_model_decode` with the whole budget and the traced `proposal_temperature` of
    `knobs`, its `spec.outputs`."""
    tau = None if knobs is None else knobs.arrays().proposal_temperature
    raw = spec_model_decode(params, draft_params, tokens, lengths, key, jnp.int32(gcfg.max_new_tokens), tau,
                            config=config, draft_config=draft_config, gcfg=gcfg)
    return spec.outputs(raw)


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    return {"drafter": gcfg.mode.drafter, "draft_length": gcfg.mode.draft_length, **spec.summarize(raw),
            "draft_forwards": float(np.mean(raw["draft_forwards"]))}


DECODER = Decoder(run, stats, check_draft_model, uses_draft_model=True)
SpecModel.decoder = DECODER
