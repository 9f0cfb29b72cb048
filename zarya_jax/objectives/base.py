"""The `Objective` protocol: what the objective-agnostic trainer (`zarya_jax.train`) runs.

An objective supplies `loss_fn(trainable, frozen, batch, key, info) -> (loss, metrics)` and, per step,
a hashable static value (`static_at(step, total_steps)`, e.g. Zarya's slot size, docs/algorithms.md §2.1) that fixes
shapes: one compile per distinct value, and optionally a carry (extra train state, see `Objective`). Only `trainable` gets gradients and optimizer state; `frozen`
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
    compile (`static`, e.g. the slot size), the run length and the objective's `carry` (None without one)."""

    step: jax.Array
    static: Any
    total_steps: int
    carry: Any = None


def _no_static(step: int, total_steps: int) -> Hashable:
    return None


@dataclasses.dataclass(frozen=True)
class Objective:
    """A training objective. `loss_fn(trainable, frozen, batch, key, info: StepInfo) -> (loss, metrics)`
    with scalar fp32 loss and a dict of scalar metrics; `forward_passes` (per example, for the MFU
    estimate); `export(params, path, tokenizer, prompt_format) -> path`: saves the trained params as a
    model checkpoint with the tokenizer and the `PromptFormat` the data was rendered with (None: the
    caller decides what to keep, e.g. an adapter).

    Carry (optional): state of the objective's own that is not trained but changes with training, e.g. a
    frozen teacher copy of the params refreshed every few steps (`objectives.dcd`). `init_carry(params)`
    builds it from the initial trainable params; `next_carry(carry, params, step)` gives the next one
    from the params and step count after an update. The trainer keeps it in the train state (checkpointed,
    so a resumed run repeats exactly) and hands it to `loss_fn` as `info.carry`."""

    loss_fn: Callable[..., tuple[jax.Array, dict]]
    static_at: Callable[[int, int], Hashable] = _no_static
    forward_passes: float = 1.0
    name: str = "custom"
    export: Callable[[Any, str, Any, Any], str] | None = None
    init_carry: Callable[[Any], Any] | None = None
    next_carry: Callable[[Any, Any, jax.Array], Any] | None = None
