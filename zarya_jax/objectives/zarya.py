"""Zarya's hybrid AR + MDM objective (docs/algorithms.md §2–§3) as an `Objective` for the trainer.

Slotted training (the default) reads the curriculum's slot size (docs/algorithms.md §2.1) as a traced value
of the step: no shape depends on it, so the whole curriculum runs one compiled step; the
non-slotted (Eso-LM style) objective runs a sequential and a diffusion pass per example (docs/algorithms.md §3.3).
The trained params are a whole model, so the objective exports them as a `zarya_jax.checkpoint` with
the Zarya hyperparameters.
"""
from __future__ import annotations

from ..config import ModelConfig, ZaryaConfig
from .. import checkpoint
from . import curriculum, losses
from .base import Objective


def zarya_objective(model_config: ModelConfig, zarya_config: ZaryaConfig) -> Objective:
    """Zarya's hybrid loss (docs/algorithms.md §2–§3); the slot size follows the curriculum (docs/algorithms.md §2.1)."""

    def loss_fn(params, frozen, batch, key, info):
        slot_size = (curriculum.slot_size_at_traced(zarya_config, info.step, info.total_steps)
                     if zarya_config.slotted_training else 0)
        return losses.zarya_loss(params, model_config, zarya_config, batch, key, slot_size)

    def export(params, path, tokenizer, prompt_format):
        return checkpoint.save(path, params, model_config, zarya_config, overwrite=True, tokenizer=tokenizer,
                               prompt_format=prompt_format)

    if zarya_config.slotted_training:
        return Objective(loss_fn, forward_passes=1.0, name="zarya-slotted", export=export)
    # The non-slotted objective runs a sequential and a diffusion pass (docs/algorithms.md §3.3); the reconstruction
    # rows of the MDM convention are twice as long, and "both" keeps the AR pass beside them.
    passes = {"ar": 2.0, "mdm": 3.0, "both": 4.0}[zarya_config.sequential_convention]
    return Objective(loss_fn, lambda step, total: 0, passes, "zarya-eso", export)
