"""The `Objective` protocol: what the objective-agnostic trainer (`zarya_jax.train`) runs.

An objective supplies `loss_fn(trainable, frozen, batch, key, info) -> (loss, metrics)` and, per step,
a hashable static value (`static_at(step, total_steps)`, e.g. Zarya's slot size, docs/algorithms.md §2.1) that fixes
shapes: one compile per distinct value. Only `trainable` gets gradients and optimizer state; `frozen`
(e.g. the AR base under a LoRA drafter, docs/algorithms.md §7) is passed through. An objective whose trainable params
are a whole model says how to save them (`export`), and the trainer then writes them to WORKDIR/final.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable

import jax


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a loss function knows about the step: `step` (traced int32), the static value of this
    compile (`static`, e.g. the slot size) and the run length."""

    step: jax.Array
    static: Any
    total_steps: int


def _no_static(step: int, total_steps: int) -> Hashable:
    return None


@dataclasses.dataclass(frozen=True)
class Objective:
    """A training objective. `loss_fn(trainable, frozen, batch, key, info: StepInfo) -> (loss, metrics)`
    with scalar fp32 loss and a dict of scalar metrics; `forward_passes` (per example, for the MFU
    estimate); `export(params, path, tokenizer, prompt_format) -> path`: saves the trained params as a
    model checkpoint with the tokenizer and the `PromptFormat` the data was rendered with (None: the
    caller decides what to keep, e.g. an adapter)."""

    loss_fn: Callable[..., tuple[jax.Array, dict]]
    static_at: Callable[[int, int], Hashable] = _no_static
    forward_passes: float = 1.0
    name: str = "custom"
    export: Callable[[Any, str, Any, Any], str] | None = None
