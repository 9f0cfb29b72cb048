"""A draft model distilled from a frozen base (docs/algorithms.md §7.6): the TV loss of Uno's drafter, between
two models instead of two rows of one.

The student (the trainable params, a small Qwen3 with the base's vocabulary) and the teacher (the
frozen base) each run one causal pass over the same clean tokens. On every row that predicts an
answer token (`objectives.ar.next_token_targets`), with q the student's next-token distribution and p
the teacher's (a constant):
`tv_weight·Σ_v |q − sg(p)| + ce_weight·(−log q(x_{i+1})) + kl_weight·KL(q ‖ sg(p))`,
averaged over those rows (`losses.head_draft_row_losses`, the mask token removed from both). 1 − ½Σ|q − p|
is the probability that a draft from q is accepted against p, reported as `accept_proxy`. The
student is exported as a normal checkpoint, like any AR model.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ..config import ConfigError, ModelConfig
from .. import checkpoint
from .. import model as model_lib
from .ar import next_token_targets
from .base import Objective
from .losses import head_draft_row_losses, head_weights

LOSSES = ("ntp", "tv")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """How a draft model is trained: `loss` "ntp" (plain next-token cross-entropy on the data, the AR
    trainer) or "tv" (distilled from the base: the weights below)."""

    loss: str = "tv"
    tv_weight: float = 1.0
    ce_weight: float = 0.0
    kl_weight: float = 0.0

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ConfigError(f"draft.loss={self.loss!r}: expected one of {LOSSES}")
        for name in ("tv_weight", "ce_weight", "kl_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"draft.{name}={getattr(self, name)}: expected ≥ 0")
        if self.loss == "tv" and self.tv_weight + self.ce_weight + self.kl_weight == 0:
            raise ConfigError("draft: tv_weight, ce_weight and kl_weight are all 0; nothing to train")


def distill_loss(student_params, teacher_params, student: ModelConfig, teacher: ModelConfig, batch: dict,
                 cfg: DistillConfig) -> tuple[jax.Array, dict]:
    """(loss, metrics {'tv', 'ce', 'kl', 'accept_proxy', 'rows'}) of the student against the frozen teacher
    on a supervised batch (`data.batch` layout); differentiable in `student_params` only."""
    targets, rows = next_token_targets(batch)

    def hidden_of(params, config):
        return model_lib.apply(params, config, batch["tokens"], batch["positions"],
                               segment_ids=batch["segment_ids"], return_hidden=True)[0]

    # each model's hidden states, projected through its own head a block of positions at a time: no
    # [B, L, V] logits of either
    hq = hidden_of(student_params, student)
    hp = jax.lax.stop_gradient(hidden_of(teacher_params, teacher))
    # the student's head (tied: its embedding) takes a gradient: both heads go through `map_head_blocks`,
    # so it is summed over the batch once per step, not once per block
    weights = {"q": head_weights(student_params, student),
               "p": jax.lax.stop_gradient(head_weights(teacher_params, teacher))}
    tv_row, ce_row, kl_row = head_draft_row_losses(
        lambda w, h: model_lib.lm_head(w["q"], student, h), hq, lambda w, h: model_lib.lm_head(w["p"], teacher, h),
        hp, targets, student.mask_token_id, weights=weights)
    w = rows.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    tv, ce, kl = ((x * w).sum() / n for x in (tv_row, ce_row, kl_row))
    loss = cfg.tv_weight * tv + cfg.ce_weight * ce + cfg.kl_weight * kl
    return loss, {"tv": tv, "ce": ce, "kl": kl, "accept_proxy": 1.0 - 0.5 * tv, "rows": w.sum()}


def distill_objective(student: ModelConfig, teacher: ModelConfig, cfg: DistillConfig) -> Objective:
    """An `Objective`: trainable = the student, frozen = the teacher's params; exports the student as a
    `zarya_jax.checkpoint`."""
    if student.vocab_size != teacher.vocab_size or student.mask_token_id != teacher.mask_token_id:
        raise ConfigError(f"the student (vocab_size={student.vocab_size}, mask_token_id={student.mask_token_id}) "
                          f"must read the teacher's ids (vocab_size={teacher.vocab_size}, "
                          f"mask_token_id={teacher.mask_token_id})")

    def loss_fn(params, frozen, batch, key, info):
        return distill_loss(params, frozen, student, teacher, batch, cfg)

    def export(params, path, tokenizer, prompt_format):
        return checkpoint.save(path, params, student, overwrite=True, tokenizer=tokenizer, prompt_format=prompt_format)

    # in the student's units (the MFU estimate): its own training pass plus the teacher's forward, a third
    # of a training pass of the teacher's size
    return Objective(loss_fn, forward_passes=1.0 + teacher.num_params() / (3 * max(student.num_params(), 1)),
                     name="distill", export=export)
