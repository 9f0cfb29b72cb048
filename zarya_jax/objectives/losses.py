"""Zarya's hybrid loss (SPEC §2.6, §3.5; paper eq. 1): L = λ·L_dif + (1 − λ)·L_seq, in fp32.

  L_seq  mean cross-entropy over the AR-convention targets of the batch (clean-slot next tokens, or
         the sequential pass's masked positions);
  L_dif  Σ weight·CE over the MDM-convention targets of each example, divided by the example's number
         of answer tokens, then the mean over the examples that have an answer (weight = 1/p_mask,
         or the ELBO weight).

`zarya_loss` runs the transform (slotted or not, per `ZaryaConfig.slotted_training`), the model and
the loss; `loss_from_logits` is the loss alone, given the transform's outputs and the logits. With
`sequential_convention="mdm"` (non-slotted) the sequential rows are replaced by Eso-LM's reconstruction
rows (`objectives.reconstruction`), run in a second forward of their own shape; both parts are
flattened into one set of per-token arrays before the loss.
"""
from __future__ import annotations

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
    """Transform (SPEC §2 or §3) → model → loss. Returns (scalar fp32 loss, metrics dict of scalars).

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
    rec = reconstruction_rows({k: v[0::2] for k, v in inputs.items()}, mask_id_of(model_config))
    parts = [(dif, logits_of(dif, segment_ids=dif["segment_ids"])),
             (rec, logits_of(rec, window_mask=rec["window_mask"]))]
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
