"""Mode A: MDM sampling with first-hitting denoising and a reusable KV cache (docs/algorithms.md §5, Eso-LM style).

Per row, with M = max_new_tokens masks after the prompt:
1. Budget. T = `steps` > 0: N_d ~ Binomial(M, alpha0) diffusion tokens spread as evenly as possible
   over T steps (k_i = ⌊(i+1)N_d/T⌋ − ⌊iN_d/T⌋ ≤ ⌈M/T⌉), then the M − N_d others one per step
   (sequential phase). T = 0: every token is a diffusion token, ⌈M/4⌉ steps of ≤ 4. Empty steps
   (N_d < T) are skipped: they would sample nothing and leave the cache unchanged.
2. Order. The diffusion tokens in a random order, then the sequential ones left to right; the
   generated tokens are laid out physically in that order (logical positions carried, docs/algorithms.md §0).
   Beyond the paper (`mdm_order`): "logical" takes the diffusion tokens left to right (chunks of k_s);
   "confidence" feeds every undecoded mask at each diffusion step and commits the k_s whose most likely
   token is most probable (listed in logical order), so the window's mask half has M rows.
3. Step s feeds the window `[tokens sampled at step s−1 ; this step's k_s masks]` against the cache
   (window K = ⌈M/T⌉ (T > 0) or min(4, M) rows per half; unused rows are masked), commits the K/V of
   the clean half only, and samples the masks (MDM convention: a mask's logits row predicts its own
   position). The last step's tokens are never fed back (no pass needs them).
   With `mdm_sequential="ar"` (beyond the paper) a sequential step reads offset o from the AR row of
   the token before it (offset o − 1, or the last prompt token): that token is fed again, uncommitted,
   at its own position, and its committed copy (in the cache or in this window) is hidden from it, so
   the row sees exactly the decoded context, as the AR-convention sequential pass is trained
   (docs/algorithms.md §3.3). With α0 = 0 this is the AR sampler.
4. Tokens are scattered by logical offset, so the output is in logical order.
EOS: a row stops once every position before its first decoded EOS is decoded; the sequential tail
then ends at the EOS.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..nn import kv_cache, masks
from ..nn import model as model_lib
from . import decoding
from .config import GenerationConfig
from .decoder import Decoder

Array = jax.Array


@struct.dataclass
class Knobs:
    """Mode A's knobs passed as traced scalars: α0, the diffusion share of the budget; `logical`, the
    planned order of the diffusion tokens (left to right, else random); `ar_rows`, the AR-row
    sequential convention. They change values, not shapes, so every α0, both planned orders and both
    conventions at one (T, confidence or not) run one program (`static`)."""

    alpha0: Array
    logical: Array
    ar_rows: Array

    @classmethod
    def of(cls, gcfg: GenerationConfig) -> "Knobs":
        return cls(alpha0=jnp.asarray(gcfg.alpha0, jnp.float32), logical=jnp.asarray(gcfg.mdm_order == "logical"),
                   ar_rows=jnp.asarray(gcfg.mdm_sequential == "ar"))


KNOBS = ("alpha0",)  # the GenerationConfig fields reset in every compile key (`static` folds the other two)


def static(gcfg: GenerationConfig) -> GenerationConfig:
    """The compile key's view of mode A's order and convention: the random and the logical order share a
    program (only the plan's ranks differ), as do both sequential conventions; "confidence" scores every
    undecoded mask (other shapes) and keeps its own."""
    order = "confidence" if gcfg.mdm_order == "confidence" else "random"
    return gcfg.replace(mdm_order=order, mdm_sequential="mask")


def window_rows(gcfg: GenerationConfig) -> int:
    """Static K: the most tokens any step commits (the window's first half)."""
    m, t = gcfg.max_new_tokens, gcfg.steps
    return -(-m // t) if t > 0 else min(4, m)


def query_rows(gcfg: GenerationConfig) -> int:
    """Static rows of the window's query half: K, or M when every undecoded mask is scored."""
    return gcfg.max_new_tokens if gcfg.mdm_order == "confidence" else window_rows(gcfg)


def max_steps(gcfg: GenerationConfig) -> int:
    m, t = gcfg.max_new_tokens, gcfg.steps
    return t + m if t > 0 else -(-m // 4)


def plan(key: Array, gcfg: GenerationConfig, batch: int, knobs: Knobs | None = None
         ) -> tuple[Array, Array, Array]:
    """Per-row schedule: (order int32 [B, M] logical offsets in physical order, sizes int32 [B, S]
    tokens per step (non-empty steps first), num_steps [B], num_diffusion [B]). S = max_steps.
    `knobs` (traced α0 and order, `Knobs`) default to `gcfg`'s."""
    m, t = gcfg.max_new_tokens, gcfg.steps
    knobs = Knobs.of(gcfg) if knobs is None else knobs
    alpha0 = knobs.alpha0
    k_budget, k_order = jax.random.split(key)
    if t > 0:
        # Binomial(M, alpha0) as a sum of M Bernoulli draws (exact).
        n_d = (jax.random.uniform(k_budget, (batch, m)) < alpha0).sum(1).astype(jnp.int32)
        i = jnp.arange(t, dtype=jnp.int32)[None, :]
        diff = ((i + 1) * n_d[:, None]) // t - (i * n_d[:, None]) // t
        seq = (jnp.arange(m)[None, :] < (m - n_d)[:, None]).astype(jnp.int32)
        sizes = jnp.concatenate([diff, seq], axis=1)
    else:
        n = -(-m // 4)
        i = jnp.arange(n, dtype=jnp.int32)
        sizes = jnp.broadcast_to(((i + 1) * m) // n - (i * m) // n, (batch, n))
        n_d = jnp.full((batch,), m, jnp.int32)
    compact = jnp.argsort(sizes == 0, axis=1, stable=True)
    sizes = jnp.take_along_axis(sizes, compact, axis=1).astype(jnp.int32)
    offsets = jnp.arange(m)[None, :]
    # random, or logical (also confidence's placeholder: its order is chosen while decoding)
    random_rank = jnp.argsort(jnp.argsort(jax.random.uniform(k_order, (batch, m)), axis=1), axis=1)
    logical = knobs.logical | (gcfg.mdm_order == "confidence")
    rank = jnp.where(logical, jnp.broadcast_to(offsets, (batch, m)), random_rank)
    sort_key = jnp.where(rank < n_d[:, None], rank, n_d[:, None] + offsets)
    order = jnp.argsort(sort_key, axis=1).astype(jnp.int32)
    return order, sizes, (sizes > 0).sum(1).astype(jnp.int32), n_d


def run(params, tokens: Array, lengths: Array, key: Array, *, config, gcfg: GenerationConfig,
        debug: bool = False, dyn: dict | None = None) -> dict:
    """Mode A decode. tokens int32 [B, P] right-padded, lengths [B]. Returns tokens [B, M] (logical),
    lengths, num_forward_passes [B] (prefill included), loop_passes, order [B, M] (logical offsets in
    physical order), num_diffusion [B]; with debug a per-pass 'trace' (logits/tokens/positions/valid
    [S, B, K + Q, ·], cache_len [S, B]; Q = `query_rows`)."""
    b, p = tokens.shape
    m = gcfg.max_new_tokens
    kw, kq = window_rows(gcfg), query_rows(gcfg)
    w = kw + kq
    n_steps_max = max_steps(gcfg)
    eos, pad = decoding.special_ids(config, gcfg)
    mask_id = config.mask_token_id
    draw = decoding.sampler(config, gcfg)
    stop = eos is not None and gcfg.stop_at_eos
    confidence = gcfg.mdm_order == "confidence"
    k_plan, k_sample = jax.random.split(key)
    if dyn is not None and not isinstance(dyn, Knobs):
        raise ValueError(f"mdm.run: dyn must be an mdm.Knobs (build it with Knobs.of(generation_config)), "
                         f"got {type(dyn).__name__}")
    dyn = dyn or Knobs.of(gcfg)
    planned, sizes, n_steps, n_diff = plan(k_plan, gcfg, b, dyn)
    # Non-empty diffusion steps come first (k_s ≤ ⌈M/T⌉ evenly spread); T = 0 has no sequential phase.
    n_dif_steps = jnp.minimum(n_diff, gcfg.steps) if gcfg.steps > 0 else n_steps
    starts = jnp.cumsum(sizes, axis=1) - sizes
    _, cache = decoding.prefill(params, config, tokens, lengths, p + m, gcfg.kv_cache_dtype)
    cache_rows = kv_cache.max_len(cache)  # p + m rounded up to the cache's row tile
    rows = jnp.arange(b)[:, None]
    offs = jnp.arange(m)[None, :]
    slot = jnp.arange(kw)[None, :]
    qslot = jnp.arange(kq)[None, :]
    last_prompt = tokens[jnp.arange(b), lengths - 1]

    state = dict(s=jnp.int32(0), cache=cache, gen=jnp.full((b, m), pad, jnp.int32),
                 decoded=jnp.zeros((b, m), bool), prev_off=jnp.full((b, kw), m, jnp.int32),
                 order=jnp.zeros((b, m), jnp.int32), phys=jnp.zeros((b, m), jnp.int32),
                 done=jnp.zeros((b,), bool), nfe=jnp.ones((b,), jnp.int32),
                 presence=decoding.initial_presence(tokens, lengths, config.vocab_size, gcfg))
    if debug:
        state["trace"] = dict(logits=jnp.zeros((n_steps_max, b, w, config.vocab_size), jnp.float32),
                              tokens=jnp.zeros((n_steps_max, b, w), jnp.int32),
                              positions=jnp.zeros((n_steps_max, b, w), jnp.int32),
                              valid=jnp.zeros((n_steps_max, b, w), bool),
                              cache_len=jnp.zeros((n_steps_max, b), jnp.int32))

    def candidates(st, s, k_s, sequential):
        """This step's query rows: (logical offsets [B, Q], valid [B, Q])."""
        if confidence:
            undecoded = jnp.argsort(st["decoded"], axis=1, stable=True)[:, :kq].astype(jnp.int32)
            n_left = m - st["decoded"].sum(1)
            # Diffusion: every undecoded mask competes; sequential: the leftmost one alone.
            n_cand = jnp.where(sequential, jnp.minimum(n_left, 1), n_left) * (k_s > 0)
            return undecoded, qslot < n_cand[:, None]
        phys = jnp.clip(starts[:, s][:, None] + qslot, 0, m - 1)
        return jnp.take_along_axis(planned, phys, axis=1), qslot < k_s[:, None]

    def cond(st):
        return (st["s"] < n_steps_max) & jnp.any(~st["done"])

    def body(st):
        s = st["s"]
        active = ~st["done"] & (s < n_steps)
        k_s = jnp.where(active, sizes[:, s], 0)
        sequential = s >= n_dif_steps
        q_off, q_valid = candidates(st, s, k_s, sequential)
        q_off = jnp.where(q_valid, q_off, m)
        prev_valid = (st["prev_off"] < m) & active[:, None]
        prev_tok = jnp.take_along_axis(st["gen"], jnp.minimum(st["prev_off"], m - 1), axis=1)
        q_tok = jnp.where(q_valid, mask_id, pad)
        q_pos = lengths[:, None] + jnp.minimum(q_off, m - 1)
        window_mask = masks.causal_with_padding(jnp.concatenate([prev_valid, q_valid], axis=1))
        cache_mask = None
        if gcfg.steps > 0:  # T = 0 has no sequential phase: no convention to read
            # With the AR-row convention a sequential step's query row is the token before its target.
            requery = q_valid & (sequential & dyn.ar_rows)[:, None]
            before = jnp.maximum(q_off - 1, 0)
            first = q_off == 0
            before_tok = jnp.where(first, last_prompt[:, None], jnp.take_along_axis(st["gen"], before, axis=1))
            q_tok = jnp.where(requery, before_tok, q_tok)
            q_pos = jnp.where(requery, q_pos - 1, q_pos)
            # Hide the committed copy of that token: in the cache (prompt or earlier step) or in this window.
            dup = jnp.where(first, lengths[:, None] - 1,
                            lengths[:, None] + jnp.take_along_axis(st["phys"], before, axis=1))
            hide_cache = requery[:, :, None] & (jnp.arange(cache_rows)[None, None, :] == dup[:, :, None])
            seen = jnp.arange(cache_rows)[None, None, :] < st["cache"]["length"][:, None, None]
            cache_mask = jnp.concatenate([jnp.broadcast_to(seen, (b, kw, cache_rows)), seen & ~hide_cache], 1)
            hide_prev = requery[:, :, None] & (st["prev_off"][:, None, :] == q_off[:, :, None] - 1)
            window_mask = window_mask & ~jnp.pad(hide_prev, ((0, 0), (kw, 0), (0, kq)))
        win_tok = jnp.concatenate([jnp.where(prev_valid, prev_tok, pad), q_tok], axis=1)
        win_pos = jnp.concatenate([lengths[:, None] + jnp.minimum(st["prev_off"], m - 1), q_pos], axis=1)
        valid = jnp.concatenate([prev_valid, q_valid], axis=1)
        logits, kv = model_lib.apply(params, config, win_tok, win_pos, window_mask=window_mask,
                                     cache=st["cache"], cache_mask=cache_mask)
        cache = kv_cache.commit(st["cache"], kv, jnp.concatenate([prev_valid, jnp.zeros_like(q_valid)], 1))
        q_logits = logits[:, kw:]
        new_tok = draw(jax.random.fold_in(k_sample, s), q_logits, st["presence"])
        if confidence:
            # The k_s rows whose most likely token is most probable (the mask token is never sampled).
            banned = jnp.arange(config.vocab_size) == mask_id
            score = jnp.max(jax.nn.log_softmax(jnp.where(banned, -jnp.inf, q_logits), axis=-1), axis=-1)
            rank = jnp.argsort(jnp.argsort(jnp.where(q_valid, -score, jnp.inf), axis=1), axis=1)
            chosen = q_valid & (rank < k_s[:, None])
        else:
            chosen = q_valid
        # The chosen rows in logical order: their physical order in the cache from the next step on.
        pick = jnp.argsort(~chosen, axis=1, stable=True)[:, :kw]
        step_off = jnp.where(slot < k_s[:, None], jnp.take_along_axis(q_off, pick, axis=1), m)
        step_tok = jnp.take_along_axis(new_tok, pick, axis=1)
        step_phys = starts[:, s][:, None] + slot
        gen = st["gen"].at[rows, step_off].set(step_tok, mode="drop")
        decoded = st["decoded"].at[rows, step_off].set(True, mode="drop")
        order = st["order"].at[rows, jnp.where(step_off < m, step_phys, m)].set(step_off, mode="drop")
        phys_of = st["phys"].at[rows, step_off].set(step_phys, mode="drop")
        done = st["done"] | ~active | decoded.all(1)
        if stop:
            hit = decoded & (gen == eos)
            first_eos = jnp.where(hit.any(1), jnp.argmax(hit, axis=1), m)
            done = done | (decoded | (offs > first_eos[:, None])).all(1)
        new = dict(s=s + 1, cache=cache, gen=gen, decoded=decoded, prev_off=step_off, order=order, phys=phys_of,
                   done=done, nfe=st["nfe"] + active,
                   presence=decoding.add_presence(st["presence"], step_tok, step_off < m))
        if debug:
            tr = st["trace"]
            new["trace"] = dict(logits=tr["logits"].at[s].set(logits), tokens=tr["tokens"].at[s].set(win_tok),
                                positions=tr["positions"].at[s].set(win_pos), valid=tr["valid"].at[s].set(valid),
                                cache_len=tr["cache_len"].at[s].set(st["cache"]["length"]))
        return new

    st = jax.lax.while_loop(cond, body, state)
    out, out_lengths = decoding.finish(st["gen"], jnp.full((b,), m, jnp.int32), eos, gcfg, pad)
    # Offsets a stopped row never decoded follow in logical order (they are cut by the output length).
    left = jnp.argsort(st["decoded"], axis=1, stable=True).astype(jnp.int32)
    n_dec = st["decoded"].sum(1)
    order = jnp.where(offs < n_dec[:, None], st["order"],
                      jnp.take_along_axis(left, jnp.clip(offs - n_dec[:, None], 0, m - 1), axis=1))
    result = dict(tokens=out, lengths=out_lengths, num_forward_passes=st["nfe"], loop_passes=st["s"] + 1,
                  order=order, num_diffusion=n_diff)
    if debug:
        result["trace"] = st["trace"]
    return result


def physical_layout(prompt_tokens: np.ndarray, prompt_lengths: np.ndarray, out_tokens: np.ndarray,
                    out_lengths: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host-side: (tokens, positions) int [B, P + M] in physical order — prompt, then the kept
    generated tokens in denoising order; −1 after. Positions are logical."""
    b, p = prompt_tokens.shape
    m = out_tokens.shape[1]
    toks = np.full((b, p + m), -1, np.int64)
    pos = np.full((b, p + m), -1, np.int64)
    for i in range(b):
        n, k = int(prompt_lengths[i]), int(out_lengths[i])
        kept = [int(o) for o in order[i] if o < k]
        toks[i, :n] = prompt_tokens[i, :n]
        pos[i, :n] = np.arange(n)
        toks[i, n:n + k] = out_tokens[i, kept]
        pos[i, n:n + k] = n + np.asarray(kept, np.int64)
    return toks, pos


def stats(raw: dict, gcfg: GenerationConfig, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    """The denoising order and the physical layout of each row (prompt, then tokens in decode order)."""
    ptoks, ppos = physical_layout(tokens, lengths, np.asarray(raw["tokens"]), out_lengths, raw["order"])
    return dict(order=np.asarray(raw["order"]), num_diffusion=np.asarray(raw["num_diffusion"]),
                physical_tokens=ptoks, physical_positions=ppos)


DECODER = Decoder(run, stats, knobs=Knobs.of, static=static)
