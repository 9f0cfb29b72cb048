"""Non-slotted training transform, Eso-LM style (docs/algorithms.md §3, paper §4.2).

Per example (only answer tokens are ever masked):
  * t ~ U(0, 1) per example; with `antithetic_sampling`, stratified over the examples of the batch:
    t_e = (u_e / N + e / N) mod 1 for the batch's e-th example of N (as Eso-LM's `_sample_t`);
  * `alpha_t = alpha0 · (1 - (1 - eps) · t)`, `p_mask = 1 - alpha_t`, per token; with `ordered_sampling`
    t is shifted by the token's index a in an answer of n tokens,
        t_a = t + min(t, 1 - t) · (2a + 1 - n) / n,
    which rises left to right, keeps the mean t (so the mean p_mask is unchanged) and stays in [0, 1];
  * which tokens are masked: Bernoulli(p_mask) per token; or with `grouped_noise`, exactly
    m = floor(p̄·n + u) tokens (stochastic rounding, E[m] = p̄·n, p̄ the example's mean p_mask) in one
    of four patterns drawn uniformly per example:
      0 prefix completion  the last m answer tokens (a suffix);
      1 prefix infill      the first m answer tokens: the span right after the kept prefix (the prompt),
                           the rest of the answer stays visible;
      2 middle infill      an interior span [k, k + m) with 1 <= k <= n - m - 1 when room allows
                           (else k uniform in [0, n - m]);
      3 random spans       the answer is cut into spans of length <= max_span_length (a new span starts
                           with probability 2 / (max_span_length + 1) per token, and a run is cut every
                           max_span_length tokens); spans are masked in random order until m tokens are
                           masked (the last chosen span only partly, from its left end). Spans chosen
                           next to each other read as one longer masked run.
  * two passes on the same example, stacked as rows 2b (sequential) and 2b + 1 (diffusion) so a
    batch-sharded input stays local and the model runs once on [2B, L]:
      sequential: the clean x0, AR convention: the row of logical position i targets x0[i + 1] only
                  when i + 1 is masked (weight 1);
      diffusion:  the noisy xt, MDM convention: a masked row targets its own x0 token, weight 1/p_mask,
                  or Eso-LM's ELBO weight alpha0 (1 - eps) / (1 - alpha_t) with `elbo_weight`;
  * `noise_sorting`: each example is laid out physically `[prompt][clean][masked]`, positions carried,
    targets permuted alike. Clean answer tokens are shuffled if `sequential_shuffle` (the same order in
    both passes). Masked tokens are shuffled if `diffusion_shuffle` in the diffusion pass only: in the
    sequential pass they always stay left to right, because there the masked tokens are visible clean
    tokens and a shuffled order would put x0[i + 1] before the row that predicts it (a target leak).
    Without `noise_sorting` both shuffles are inert (the physical order is the logical one).
The attention mask is segment-causal over the physical order (packed examples never see each other).

Both passes in one batched call rather than two: the same FLOPs and activation memory (the backward
pass keeps both anyway), but the weights are read once and the launch overhead halves.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..config import ConfigError, ZaryaConfig
from ..data.batch import row_layout
from ..nn import masks

Array = jax.Array
NUM_PATTERNS = 4


def draw_token_noise(key: Array, shape: tuple[int, int]) -> dict[str, Array]:
    """All random draws of the non-slotted transform for a batch of shape [B, L].

    Per example (indexed by segment id - 1): u_t (noise level), u_pattern (grouped pattern),
    u_round (stochastic rounding of m), u_start (middle-infill start).
    Per token (physical index): u_tok (Bernoulli mask), u_break (random-span cuts), span_key (random-span
    order, read at the span's first token), key_clean / key_masked (noise_sorting shuffles).
    """
    ks = jax.random.split(key, 9)
    u = lambda k: jax.random.uniform(k, shape, jnp.float32)
    bits = lambda k: jax.random.bits(k, shape, jnp.uint32)
    return {"u_t": u(ks[0]), "u_pattern": u(ks[1]), "u_round": u(ks[2]), "u_start": u(ks[3]),
            "u_tok": u(ks[4]), "u_break": u(ks[5]), "span_key": bits(ks[6]),
            "key_clean": bits(ks[7]), "key_masked": bits(ks[8])}


def sample_t(u_t: Array, segment_ids: Array, antithetic: bool) -> Array:
    """t per (row, example) [B, L] from uniforms u_t [B, L]; antithetic stratifies over the N examples
    of the batch (N = Σ rows' max segment id)."""
    if not antithetic:
        return u_t
    per_row = jnp.max(segment_ids, axis=1).astype(jnp.int32)
    offset = jnp.cumsum(per_row) - per_row
    total = jnp.maximum(jnp.sum(per_row), 1).astype(jnp.float32)
    e = (offset[:, None] + jnp.arange(u_t.shape[1], dtype=jnp.int32)[None]).astype(jnp.float32)
    return jnp.mod(u_t / total + e / total, 1.0)


def alpha(zc: ZaryaConfig, t: Array) -> Array:
    """Linear schedule alpha_t = alpha0 · (1 - (1 - eps) · t) (docs/algorithms.md §3.1)."""
    return zc.alpha0 * (1.0 - (1.0 - zc.eps) * t)


def ordered_t(t: Array, a: Array, n: Array) -> Array:
    """Per-token t rising with the answer index a in [0, n), mean t (docs/algorithms.md §3.2 ordered_sampling)."""
    n = jnp.maximum(n, 1).astype(jnp.float32)
    return t + jnp.minimum(t, 1.0 - t) * (2.0 * a + 1.0 - n) / n


def _grouped_mask(draws, lay, answer_mask, p_bar, zc: ZaryaConfig):
    """Exactly m masked answer tokens per example in the drawn pattern; returns (masked, pattern)."""
    ex, a, n, idx = lay["example"], lay["ans_index"], lay["ans_len"], lay["idx"]
    m = jnp.minimum(jnp.floor(p_bar * n + draws["u_round"][ex]).astype(jnp.int32), n)
    pattern = jnp.minimum(jnp.floor(draws["u_pattern"][ex] * NUM_PATTERNS).astype(jnp.int32), NUM_PATTERNS - 1)
    free = n - m
    u = draws["u_start"][ex]
    k = jnp.where(free >= 2, 1 + jnp.floor(u * (free - 1)), jnp.floor(u * (free + 1))).astype(jnp.int32)
    k = jnp.clip(k, 0, jnp.maximum(free, 0))

    # Random spans: a new span starts at the answer's first token or with probability q; a run is also
    # cut every max_span_length tokens. last_cut = physical index of the latest random cut.
    q = 2.0 / (zc.max_span_length + 1)
    cut = ~answer_mask | (a == 0) | (draws["u_break"] < q)
    last_cut = jax.lax.cummax(jnp.where(cut, idx, 0))
    span_first = last_cut + ((idx - last_cut) // zc.max_span_length) * zc.max_span_length
    span_key = jnp.where(answer_mask, draws["span_key"][span_first], 0)
    # Rank of each answer token in (span key, index) order within its example: sorting keeps examples
    # in place, so the example's answer block starts at its ans_start in sorted order too.
    length = idx.shape[0]
    perm = jax.lax.sort((lay["sort_seg"], answer_mask.astype(jnp.int32), span_key, idx), num_keys=4)[3]
    rank = jnp.zeros(length, jnp.int32).at[perm].set(idx - lay["ans_start"][perm])

    by_pattern = jnp.stack([a >= n - m, a < m, (a >= k) & (a < k + m), rank < m])
    masked = answer_mask & jnp.take_along_axis(by_pattern, pattern[None], axis=0)[0]
    return masked, pattern


def _noise_row(draws, t_row, tokens, segment_ids, positions, answer_mask, *, zc: ZaryaConfig, mask_id: int):
    lay = row_layout(segment_ids, answer_mask)
    idx, ex, a, n = lay["idx"], lay["example"], lay["ans_index"], lay["ans_len"]
    length = tokens.shape[0]
    t_ex = t_row[ex]
    t_tok = ordered_t(t_ex, a, n) if zc.ordered_sampling else t_ex
    alpha_tok = alpha(zc, t_tok)
    p_tok = 1.0 - alpha_tok
    if zc.grouped_noise:
        masked, pattern = _grouped_mask(draws, lay, answer_mask, 1.0 - alpha(zc, t_ex), zc)
        pattern = jnp.where(answer_mask, pattern, -1)
    else:
        masked = answer_mask & (draws["u_tok"] < p_tok)
        pattern = jnp.full((length,), -1, jnp.int32)

    # Sequential pass (AR convention on x0): row i targets x0[i + 1] when that token is masked.
    nxt_masked = jnp.concatenate([masked[1:], jnp.zeros((1,), bool)])
    nxt_same = jnp.concatenate([segment_ids[1:] == segment_ids[:-1], jnp.zeros((1,), bool)])
    has_ar = nxt_masked & nxt_same
    seq_targets = jnp.where(has_ar, jnp.roll(tokens, -1), 0)
    # Diffusion pass (MDM convention on xt).
    w = zc.alpha0 * (1.0 - zc.eps) / p_tok if zc.elbo_weight else 1.0 / p_tok
    dif_weights = jnp.where(masked, w, 0.0)

    common = {"positions": positions.astype(jnp.int32), "segment_ids": segment_ids.astype(jnp.int32),
              "answer": answer_mask, "masked": masked, "pattern": pattern,
              "ans_len": jnp.where(answer_mask, n, 0).astype(jnp.float32),
              "p_mask": jnp.where(answer_mask, p_tok, 0.0).astype(jnp.float32)}
    seq = dict(common, tokens=tokens.astype(jnp.int32), targets=seq_targets.astype(jnp.int32),
               weights=has_ar.astype(jnp.float32), is_dif=jnp.zeros((length,), bool))
    dif = dict(common, tokens=jnp.where(masked, mask_id, tokens).astype(jnp.int32),
               targets=jnp.where(masked, tokens, 0).astype(jnp.int32),
               weights=dif_weights.astype(jnp.float32), is_dif=masked)

    if zc.noise_sorting:
        group = jnp.where(answer_mask, jnp.where(masked, 2, 1), 0)
        zero = jnp.zeros_like(draws["key_clean"])
        k_clean = jnp.where(group == 1, draws["key_clean"] if zc.sequential_shuffle else zero, zero)
        k_masked = jnp.where(group == 2, draws["key_masked"] if zc.diffusion_shuffle else zero, zero)
        perm_seq = jax.lax.sort((lay["sort_seg"], group, k_clean, idx), num_keys=4)[3]
        perm_dif = jax.lax.sort((lay["sort_seg"], group, k_clean + k_masked, idx), num_keys=4)[3]
        seq = {k: v[perm_seq] for k, v in seq.items()}
        dif = {k: v[perm_dif] for k, v in dif.items()}
    n_examples = jnp.sum((a == 0) & answer_mask & (n > 0)).astype(jnp.int32)
    # Per-example statistics are counted once, on the diffusion row.
    seq["num_examples"], seq["primary"] = jnp.zeros((), jnp.int32), jnp.zeros((), bool)
    dif["num_examples"], dif["primary"] = n_examples, jnp.ones((), bool)
    return jax.tree.map(lambda s, d: jnp.stack([s, d]), seq, dif)


def noise_transform_from_draws(draws: dict, batch: dict, zarya_config: ZaryaConfig, mask_id: int) -> dict[str, Array]:
    """The non-slotted transform (docs/algorithms.md §3) as a pure function of `draw_token_noise`'s draws.

    batch: [B, L] (see `data/batch.py`). Returns 2B rows in physical order, row 2b the sequential pass and
    row 2b + 1 the diffusion pass of batch row b:
      tokens, positions, segment_ids int32 [2B, L]; window_mask bool [2B, L, L]; targets int32;
      weights f32 (0 = no target); is_dif bool (MDM target); answer, masked bool; ans_len f32;
      p_mask f32; pattern int32 (grouped pattern on answer tokens, else -1); num_examples int32 [2B]
      (0 on sequential rows); primary bool [2B] (True on diffusion rows: count per-example statistics once).
    """
    if mask_id is None:
        raise ConfigError("mask_id is None: the noise transform needs the <mdm_mask> token id "
                          "(ModelConfig.mask_token_id)")
    t = sample_t(draws["u_t"], jnp.asarray(batch["segment_ids"]), zarya_config.antithetic_sampling)
    row = jax.vmap(lambda d, tr, tk, s, p, m: _noise_row(d, tr, tk, s, p, m, zc=zarya_config, mask_id=int(mask_id)))
    out = row(draws, t, batch["tokens"], batch["segment_ids"], batch["positions"],
              jnp.asarray(batch["answer_mask"], bool))
    out = {k: v.reshape((-1,) + v.shape[2:]) for k, v in out.items()}  # [B, 2, …] -> [2B, …]
    out["window_mask"] = masks.segment_causal(out["segment_ids"])
    return out


def noise_transform(key: Array, batch: dict, zarya_config: ZaryaConfig, mask_id: int) -> dict[str, Array]:
    """Non-slotted transform (docs/algorithms.md §3): draws from `key`, then `noise_transform_from_draws`.
    Pure and deterministic in `key`; jit with `zarya_config` and `mask_id` static."""
    if mask_id is None:
        raise ConfigError("mask_id is None: the noise transform needs the <mdm_mask> token id "
                          "(ModelConfig.mask_token_id)")
    draws = draw_token_noise(key, tuple(batch["tokens"].shape))
    return noise_transform_from_draws(draws, batch, zarya_config, mask_id)
