"""Slotted training transform (docs/algorithms.md §2, paper §4.1; after ReFusion's `forward_process`).

Per example (prompt + answer, only the answer supervised):
  * the answer is cut into consecutive slots of `slot_size` tokens (the last may be shorter);
  * `p_mask = eps + (1 - eps)·u`, u ~ U(0, 1), per example; each slot is masked independently with
    probability p_mask (Bernoulli per slot);
  * clean slots keep their tokens; AR convention, targets next-token *within the slot* (the last token
    of a clean slot has no target), weight 1 — ReFusion's rule, `boundary_targets=False`. By default
    (`boundary_targets=True`, docs/algorithms.md §2.4, beyond ReFusion's rule) the last token of a clean slot and the last
    prompt token also get the next logical token as target, so AR decoding learns every transition;
  * masked slots become all `mask_id`; MDM convention, target = the token itself, weight 1/p_tok where
    p_tok = p_mask, or with `ordered_sampling`
        p_tok(j) = p + min(p, 1 - p) · (2j + 1 - n) / n,   j = 0 … n-1 inside a slot of n tokens,
    which rises linearly from left to right, keeps the slot mean exactly p and stays in (0, 1)
    (its minimum is >= p/n), so the first tokens of a slot weigh most;
  * physical layout per example `[prompt][clean slots][masked slots]`, then the row's padding;
    `sequential_shuffle` orders the clean slots, `diffusion_shuffle` the masked slots, by random keys
    (else in logical order); every token keeps its logical position (docs/algorithms.md §0).
Examples packed in one row stay in their own contiguous range, so the attention mask is the
segment-causal mask over the physical order: causal, never across examples.

All randomness comes from `draw_slot_noise(key, shape)`; `slotted_transform_from_draws` is a pure
function of those draws (tests drive an independent NumPy reference with the same draws).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ConfigError, ZaryaConfig
from ..data.batch import row_layout
from ..nn import masks

Array = jax.Array


def draw_slot_noise(key: Array, shape: tuple[int, int]) -> dict[str, Array]:
    """All random draws of the slotted transform for a batch of shape [B, L].

    u_pmask  f32 [B, L]   per example (indexed by segment id - 1): p_mask = eps + (1 - eps)·u
    u_slot   f32 [B, L]   per slot (indexed by the physical index of the slot's first token): masked iff u < p_mask
    key_clean, key_masked  uint32 [B, L]  per slot: sort keys for sequential_/diffusion_shuffle
    """
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {
        "u_pmask": jax.random.uniform(k1, shape, jnp.float32),
        "u_slot": jax.random.uniform(k2, shape, jnp.float32),
        "key_clean": jax.random.bits(k3, shape, jnp.uint32),
        "key_masked": jax.random.bits(k4, shape, jnp.uint32),
    }


def ordered_p(p: Array, j: Array, n: Array) -> Array:
    """Per-token p_mask rising left to right inside a group of n tokens with mean p (docs/algorithms.md §2.4)."""
    n = jnp.maximum(n, 1).astype(jnp.float32)
    return p + jnp.minimum(p, 1.0 - p) * (2.0 * j + 1.0 - n) / n


def _slot_row(draws, tokens, segment_ids, positions, answer_mask, *, zc: ZaryaConfig, slot_size: int,
              mask_id: int):
    lay = row_layout(segment_ids, answer_mask)
    idx, length = lay["idx"], tokens.shape[0]
    a, n = lay["ans_index"], lay["ans_len"]
    slot = a // slot_size
    j = a % slot_size
    slot_first = jnp.clip(lay["ans_start"] + slot * slot_size, 0, length - 1)
    slot_len = jnp.minimum(slot_size, n - slot * slot_size)

    p = zc.eps + (1.0 - zc.eps) * draws["u_pmask"][lay["example"]]
    masked = answer_mask & (draws["u_slot"][slot_first] < p)
    p_tok = ordered_p(p, j, slot_len) if zc.ordered_sampling else p
    clean = answer_mask & ~masked

    # AR targets stay inside the slot: the next physical token of the original row is the next
    # logical token of the same slot whenever j < slot_len - 1. With `boundary_targets` the last
    # token of a clean slot and the last prompt token also predict the next logical answer token
    # (a label only: the attention mask never shows it to the row).
    # The boundary target is only a label if the next slot is not visible to the row: it is masked,
    # or clean and laid out physically later (always without `sequential_shuffle`; with it, when its
    # shuffle key sorts after this slot's, ties keeping logical order).
    has_ar = clean & (j < slot_len - 1)
    if zc.boundary_targets:
        last_prompt = (segment_ids > 0) & ~answer_mask & (idx + 1 == lay["ans_start"]) & (n > 0)
        next_first = jnp.clip(slot_first + slot_size, 0, length - 1)
        later = draws["key_clean"][next_first] >= draws["key_clean"][slot_first] if zc.sequential_shuffle else True
        next_hidden = masked[next_first] | later
        at_boundary = clean & (j == slot_len - 1) & (a < n - 1) & next_hidden
        has_ar = has_ar | at_boundary | last_prompt
    next_tok = jnp.roll(tokens, -1)
    targets = jnp.where(masked, tokens, jnp.where(has_ar, next_tok, 0)).astype(jnp.int32)
    weights = jnp.where(masked, 1.0 / p_tok, jnp.where(has_ar, 1.0, 0.0)).astype(jnp.float32)
    inputs = jnp.where(masked, mask_id, tokens).astype(jnp.int32)

    group = jnp.where(answer_mask, jnp.where(masked, 2, 1), 0)
    zero = jnp.zeros_like(draws["key_clean"])
    k_clean = draws["key_clean"][slot_first] if zc.sequential_shuffle else zero
    k_masked = draws["key_masked"][slot_first] if zc.diffusion_shuffle else zero
    slot_key = jnp.where(group == 1, k_clean, jnp.where(group == 2, k_masked, zero))
    # Lexicographic (example, prompt/clean/masked, slot key, index): a slot's tokens share their key, so
    # each slot stays contiguous and in order; padding (sort_seg = L + 1) goes last.
    perm = jax.lax.sort((lay["sort_seg"], group, slot_key, idx), num_keys=4)[3]

    n_examples = jnp.sum((a == 0) & answer_mask & (n > 0))
    out = {
        "tokens": inputs, "positions": positions.astype(jnp.int32), "segment_ids": segment_ids.astype(jnp.int32),
        "targets": targets, "weights": weights, "is_dif": masked, "answer": answer_mask, "masked": masked,
        "ans_len": jnp.where(answer_mask, n, 0).astype(jnp.float32),
        "p_mask": jnp.where(answer_mask, p_tok, 0.0).astype(jnp.float32),
    }
    out = {k: v[perm] for k, v in out.items()}
    out["num_examples"] = n_examples.astype(jnp.int32)
    out["primary"] = jnp.ones((), bool)
    return out


def _check_args(slot_size, mask_id):
    if isinstance(slot_size, jax.Array):  # traced slot size (e.g. `curriculum.slot_size_at_traced`)
        if slot_size.shape != () or not jnp.issubdtype(slot_size.dtype, jnp.integer):
            raise ConfigError(f"slot_size: expected an int scalar, got {slot_size.dtype}{list(slot_size.shape)}")
    elif not isinstance(slot_size, (int, np.integer)) or isinstance(slot_size, bool) or slot_size < 1:
        raise ConfigError(f"slot_size={slot_size!r}: expected a positive int (static under jit)")
    if mask_id is None:
        raise ConfigError("mask_id is None: the slotted transform needs the <mdm_mask> token id "
                          "(ModelConfig.mask_token_id)")


def slotted_transform_from_draws(draws: dict, batch: dict, zarya_config: ZaryaConfig, slot_size: int,
                                 mask_id: int) -> dict[str, Array]:
    """The slotted transform (docs/algorithms.md §2) as a pure function of `draw_slot_noise`'s draws.

    No shape depends on `slot_size`: pass a static int (one compile per size) or a traced int32 scalar
    (one compile for the whole curriculum).

    batch: tokens/segment_ids/positions [B, L] int, answer_mask [B, L] bool (see `data/batch.py`).
    Returns, all in physical order:
      tokens, positions, segment_ids int32 [B, L]; window_mask bool [B, L, L];
      targets int32 [B, L]; weights f32 [B, L] (1 for AR targets, 1/p_tok for MDM targets, 0 = none);
      is_dif bool [B, L] (MDM target); answer, masked bool [B, L]; ans_len f32 [B, L] (answer length of the
      token's example); p_mask f32 [B, L] (per-token p_mask of answer tokens, the ordered one with
      ordered_sampling); num_examples int32 [B] (examples with a non-empty answer); primary bool [B]
      (all True: every row counts for per-example statistics).
    """
    _check_args(slot_size, mask_id)
    if not isinstance(slot_size, jax.Array):
        slot_size = int(slot_size)
    row = jax.vmap(lambda d, t, s, p, m: _slot_row(d, t, s, p, m, zc=zarya_config, slot_size=slot_size,
                                                   mask_id=int(mask_id)))
    out = row(draws, batch["tokens"], batch["segment_ids"], batch["positions"],
              jnp.asarray(batch["answer_mask"], bool))
    out["window_mask"] = masks.segment_causal(out["segment_ids"])
    return out


def slotted_transform(key: Array, batch: dict, zarya_config: ZaryaConfig, slot_size: int,
                      mask_id: int) -> dict[str, Array]:
    """Slotted transform (docs/algorithms.md §2): draws from `key`, then `slotted_transform_from_draws`.
    Pure and deterministic in `key`; jit with `zarya_config`, `slot_size`, `mask_id` static."""
    _check_args(slot_size, mask_id)
    draws = draw_slot_noise(key, tuple(batch["tokens"].shape))
    return slotted_transform_from_draws(draws, batch, zarya_config, slot_size, mask_id)
