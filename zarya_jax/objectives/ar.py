"""Plain next-token loss on the answer: the AR-only baseline that Zarya's hybrid objective is measured
against (same model, data and budget; `train.objective=ar`).

Every answer token is predicted by the row before it (the last prompt token predicts the first answer
token) over the clean text, causal within each packed example; the loss is the mean cross-entropy over
those targets — Zarya's L_seq with every answer token clean and no MDM term. The params are a whole model
and are exported as a `zarya_jax.checkpoint` (any checkpoint runs in any decoding mode).
"""
from __future__ import annotations


import jax.numpy as jnp

from ..config import ModelConfig
from .. import checkpoint
from .. import model as model_lib
from .base import Objective
from .losses import head_token_cross_entropy


def next_token_targets(batch: dict):
    """(targets int32 [B, L], has bool [B, L]): row i predicts token i + 1 when that token is an answer
    token of the same example."""
    ans = jnp.asarray(batch["answer_mask"], bool)
    seg = batch["segment_ids"]
    tokens = batch["tokens"]
    none = jnp.zeros_like(ans[:, :1])
    has = jnp.concatenate([ans[:, 1:] & (seg[:, 1:] == seg[:, :-1]), none], axis=1) & (seg > 0)
    targets = jnp.concatenate([tokens[:, 1:], tokens[:, :1]], axis=1).astype(jnp.int32)
    return targets, has


def ar_objective(model_config: ModelConfig) -> Objective:
    """Mean next-token cross-entropy over the answer tokens (module doc)."""

    def loss_fn(params, frozen, batch, key, info):
        targets, has = next_token_targets(batch)
        hidden, _ = model_lib.apply(params, model_config, batch["tokens"], batch["positions"],
                                    segment_ids=batch["segment_ids"], return_hidden=True)
        # block by block over the vocabulary projection: no [B, L, V] logits
        ce, hit = head_token_cross_entropy(params, model_config, hidden, targets)
        n = jnp.maximum(jnp.sum(has), 1)
        loss = jnp.sum(jnp.where(has, ce, 0.0)) / n
        return loss, {"loss_seq": loss, "acc_seq": jnp.sum(has & hit) / n, "num_seq_targets": jnp.sum(has)}

    def export(params, path, tokenizer, prompt_format):
        return checkpoint.save(path, params, model_config, overwrite=True, tokenizer=tokenizer,
                               prompt_format=prompt_format)

    return Objective(loss_fn, name="ar", export=export)
