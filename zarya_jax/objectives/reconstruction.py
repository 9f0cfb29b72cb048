"""Eso-LM's reconstruction loss as the non-slotted sequential pass in the MDM convention (docs/algorithms.md §3.3).

Mode A's sequential phase asks the MDM head one question: a mask at logical position i, read from its
own row, after every token decoded so far — the diffusion tokens (anywhere) and the sequential ones
left of i. The AR-convention sequential pass never asks it. Eso-LM trains it with one forward over
`[x0 ; masked copies]` (its `_reconstruction_loss`, block size 1); this is that layout in the
project's physical-order terms, for `ZaryaConfig.sequential_convention="mdm"`:

  * the clean half: the example's x0 in Eso-LM's sampling order — prompt, clean answer tokens (in the
    transform's order, shuffled with `noise_sorting` + `sequential_shuffle`), then the masked answer
    tokens left to right — causal within the example;
  * the copy half: at copy index k, a mask with the logical position of clean row k when that token is
    masked (else padding). Copy k sees the clean rows 0 … k−1 of its example and itself, nothing else,
    and targets x0 at its own position (MDM convention, weight 1, counted in L_seq's mean).

So the copy of the j-th masked token sees every clean token and the masked tokens left of it, exactly
the context mode A's sequential step j has. Rows are 2L long and need an arbitrary mask, so this pass
runs the dense attention kernel.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..data.batch import row_layout

Array = jax.Array


def _row(tokens, positions, segment_ids, answer, masked, p_mask, ans_len, *, mask_id: int):
    length = tokens.shape[0]
    lay = row_layout(segment_ids, answer)
    group = jnp.where(answer, jnp.where(masked, 2, 1), 0)
    perm = jax.lax.sort((lay["sort_seg"], group, lay["idx"]), num_keys=3)[2]
    tok, pos, seg = tokens[perm], positions[perm], segment_ids[perm]
    msk, ans, p, n = masked[perm], answer[perm], p_mask[perm], ans_len[perm]
    copy_seg = jnp.where(msk, seg, 0)
    i = jnp.arange(length)
    same = (seg[None, :] == seg[:, None]) & (seg[None, :] > 0)
    causal = i[None, :] <= i[:, None]
    clean_rows = jnp.concatenate([causal & same, jnp.zeros((length, length), bool)], axis=1)
    sees_clean = (i[None, :] < i[:, None]) & (seg[None, :] == copy_seg[:, None]) & (copy_seg[:, None] > 0)
    copy_rows = jnp.concatenate([sees_clean, jnp.eye(length, dtype=bool)], axis=1)
    zeros_f = jnp.zeros((length,), jnp.float32)
    false = jnp.zeros((length,), bool)
    return {
        "tokens": jnp.concatenate([tok, jnp.where(msk, mask_id, 0)]).astype(jnp.int32),
        "positions": jnp.concatenate([pos, pos]).astype(jnp.int32),
        "segment_ids": jnp.concatenate([seg, copy_seg]).astype(jnp.int32),
        "window_mask": jnp.concatenate([clean_rows, copy_rows], axis=0) | jnp.eye(2 * length, dtype=bool),
        "targets": jnp.concatenate([jnp.zeros_like(tok), jnp.where(msk, tok, 0)]).astype(jnp.int32),
        "weights": jnp.concatenate([zeros_f, msk.astype(jnp.float32)]),
        "is_dif": jnp.concatenate([false, false]),
        "answer": jnp.concatenate([ans, false]),
        "masked": jnp.concatenate([msk, false]),
        "p_mask": jnp.concatenate([p, zeros_f]),
        "ans_len": jnp.concatenate([n, zeros_f]),
    }


def reconstruction_rows(seq: dict, mask_id: int) -> dict[str, Array]:
    """The reconstruction layout from the noise transform's sequential rows (`seq`: tokens = x0,
    positions, segment_ids, answer, masked, p_mask, ans_len, [R, L]). Returns [R, 2L] rows: tokens,
    positions, segment_ids, targets int32; window_mask bool [R, 2L, 2L]; weights f32 (1 on masked copies);
    is_dif, answer, masked bool; p_mask, ans_len f32; num_examples 0 and primary False (per-example
    statistics are counted on the diffusion rows)."""
    out = jax.vmap(lambda *a: _row(*a, mask_id=int(mask_id)))(
        seq["tokens"], seq["positions"], seq["segment_ids"], seq["answer"], seq["masked"], seq["p_mask"],
        seq["ans_len"])
    r = seq["tokens"].shape[0]
    out["num_examples"] = jnp.zeros((r,), jnp.int32)
    out["primary"] = jnp.zeros((r,), bool)
    return out
