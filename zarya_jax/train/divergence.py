"""Divergence detection beside the NaN guard: stop a run that is going wrong while its numbers are finite.

The train step already refuses a non-finite loss, gradient or updated params (`step.NonFiniteError`,
the state is left untouched). A run can also diverge with every number finite: a learning rate far too
high blows the weights up (the activations saturate and the gradient vanishes), or the loss jumps far
above where it was. `DivergenceDetector` watches each step's host metrics, in step order, before any
hook sees the step, so a diverged state is never checkpointed or exported. It stops the run when

- the gradient norm is exactly zero for `zero_grad_steps` consecutive steps (saturated or dead);
- the loss exceeds both `loss_spike_factor` × and `loss_spike_margin` + the median of the last
  `loss_window` step losses (after `MIN_HISTORY` steps; a falling loss never trips it, and the margin
  keeps the relative noise of a loss near zero from tripping it);
- the global norm of the updated params exceeds `param_growth` × its value when this process started
  the run (fresh or resumed): the weights are exploding.

Each threshold is a field of `DivergenceConfig` (`train.divergence.*` on the command line); 0 turns
that check off. The defaults leave a healthy run alone (the quickstart's, loss 5 → 0.02 with warmup
and a slot-size curriculum, stays far from every threshold) and stop a learning rate of 1e6 at its
first step.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import statistics

from ..config import ConfigError

MIN_HISTORY = 10  # losses seen before the spike check starts


class DivergenceError(FloatingPointError):
    """Training stopped because the run diverged; the state of the diverged step was not saved."""


@dataclasses.dataclass(frozen=True)
class DivergenceConfig:
    """Thresholds of the divergence checks (0 = that check off)."""

    zero_grad_steps: int = 5
    loss_spike_factor: float = 10.0
    loss_spike_margin: float = 1.0
    loss_window: int = 100
    param_growth: float = 100.0

    def __post_init__(self):
        for name in ("zero_grad_steps", "loss_window"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.divergence.{name}={getattr(self, name)}: expected ≥ 0")
        for name in ("loss_spike_factor", "loss_spike_margin", "param_growth"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"train.divergence.{name}={value}: expected a finite value ≥ 0")
        if 0 < self.param_growth <= 1:
            raise ConfigError(f"train.divergence.param_growth={self.param_growth}: expected > 1 (or 0 = off)")


# Metrics by which an objective reports its curriculum stage (the drafter's block size): a harder stage
# raises the loss by design (Uno's drafter, TV + CE: 0.16 at blocks of 2 to 3.4 at the first step of
# blocks of 4), so the loss history restarts with each stage instead of reading that rise as a spike.
CURRICULUM_METRICS = ("block_size",)


class DivergenceDetector:
    """`check(step, metrics)` -> None while healthy, else the reason the run diverged (one sentence).
    Needs `loss` and `grad_norm`, and `param_norm` (the updated params' global norm) when `param_norm0`
    (the norm of the params the run started from) is given."""

    def __init__(self, config: DivergenceConfig, param_norm0: float | None = None):
        self.config = config
        self.losses: collections.deque[float] = collections.deque(maxlen=max(config.loss_window, 1))
        self.zero_grads = 0
        self.param_norm0 = param_norm0
        self.stage = None

    def check(self, step: int, metrics: dict[str, float]) -> str | None:
        c = self.config
        loss, grad_norm = metrics["loss"], metrics["grad_norm"]
        self.zero_grads = self.zero_grads + 1 if grad_norm == 0.0 else 0
        if c.zero_grad_steps and self.zero_grads >= c.zero_grad_steps:
            return (f"the gradient norm has been exactly 0 for {self.zero_grads} steps "
                    f"(train.divergence.zero_grad_steps={c.zero_grad_steps}): the weights no longer learn")
        stage = tuple(metrics.get(k) for k in CURRICULUM_METRICS)
        if stage != self.stage:  # a curriculum stage starts: its loss is not comparable to the last one's
            self.losses.clear()
            self.stage = stage
        if c.loss_spike_factor and c.loss_window and len(self.losses) >= MIN_HISTORY:
            median = statistics.median(self.losses)
            limit = max(c.loss_spike_factor * median, median + c.loss_spike_margin)
            if loss > limit:
                return (f"the loss {loss:.4g} is far above its running median {median:.4g} over the last "
                        f"{len(self.losses)} steps (limit {limit:.4g}: train.divergence.loss_spike_factor="
                        f"{c.loss_spike_factor}, loss_spike_margin={c.loss_spike_margin})")
        self.losses.append(loss)
        norm = metrics.get("param_norm")
        if norm is not None and c.param_growth and self.param_norm0:
            if norm > c.param_growth * self.param_norm0:
                return (f"the params' norm grew to {norm:.4g}, {norm / self.param_norm0:.3g}× its value "
                        f"{self.param_norm0:.4g} at the start (train.divergence.param_growth={c.param_growth}): "
                        "the weights are exploding")
        return None
