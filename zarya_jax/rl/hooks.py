"""The GRPO run's hooks on the shared loop (`train.hooks`): the update's time and the mean rollout time,
the held-out greedy exact match, and the refreshed arm's drafter. They run before the metrics log (the
loop's early hooks), so what they measure is in the row of its step and in the checkpoint after it."""
from __future__ import annotations

import os
from typing import Callable

import jax
import numpy as np

from .. import lora as lora_lib
from ..train import sharding as shd
from ..train.hooks import Hook, StepEvent
from ..train.step import NonFiniteError, StepCache


class RolloutClock(Hook):
    """Adds `update_s` to each step's metrics: from its batch being ready to the step's end (the end is when
    the next step's rollouts could read its params, or when its metrics reached the host), its compilation
    excluded. Summary: `rollout_s_mean`, the mean rollout time over the steps after the first (whose
    rollouts include compiling the sampler)."""

    def __init__(self, source):
        self.source = source
        self.rollout_s: list[float] = []

    def on_metrics(self, event: StepEvent) -> None:
        step = event.step - 1
        end = self.source.ready_at.get(event.step, event.time)
        drawn = self.source.drawn_at.get(step)
        if drawn is not None:
            event.metrics["update_s"] = max(min(end, event.time) - drawn - event.compile_s, 0.0)
        if "rollout_s" in event.metrics:
            self.rollout_s.append(event.metrics["rollout_s"])

    def on_end(self, state: dict, summary: dict) -> None:
        times = self.rollout_s[1:] or self.rollout_s
        summary["rollout_s_mean"] = float(np.mean(times)) if times else None


class ExactMatch(Hook):
    """`exact_match(params) -> float` (the held-out greedy exact match) before the first step of a fresh
    run (logged at step 0), every `every` steps and at the last, as the step's `eval_exact_match`.
    Summary: `initial_exact_match` and `final_exact_match` (when measured by this call)."""

    last = True

    def __init__(self, exact_match: Callable[[dict], float], every: int):
        self.exact_match, self.every = exact_match, every
        self.initial = self.final = None

    def on_start(self, event: StepEvent) -> None:
        if event.step == 0:
            self.initial = event.metrics["eval_exact_match"] = self.exact_match(event.state["params"])

    def on_step(self, event: StepEvent) -> None:
        self.final = event.metrics["eval_exact_match"] = self.exact_match(event.state["params"])

    def on_end(self, state: dict, summary: dict) -> None:
        if self.initial is not None:
            summary["initial_exact_match"] = self.initial
        if self.final is not None:
            summary["final_exact_match"] = self.final


class DrafterRefresh(Hook):
    """Arm "refreshed": every `every` steps, `updates` TV-loss steps (`steps`, the drafter's `StepCache`) of
    the LoRA drafter — the companion state "drafter" — on the step's rollouts (`source.last`, laid out by
    `to_batch`), the updated policy as the frozen teacher; adds `drafter_tv` and `drafter_accept_proxy` to the
    step's metrics. At the end of a completed run: the drafter to WORKDIR/adapter (kept when already there)."""

    def __init__(self, steps: StepCache, source, every: int, updates: int, mesh, lora, to_batch, workdir: str):
        self.steps, self.source, self.every, self.updates = steps, source, every if updates else 0, updates
        self.mesh, self.lora, self.to_batch, self.workdir = mesh, lora, to_batch, workdir

    def on_step(self, event: StepEvent) -> None:
        state = event.state
        batch = shd.global_batch(self.to_batch(self.source.last), self.mesh)
        for _ in range(self.updates):
            state["drafter"], metrics = self.steps.train(None)(state["drafter"], state["params"], batch)
        metrics = jax.device_get(metrics)
        if int(metrics["bad_step"]) >= 0:
            raise NonFiniteError(f"the drafter refresh became non-finite at RL step {event.step}; lower "
                                 "rl.refresh_optim.lr")
        event.metrics.update(drafter_tv=float(metrics["tv"]), drafter_accept_proxy=float(metrics["accept_proxy"]))

    def on_end(self, state: dict, summary: dict) -> None:
        path = os.path.join(self.workdir, "adapter")
        if summary["status"] == "completed" and jax.process_index() == 0 and not os.path.isdir(path):
            lora_lib.save(path, jax.device_get(state["drafter"]["params"]), self.lora)
