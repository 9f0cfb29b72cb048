"""Fused Ψ-Spec with the self drafter: one forward pass per speculative cycle, still lossless (docs/algorithms.md §7.5).

The cache holds the committed text except its last token y (logical position n−1); K drafts d1 … dK
for positions n … n+K−1 and their draft distributions q1 … qK come from the previous cycle. One pass
over a window of (K+1)(K+2) rows holds
- the verify block `[y, d1 … dK]` at positions n−1 … n+K−1, causal against the cache: row j gives
  p_{j+1}, the AR distribution of position n+j (AR convention);
- K+1 scenario blocks of K+1 mask tokens each. Block m assumes the cycle accepts d1 … dm and emits a
  correction/bonus e at position n+m: its rows sit at positions n+m … n+m+K, see the cache, the verify
  rows 0 … m (y, d1 … dm) and, causally, their own block. Its first row holds e's place (context
  only: e is drawn from p); row i ≥ 1 drafts position n+m+i (MDM convention: a mask predicts its own
  position), i.e. the next cycle's d'_i.
Acceptance is `spec.accept_drafts` unchanged (greedy: argmax match; sampling: min(1, p/q), the
residual at the first rejection, else a bonus from p_{K+1}), so the output is the AR model's
distribution exactly; only the drafts are one token blinder than two-pass self-speculation's (they
do not see e). The cycle commits the K/V of `y, d1 … dm` (computed against the cache: the AR K/V),
keeps e as the next y and takes block m's rows as the next drafts and q. Each emitted token has its AR
logits at hand (d_j from verify row j−1, e from row m), so its log-probability costs nothing.

The block is K+1 rows wide (e's mask and K drafts) so that the next cycle again has K drafts; the
only knob is `draft_length` = K. The first cycle's drafts come from a bootstrap pass `[y, mask × K]` at
n−1 … n+K−1 (nothing committed). Forward passes per row: the prefill, the bootstrap and one per cycle.

Statistics (as `spec.summarize`): `accepted_per_cycle` (mean m, drafts kept), `tokens_per_cycle`
(mean m+1), `tokens_per_forward` (generated tokens / decode passes, the bootstrap included),
`acceptance_by_position` (per draft d_j: P(accepted | examined)).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig
from ..nn import kv_cache
from ..nn import model as model_lib
from . import decoding, spec
from .config import GenerationConfig
from .decoder import Decoder

Array = jax.Array


def window_layout(k: int) -> tuple[np.ndarray, np.ndarray]:
    """The fused window for K = k drafts: (logical position offsets from n int [T], attention mask bool
    [T, T]) with T = (k+1)(k+2): the verify block first (rows 0 … k), then block m at rows
    (k+1)(m+1) … (k+1)(m+2)−1 (module doc)."""
    w = k + 1
    offsets = np.concatenate([np.arange(w) - 1] + [m + np.arange(w) for m in range(w)]).astype(np.int32)
    mask = np.zeros((w * (w + 1),) * 2, bool)
    causal = np.tril(np.ones((w, w), bool))
    mask[:w, :w] = causal
    for m in range(w):
        rows = slice(w * (m + 1), w * (m + 2))
        mask[rows, :m + 1] = True  # y, d1 … dm
        mask[rows, rows] = causal
    return offsets, mask


def window_rows(gcfg: GenerationConfig) -> int:
    return (gcfg.draft_length + 1) * (gcfg.draft_length + 2)


@functools.partial(jax.jit, static_argnames=("config", "gcfg"))
def fused_decode(params, prompts: Array, lengths: Array, key: Array, max_cycles: Array, *, config: ModelConfig,
                 gcfg: GenerationConfig) -> dict:
    """Fused self-speculative decode (module doc). prompts int [b, P] right-padded, lengths int [b] ≥ 1;
    max_cycles int32 scalar (traced; cycle c's randomness is fold_in(key, c + 1), the bootstrap's
    fold_in(key, 0)). Returns the keys of `spec.spec_decode` ('accepted_at', 'reached_at' per draft
    d1 … dK; 'seed' is y, 'positions' n) plus 'drafts' [b, K]."""
    K, G = gcfg.draft_length, gcfg.max_new_tokens
    w = K + 1
    b, P = prompts.shape
    greedy = gcfg.temperature == 0
    eos, pad = decoding.special_ids(config, gcfg)
    prompts = prompts.astype(jnp.int32)
    lengths = lengths.astype(jnp.int32)

    dist, draw = spec.target(config, gcfg)

    def drafts_from(k, logits, presence):  # drafts ~ q and q itself; any q is lossless, so the penalty set
        pres = None if presence is None else presence[:, None, :]  # is the committed text's
        return draw(k, logits, pres), dist(logits, pres)

    cache, y = spec.prefill_but_last(params, config, prompts, lengths, spec.cache_rows(gcfg, P), gcfg.kv_cache_dtype)
    presence = decoding.initial_presence(prompts, lengths, config.vocab_size, gcfg)
    # Bootstrap: `[y, mask × K]` at n−1 … n+K−1; the mask at n+j−1 drafts d_j. Nothing is committed.
    idx_w = jnp.arange(w, dtype=jnp.int32)[None, :]
    boot, _ = model_lib.apply(params, config, jnp.where(idx_w == 0, y[:, None], config.mask_token_id),
                              (lengths - 1)[:, None] + idx_w, cache=cache)
    drafts, q = drafts_from(jax.random.fold_in(key, 0), boot[:, 1:], presence)

    offsets, mask = window_layout(K)
    offsets = jnp.asarray(offsets)[None, :]
    mask = jnp.broadcast_to(jnp.asarray(mask), (b,) + mask.shape)
    scenario_tokens = jnp.full((b, w * w), config.mask_token_id, jnp.int32)
    idx_k = jnp.arange(K, dtype=jnp.int32)[None, :]

    state = dict(cache=cache, y=y, n=lengths, drafts=drafts, q=q, out=jnp.full((b, G), pad, jnp.int32),
                 logprobs=jnp.zeros((b, G), jnp.float32), g=jnp.zeros((b,), jnp.int32),
                 done=jnp.zeros((b,), bool), cycle=jnp.int32(0), row_cycles=jnp.zeros((b,), jnp.int32),
                 accepted_sum=jnp.int32(0), accepted_at=jnp.zeros((K,), jnp.int32),
                 reached_at=jnp.zeros((K,), jnp.int32), presence=presence)

    def cond(s):
        return jnp.any(~s["done"]) & (s["cycle"] < jnp.minimum(max_cycles, G))

    def body(s):
        k_acc, k_draw = jax.random.split(jax.random.fold_in(key, s["cycle"] + 1))
        active = ~s["done"]
        c, n = s["cache"], s["n"]
        verify = jnp.concatenate([s["y"][:, None], s["drafts"]], axis=1)  # [y, d1 … dK]
        logits, (k_win, v_win) = model_lib.apply(params, config, jnp.concatenate([verify, scenario_tokens], axis=1),
                                                 n[:, None] + offsets, cache=c, window_mask=mask)
        logits_v = logits[:, :w]  # row j: p for position n+j
        p = dist(logits_v, spec.presence_rows(s["presence"], verify))
        m, e = spec.accept_drafts(p, s["q"], s["drafts"], k_acc, greedy=greedy)
        keep = (idx_w <= m[:, None]) & active[:, None]  # y, d1 … dm
        c = kv_cache.commit(c, (k_win[:, :, :w], v_win[:, :, :w]), keep)

        # Emitted: d1 … dm, then e at index m (m+1 tokens); token i's AR logits are verify row i.
        new = jnp.where(idx_w < m[:, None], jnp.concatenate([s["drafts"], e[:, None]], axis=1), e[:, None])
        out, logprobs, g, finished, written = decoding.emit(s["out"], s["logprobs"], s["g"], active, new, m + 1,
                                                            logits_v, eos, config=config, gcfg=gcfg)
        presence = decoding.add_presence(s["presence"], new, written)

        # The next drafts: block m's rows 1 … K (positions n+m+1 … n+m+K).
        blocks = logits[:, w:].reshape(b, w, w, -1)
        chosen = jnp.take_along_axis(blocks, m[:, None, None, None], axis=1)[:, 0, 1:]
        drafts, q = drafts_from(k_draw, chosen, presence)

        act = active.astype(jnp.int32)
        reached = (idx_k <= jnp.minimum(m, K - 1)[:, None]) & active[:, None]  # d1 … d_{m+1} examined
        accepted = (idx_k < m[:, None]) & active[:, None]
        keep_row = active[:, None]
        return dict(cache=c, y=jnp.where(active, e, s["y"]), n=jnp.where(active, n + m + 1, n),
                    drafts=jnp.where(keep_row, drafts, s["drafts"]), q=jnp.where(keep_row[..., None], q, s["q"]),
                    out=out, logprobs=logprobs, g=g, done=s["done"] | finished, cycle=s["cycle"] + 1,
                    row_cycles=s["row_cycles"] + act, accepted_sum=s["accepted_sum"] + jnp.sum(m * act),
                    accepted_at=s["accepted_at"] + accepted.sum(0).astype(jnp.int32),
                    reached_at=s["reached_at"] + reached.sum(0).astype(jnp.int32), presence=presence)

    s = jax.lax.while_loop(cond, body, state)
    return {"tokens": s["out"], "lengths": s["g"], "logprobs": s["logprobs"],
            "num_forward_passes": 2 + s["row_cycles"], "loop_passes": 2 + s["cycle"], "row_cycles": s["row_cycles"],
            "accepted_sum": s["accepted_sum"], "accepted_at": s["accepted_at"], "reached_at": s["reached_at"],
            "cache": s["cache"], "seed": s["y"], "positions": s["n"], "drafts": s["drafts"]}


def run(params, tokens: Array, lengths: Array, key: Array, *, config: ModelConfig, gcfg: GenerationConfig,
        debug: bool = False, dyn: dict | None = None) -> dict:
    """The decoder's run: `fused_decode` with the whole budget, without the final cache."""
    raw = fused_decode(params, tokens, lengths, key, jnp.int32(gcfg.max_new_tokens), config=config, gcfg=gcfg)
    return {k: v for k, v in raw.items() if k != "cache"}


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    return {"drafter": gcfg.drafter, "draft_length": gcfg.draft_length, "fused": True, **spec.summarize(raw)}


DECODER = Decoder(run, stats)
