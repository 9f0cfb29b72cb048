"""Zarya's hybrid loss (docs/algorithms.md §2.6, §3.5; paper eq. 1): L = λ·L_dif + (1 − λ)·L_seq, in fp32.

  L_seq  mean cross-entropy over the AR-convention targets of the batch (clean-slot next tokens, or
         the sequential pass's masked positions);
  L_dif  Σ weight·CE over the MDM-convention targets of each example, divided by the example's number
         of answer tokens, then the mean over the examples that have an answer (weight = 1/p_mask,
         or the ELBO weight).

`zarya_loss` runs the transform (slotted or not, per `ZaryaConfig.slotted_training`), the model and
the loss; `loss_from_logits` is the loss alone, given the transform's outputs and the logits. With
`sequential_convention="mdm"` (non-slotted) the sequential rows are replaced by Eso-LM's reconstruction
rows (`objectives.reconstruction`), run in a second forward of their own shape; with "both" the AR-convention
sequential rows are kept as a third part. The parts are flattened into one set of per-token arrays before
the loss, so `L_seq` is the mean over the AR and the reconstruction targets together.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from ..config import ConfigError, ModelConfig, ZaryaConfig
from ..nn import model as model_lib
from .noise import noise_transform
from .reconstruction import reconstruction_rows
from .slots import slotted_transform

Array = jax.Array


def mask_id_of(model_config: ModelConfig) -> int:
    if model_config.mask_token_id is None:
        raise ConfigError("ModelConfig.mask_token_id is None: the Zarya objectives need the <mdm_mask> token "
                          "id; add the mask token to the vocabulary and set mask_token_id")
    return int(model_config.mask_token_id)


def transform(key: Array, batch: dict, zarya_config: ZaryaConfig, slot_size: int, mask_id: int) -> dict:
    """The training transform selected by `zarya_config.slotted_training` (slot_size unused when False)."""
    if zarya_config.slotted_training:
        return slotted_transform(key, batch, zarya_config, slot_size, mask_id)
    return noise_transform(key, batch, zarya_config, mask_id)


def token_cross_entropy(logits: Array, targets: Array) -> tuple[Array, Array]:
    """fp32 CE and argmax hits per token. logits [R, L, V], targets int [R, L] -> ([R, L], [R, L] bool)."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    ce = jax.nn.logsumexp(logits, axis=-1) - picked
    return ce, jnp.argmax(logits, axis=-1) == targets


def _without(z: Array, token_id: int | None) -> Array:
    """fp32 logits with column `token_id` at -inf, as a fusable select (no scattered copy of [.., V])."""
    z = z.astype(jnp.float32)
    if token_id is None:
        return z
    return jnp.where(jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1) == token_id, -jnp.inf, z)


def _row_chunk(length: int, most: int = 64) -> int:
    """The largest divisor of `length` that is at most `most`: rows per step of the chunked passes."""
    return max(c for c in range(1, min(length, most) + 1) if length % c == 0)


def _map_row_chunks(fn, logits: Array, targets: Array):
    """fn(zq [c, V], zp [c, V], targets [c]) over the paired rows of logits [B, 2L, V] in chunks of c rows
    (`lax.map`, each chunk sliced from the logits in place), so no [B, L, V] intermediate exists at once.
    Returns fn's outputs stacked back to [B, L, ...]."""
    b, two_l, v = logits.shape
    length = two_l // 2
    c = _row_chunk(length)

    def body(i):
        row, start = i // (length // c), (i % (length // c)) * c
        zq = jax.lax.dynamic_slice(logits, (row, start, 0), (1, c, v))[0]
        zp = jax.lax.dynamic_slice(logits, (row, length + start, 0), (1, c, v))[0]
        return fn(zq, zp, jax.lax.dynamic_slice(targets, (row, start), (1, c))[0])

    out = jax.lax.map(body, jnp.arange(b * (length // c)))
    return jax.tree.map(lambda x: x.reshape((b, length) + x.shape[2:]), out)


def _chunk_terms(zq, zp, targets, exclude_id):
    """TV, CE, KL and the backward's statistics of c paired rows (zq, zp [c, V])."""
    zq, zp = _without(zq, exclude_id), _without(zp, exclude_id)
    lse_q = jax.nn.logsumexp(zq, axis=-1, keepdims=True)
    lse_p = jax.nn.logsumexp(zp, axis=-1, keepdims=True)
    q, p = jnp.exp(zq - lse_q), jnp.exp(zp - lse_p)
    tv = jnp.sum(jnp.abs(q - p), axis=-1)
    ce = lse_q[..., 0] - jnp.take_along_axis(zq, targets[..., None], axis=-1)[..., 0]
    # log q − log p where q > 0 (0·(−inf) at the excluded column would be NaN)
    log_ratio = jnp.where(q > 0, (zq - lse_q) - jnp.where(p > 0, zp - lse_p, 0.0), 0.0)
    kl = jnp.sum(q * log_ratio, axis=-1)
    q_sign = jnp.sum(q * jnp.sign(q - p), axis=-1)
    return tv, ce, kl, lse_q[..., 0], lse_p[..., 0], q_sign


def _chunk_grad(zq, zp, targets, exclude_id, stats, cotangents):
    """d(g_tv·TV + g_ce·CE + g_kl·KL)/dz_q of c rows, from the forward's per-row statistics."""
    lse_q, lse_p, q_sign, kl = (x[..., None] for x in stats)
    g_tv, g_ce, g_kl = (g[..., None] for g in cotangents)
    zq, zp = _without(zq, exclude_id), _without(zp, exclude_id)
    q, p = jnp.exp(zq - lse_q), jnp.exp(zp - lse_p)
    log_ratio = jnp.where(q > 0, (zq - lse_q) - jnp.where(p > 0, zp - lse_p, 0.0), 0.0)
    onehot = jax.lax.broadcasted_iota(jnp.int32, zq.shape, zq.ndim - 1) == targets[..., None]
    return q * (g_tv * (jnp.sign(q - p) - q_sign) + g_ce + g_kl * (log_ratio - kl)) - jnp.where(onehot, g_ce, 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def draft_row_losses(logits: Array, targets: Array, exclude_id: int | None = None):
    """Uno's drafter terms per row (docs/algorithms.md §7) from paired logits [B, 2L, V]: rows 0..L-1 the draft q, rows
    L..2L-1 the target p (a constant: no gradient flows to it); targets int [B, L]. Returns
    (Σ_v |q − p|, −log q(target), KL(q ‖ p)) as three [B, L] fp32 arrays, each softmax over the
    vocabulary with `exclude_id` (the mask token) removed.

    Chunked for a large vocabulary: forward and backward run over chunks of rows, and the backward
    recomputes q and p from the logits and writes the gradient directly, so the only [B, 2L, V] float32
    array made is the gradient itself (d/dz_q: g_tv·q(s − Σqs) + g_ce·(q − onehot) + g_kl·q(log q/p − KL),
    s = sign(q − p); zero on the p rows).
    """
    return _draft_fwd(logits, targets, exclude_id)[0]


def _draft_fwd(logits, targets, exclude_id):
    tv, ce, kl, lse_q, lse_p, q_sign = _map_row_chunks(
        lambda zq, zp, t: _chunk_terms(zq, zp, t, exclude_id), logits, targets)
    return (tv, ce, kl), (logits, targets, (lse_q, lse_p, q_sign, kl))


def _draft_bwd(exclude_id, res, cotangents):
    logits, targets, stats = res
    b, two_l, v = logits.shape
    length = two_l // 2
    c = _row_chunk(length)
    per_row = jnp.stack([*stats, *cotangents], axis=-1)  # [B, L, 7]

    def body(i, grad):
        row, start = i // (length // c), (i % (length // c)) * c
        zq = jax.lax.dynamic_slice(logits, (row, start, 0), (1, c, v))[0]
        zp = jax.lax.dynamic_slice(logits, (row, length + start, 0), (1, c, v))[0]
        t = jax.lax.dynamic_slice(targets, (row, start), (1, c))[0]
        x = jax.lax.dynamic_slice(per_row, (row, start, 0), (1, c, 7))[0]
        g = _chunk_grad(zq, zp, t, exclude_id, tuple(x[:, k] for k in range(4)), tuple(x[:, k] for k in range(4, 7)))
        return jax.lax.dynamic_update_slice(grad, g[None].astype(grad.dtype), (row, start, 0))

    grad = jax.lax.fori_loop(0, b * (length // c), body, jnp.zeros_like(logits))
    return grad, None


draft_row_losses.defvjp(_draft_fwd, _draft_bwd)


def loss_from_logits(logits: Array, inputs: dict, zarya_config: ZaryaConfig, slot_size: int = 0):
    """Loss and metrics from logits [R, L, V] in the physical order of `inputs` (a transform's output)."""
    ce, hit = token_cross_entropy(logits, inputs["targets"])
    return loss_from_token_ce(ce, hit, inputs, zarya_config, slot_size)


def loss_from_token_ce(ce: Array, hit: Array, inputs: dict, zarya_config: ZaryaConfig, slot_size: int = 0):
    """`loss_from_logits` given per-token CE and hits [R, L] (`inputs["primary"]` [R] or [R, L])."""
    w = inputs["weights"].astype(jnp.float32)
    has = w > 0
    seq = has & ~inputs["is_dif"]
    dif = has & inputs["is_dif"]
    f32 = lambda x: x.astype(jnp.float32)
    n_seq = jnp.sum(seq)
    n_dif = jnp.sum(dif)
    n_ex = jnp.sum(inputs["num_examples"])
    loss_seq = jnp.sum(jnp.where(seq, ce, 0.0)) / jnp.maximum(n_seq, 1)
    per_token = jnp.where(dif, w * ce / jnp.maximum(inputs["ans_len"], 1.0), 0.0)
    loss_dif = jnp.sum(per_token) / jnp.maximum(n_ex, 1)
    lam = zarya_config.diffusion_loss_proportion
    # λ ∈ {0, 1} keeps exactly one term (no 0·x, which would still carry a NaN/inf from the other).
    if lam == 1.0:
        loss = loss_dif
    elif lam == 0.0:
        loss = loss_seq
    else:
        loss = lam * loss_dif + (1.0 - lam) * loss_seq

    primary = inputs["primary"]
    primary = jnp.broadcast_to(primary[:, None] if primary.ndim == 1 else primary, inputs["answer"].shape)
    answer = inputs["answer"] & primary
    n_answer = jnp.sum(answer)
    metrics = {
        "loss": loss, "loss_seq": loss_seq, "loss_dif": loss_dif,
        "acc_seq": jnp.sum(seq & hit) / jnp.maximum(n_seq, 1),
        "acc_dif": jnp.sum(dif & hit) / jnp.maximum(n_dif, 1),
        "mask_ratio": jnp.sum(inputs["masked"] & answer) / jnp.maximum(n_answer, 1),
        "mean_p_mask": jnp.sum(jnp.where(answer, inputs["p_mask"], 0.0)) / jnp.maximum(n_answer, 1),
        "slot_size": jnp.asarray(slot_size if zarya_config.slotted_training else 0),
        "num_seq_targets": n_seq, "num_dif_targets": n_dif, "num_answer_tokens": n_answer,
        "num_examples": n_ex,
    }
    return loss.astype(jnp.float32), {k: f32(v) for k, v in metrics.items()}


def zarya_loss(params, model_config: ModelConfig, zarya_config: ZaryaConfig, batch: dict, key: Array,
               slot_size: int, *, apply_fn: Callable | None = None):
    """Transform (docs/algorithms.md §2 or §3) → model → loss. Returns (scalar fp32 loss, metrics dict of scalars).

    batch: [B, L] arrays (see `data/batch.py`); key: this step's key (e.g. fold_in(run_key, step));
    slot_size: static int, or a traced int32 scalar (one compile for the whole curriculum; ignored when
    not slotted). apply_fn(params, model_config, tokens, positions,
    segment_ids=...) -> (logits, …) like `model.apply` (the default); use it for remat/sharded variants.
    The model attends causally within the transform's physical-order segments (the transform's
    `window_mask`, `masks.segment_causal`), through the kernel `model_config.attention` picks.
    Use under `jax.value_and_grad(zarya_loss, has_aux=True)` with the configs (and an int slot_size) static.
    """
    inputs = transform(key, batch, zarya_config, slot_size, mask_id_of(model_config))
    apply_fn = model_lib.apply if apply_fn is None else apply_fn

    def logits_of(rows, **attention):
        out = apply_fn(params, model_config, rows["tokens"], rows["positions"], **attention)
        return out[0] if isinstance(out, tuple) else out

    if zarya_config.slotted_training or zarya_config.sequential_convention == "ar":
        return loss_from_logits(logits_of(inputs, segment_ids=inputs["segment_ids"]), inputs, zarya_config,
                                slot_size)
    # Rows 2b are the sequential pass (x0), 2b + 1 the diffusion pass (see `noise_transform`).
    dif = {k: v[1::2] for k, v in inputs.items() if k != "window_mask"}
    seq = {k: v[0::2] for k, v in inputs.items() if k != "window_mask"}
    rec = reconstruction_rows(seq, mask_id_of(model_config))
    parts = [(dif, logits_of(dif, segment_ids=dif["segment_ids"])),
             (rec, logits_of(rec, window_mask=rec["window_mask"]))]
    if zarya_config.sequential_convention == "both":
        parts.append((seq, logits_of(seq, segment_ids=seq["segment_ids"])))
    return loss_from_flat(parts, zarya_config)


def loss_from_flat(parts, zarya_config: ZaryaConfig):
    """The loss over several (inputs, logits) parts of different shapes, as one row of all their tokens."""
    fields = ("weights", "is_dif", "answer", "masked", "p_mask", "ans_len")
    ces, hits, flat = [], [], {k: [] for k in fields + ("primary",)}
    for rows, logits in parts:
        ce, hit = token_cross_entropy(logits, rows["targets"])
        ces.append(ce.reshape(-1))
        hits.append(hit.reshape(-1))
        for k in fields:
            flat[k].append(rows[k].reshape(-1))
        flat["primary"].append(jnp.broadcast_to(rows["primary"][:, None], rows["answer"].shape).reshape(-1))
    merged = {k: jnp.concatenate(v)[None] for k, v in flat.items()}
    merged["num_examples"] = sum(jnp.sum(rows["num_examples"]) for rows, _ in parts)[None]
    return loss_from_token_ce(jnp.concatenate(ces)[None], jnp.concatenate(hits)[None], merged, zarya_config)
