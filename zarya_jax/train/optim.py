"""Optimizer: optax AdamW with warmup + cosine / constant / WSD schedules, weight-decay masks,
global-norm clipping and frozen subtrees.

Freezing: leaves whose path matches any `freeze` pattern get `optax.set_to_zero()` (no update, no
Adam state); clipping and AdamW see only the trainable leaves (`optax.multi_transform`), so the
global norm is over what is trained. A wholly separate frozen tree (e.g. the AR base under a LoRA
drafter) is better passed to the trainer as `frozen` params: it then gets no gradient at all.

Gradient accumulation is done by the train step (a scan over micro-batches inside one jitted
step, see `train/step.py`), not here; `grad_accum_steps` lives in this config because it is an
optimization knob.
"""
from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import optax

from ..config import ConfigError
from .sharding import path_str

SCHEDULES = ("cosine", "constant", "wsd")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW hyperparameters. Patterns are regexes searched in the param path ('layers/q_proj/kernel').

    schedule: 'cosine' (warmup then cosine to min_lr_ratio·lr), 'constant' (warmup then flat), or
    'wsd' (warmup, stable, then a linear decay to min_lr_ratio·lr over the last `decay_fraction`).
    """

    lr: float = 3e-4
    warmup_steps: int = 100
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    decay_fraction: float = 0.2
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    no_decay: tuple[str, ...] = ("norm", "embed")
    freeze: tuple[str, ...] = ()
    clip_norm: float = 1.0
    grad_accum_steps: int = 1

    def __post_init__(self):
        object.__setattr__(self, "no_decay", tuple(self.no_decay))
        object.__setattr__(self, "freeze", tuple(self.freeze))
        if not (self.lr >= 0 and math.isfinite(self.lr)):
            raise ConfigError(f"optim.lr={self.lr}: expected a finite value ≥ 0")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps}: expected ≥ 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio={self.min_lr_ratio}: expected [0, 1]")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"optim.decay_fraction={self.decay_fraction}: expected (0, 1]")
        if self.clip_norm < 0:
            raise ConfigError(f"optim.clip_norm={self.clip_norm}: expected ≥ 0 (0 disables clipping)")
        if self.grad_accum_steps < 1:
            raise ConfigError(f"optim.grad_accum_steps={self.grad_accum_steps}: expected ≥ 1")
        for p in self.no_decay + self.freeze:
            try:
                re.compile(p)
            except re.error as e:
                raise ConfigError(f"optim pattern {p!r} is not a valid regex: {e}") from None


def make_schedule(config: OptimConfig, total_steps: int) -> optax.Schedule:
    """Learning rate as a function of the optimizer step."""
    lr, warm = config.lr, min(config.warmup_steps, max(total_steps - 1, 0))
    end = lr * config.min_lr_ratio
    warmup = optax.linear_schedule(0.0, lr, warm) if warm else optax.constant_schedule(lr)
    rest = max(total_steps - warm, 1)
    if config.schedule == "constant":
        main = optax.constant_schedule(lr)
    elif config.schedule == "cosine":
        main = optax.cosine_decay_schedule(lr, rest, alpha=config.min_lr_ratio)
    else:  # wsd: stable, then linear decay over the last decay_fraction of the run
        decay = max(int(round(config.decay_fraction * total_steps)), 1)
        stable = max(rest - decay, 0)
        main = optax.join_schedules(
            [optax.constant_schedule(lr), optax.linear_schedule(lr, end, decay)], [stable])
    return optax.join_schedules([warmup, main], [warm]) if warm else main


def _matches(path: str, patterns) -> bool:
    return any(re.search(p, path) for p in patterns)


def decay_mask(params, config: OptimConfig):
    """True where weight decay applies: every leaf whose path matches no `no_decay` pattern.
    (Used as a callable mask so it also works on the partial trees `multi_transform` passes.)"""
    return jax.tree_util.tree_map_with_path(lambda p, _: not _matches(path_str(p), config.no_decay), params)


def trainable_labels(params, config: OptimConfig):
    """'train' or 'freeze' per leaf, from the `freeze` patterns."""
    labels = jax.tree_util.tree_map_with_path(
        lambda p, _: "freeze" if _matches(path_str(p), config.freeze) else "train", params)
    if config.freeze and "train" not in jax.tree_util.tree_leaves(labels):
        raise ConfigError(f"optim.freeze={config.freeze} freezes every parameter: nothing left to train")
    return labels


def make_optimizer(config: OptimConfig, total_steps: int, params) -> optax.GradientTransformation:
    """clip → AdamW (fp32 moments, decoupled decay under `decay_mask`), frozen leaves set to zero."""
    inner = []
    if config.clip_norm > 0:
        inner.append(optax.clip_by_global_norm(config.clip_norm))
    inner.append(optax.adamw(make_schedule(config, total_steps), b1=config.b1, b2=config.b2, eps=config.eps,
                             mu_dtype=jnp.float32, weight_decay=config.weight_decay,
                             mask=lambda tree: decay_mask(tree, config)))
    train = optax.chain(*inner)
    if not config.freeze:
        return train
    return optax.multi_transform({"train": train, "freeze": optax.set_to_zero()},
                                 trainable_labels(params, config))
