"""Slot-size curriculum (docs/algorithms.md §2.1, paper §4.1.1).

The slot size at a step is `slot_size_set[i]` for the first i with `progress <= slot_step_borders[i]`;
progress is `step / total_steps` when every border is <= 1 (fractions of training), else the raw
step (absolute borders). Past the last border the last size is kept.

The slotted transform's shapes do not depend on the slot size: pass `slot_size_at` as a static int
(one compile per distinct size, at most `len(slot_size_set)`) or `slot_size_at_traced` as a traced
int32 (one compile for the whole curriculum).
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from ..config import ConfigError, ZaryaConfig


def borders_are_fractions(zarya_config: ZaryaConfig) -> bool:
    return max(zarya_config.slot_step_borders) <= 1.0


def _check(step, total_steps):
    if not isinstance(total_steps, (int, float)) or total_steps <= 0:
        raise ConfigError(f"total_steps={total_steps!r}: expected a positive number of steps")
    if step < 0:
        raise ConfigError(f"step={step!r}: expected a non-negative step")


def slot_index_at(zarya_config: ZaryaConfig, step: int, total_steps: int) -> int:
    """Index into `slot_size_set` at a (Python int) step."""
    _check(step, total_steps)
    progress = step / total_steps if borders_are_fractions(zarya_config) else step
    for i, border in enumerate(zarya_config.slot_step_borders):
        if progress <= border:
            return i
    return len(zarya_config.slot_size_set) - 1


def slot_size_at(zarya_config: ZaryaConfig, step: int, total_steps: int) -> int:
    """Slot size (static int) at a Python int step; see the module docstring."""
    return zarya_config.slot_size_set[slot_index_at(zarya_config, step, total_steps)]


def last_steps(zarya_config: ZaryaConfig, total_steps: int) -> list[int]:
    """The last step of each curriculum stage (exact: the same comparison as `slot_index_at`); may be
    negative for a stage that never occurs."""
    _check(0, total_steps)
    fractions = borders_are_fractions(zarya_config)
    out = []
    for border in zarya_config.slot_step_borders:
        def inside(step):
            return (step / total_steps if fractions else step) <= border
        guess = math.floor(border * total_steps) if fractions else math.floor(border)
        while inside(guess + 1):
            guess += 1
        while not inside(guess) and guess >= 0:
            guess -= 1
        out.append(guess)
    return out


def slot_size_at_traced(zarya_config: ZaryaConfig, step, total_steps: int):
    """Same as `slot_size_at` for a traced int step, or an array of steps (total_steps static). The result
    is an array, so it cannot set shapes; use it for logging or a `lax.switch` over the static sizes."""
    ends = jnp.asarray(last_steps(zarya_config, total_steps)[:-1], jnp.int32)
    sizes = jnp.asarray(zarya_config.slot_size_set, jnp.int32)
    step = jnp.asarray(step, jnp.int32)
    return sizes[jnp.sum(step[..., None] > ends, axis=-1)]


def schedule(zarya_config: ZaryaConfig, total_steps: int) -> list[tuple[int, int]]:
    """[(first_step, slot_size), …] for steps 0 … total_steps-1, one entry per stage that occurs."""
    out: list[tuple[int, int]] = []
    first = 0
    ends = last_steps(zarya_config, total_steps)
    for i, size in enumerate(zarya_config.slot_size_set):
        # past the last border the last size is kept
        end = min(ends[i], total_steps - 1) if i < len(ends) - 1 else total_steps - 1
        if end >= first:
            out.append((first, size))
            first = end + 1
    return out
