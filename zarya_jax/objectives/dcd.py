"""Discrete consistency distillation (DCD) of Uno's gated-LoRA drafter (docs/algorithms.md §7.7).

The teacher is the drafter itself run for K refinement passes over the training blocks of the pair layout
(`objectives.drafter`): pass 1 drafts every block from the noise rows, as the one-pass drafter does;
pass k feeds each noise row the previous pass's draft for its position (`lora.redraft_tokens`: row i
gets row i−1's argmax, the seed rows keep their clean tokens) and drafts again. The teacher's adapter is a
frozen copy of the student's, refreshed every `refresh_every` steps (a round), held in the train state
as the objective's carry (`Objective.init_carry`/`next_carry`), so a resumed run is exact. The student
drafts in one pass from the same noise and is trained, per supervised row, towards the teacher's last
pass: `rkl` = KL(q_student ‖ sg(q_teacher)) or `tv` = Σ_v |q_student − sg(q_teacher)|, plus
`ar_weight` × the drafter's own loss against the AR rows (`drafter.drafter_terms`, its tv/ce/kl
weights). The first `start` share of the run trains with the drafter's own loss alone (the teacher is
set from the student when DCD begins), so one run is "TV for N steps, then DCD for M".

**[decision]** The teacher's intermediate passes feed argmax drafts (a deterministic refinement; at
inference `draft_passes` feeds the drafts sampled at the decode temperature, argmax when greedy), and
the noise of the student's pass is the teacher's pass-1 noise, so the student learns to jump to the end
of the very trajectory the teacher ran.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ..config import ConfigError, LoraConfig, ModelConfig, missing_mask_token
from .. import model as model_lib
from ..lora import redraft_tokens
from .base import Objective
from .drafter import (DrafterConfig, block_size_traced, drafter_hidden_terms, drafter_loss, make_pair_batch,
                      pair_hidden)
from .losses import head_draft_row_losses, map_sequence_blocks

Array = jax.Array
DIVERGENCES = ("rkl", "tv")


@dataclasses.dataclass(frozen=True)
class DcdConfig:
    """DCD knobs (docs/algorithms.md §7.7): teacher `passes` K ≥ 2, its refresh period in steps, the
    divergence to the teacher ("rkl" | "tv"), the weight of the drafter's own loss to the AR rows, and the
    share of the run trained with that loss alone before DCD starts."""

    passes: int = 2
    refresh_every: int = 50
    divergence: str = "rkl"
    ar_weight: float = 1.0
    start: float = 0.5

    def __post_init__(self):
        if isinstance(self.passes, bool) or not isinstance(self.passes, int) or self.passes < 2:
            raise ConfigError(f"dcd.passes={self.passes!r}: expected an integer ≥ 2 (the teacher refines at least once)")
        if isinstance(self.refresh_every, bool) or not isinstance(self.refresh_every, int) or self.refresh_every < 1:
            raise ConfigError(f"dcd.refresh_every={self.refresh_every!r}: expected an integer ≥ 1")
        if self.divergence not in DIVERGENCES:
            raise ConfigError(f"dcd.divergence={self.divergence!r}: expected one of {DIVERGENCES}")
        if not self.ar_weight >= 0:
            raise ConfigError(f"dcd.ar_weight={self.ar_weight!r}: expected ≥ 0")
        if not 0.0 <= self.start < 1.0:
            raise ConfigError(f"dcd.start={self.start!r}: expected a share of the run in [0, 1)")

    def start_step(self, total_steps: int) -> int:
        return int(round(self.start * total_steps))


def _drafted(params, config: ModelConfig, hidden: Array) -> Array:
    """int32 [b, L]: the argmax draft (mask token excluded) of hidden states [b, L, d], projected a block of
    positions at a time (no [b, L, V] logits)."""
    def block(h):
        logits = model_lib.lm_head(params, config, h)
        if config.mask_token_id is not None:
            logits = logits.at[..., config.mask_token_id].set(-jnp.inf)
        return jnp.argmax(logits, -1).astype(jnp.int32)

    return map_sequence_blocks(block, hidden)


def teacher_hidden(teacher, params, config: ModelConfig, lora: LoraConfig, pair: dict, passes: int) -> Array:
    """The K-pass teacher over a paired batch: the final hidden states [b, L, d] of its last pass's noisy rows
    (a constant; `model.lm_head` maps them to its logits).

    Pass k > 1 re-drafts the noisy half from pass k−1's argmax (mask token excluded); the clean half and
    the seeds (the noisy rows with the gate off) are the same in every pass."""
    length = pair["tokens"].shape[1] // 2
    seed = ~pair["gate"][:, :length]
    tokens = pair["tokens"]
    for k in range(passes):
        noisy, _ = pair_hidden(teacher, params, config, lora, {**pair, "tokens": tokens})
        if k + 1 < passes:
            redrafted = redraft_tokens(tokens[:, :length], _drafted(params, config, noisy), seed)
            tokens = jnp.concatenate([redrafted, tokens[:, length:]], axis=1)
    return jax.lax.stop_gradient(noisy)


def dcd_loss(lora_params, teacher, params, config: ModelConfig, lora: LoraConfig, pair: dict, cfg: DrafterConfig,
             dcd: DcdConfig) -> tuple[Array, dict]:
    """The student's one-pass draft against the K-pass teacher (module doc), + ar_weight × the drafter loss.

    Returns (loss, metrics: the drafter's {'tv','ce','kl','accept_proxy','rows'} of the student, 'dcd' the
    divergence to the teacher, 'teacher_accept_proxy' = 1 − ½Σ|q_teacher − p|). Every term comes from
    hidden states projected a block of positions at a time (`losses.head_draft_row_losses`)."""
    mask_id = config.mask_token_id
    head = functools.partial(model_lib.lm_head, params, config)
    noisy, clean = pair_hidden(lora_params, params, config, lora, pair)
    ar_loss, metrics = drafter_hidden_terms((noisy, clean), params, config, pair, cfg)
    t = teacher_hidden(teacher, params, config, lora, pair, dcd.passes)
    tv_row, _, kl_row = head_draft_row_losses(head, noisy, head, t, pair["targets"], mask_id)
    rows = pair["rows"].astype(jnp.float32)
    n = jnp.maximum(rows.sum(), 1.0)
    div = ((kl_row if dcd.divergence == "rkl" else tv_row) * rows).sum() / n
    teacher_tv, _, _ = head_draft_row_losses(head, t, head, jax.lax.stop_gradient(clean), pair["targets"], mask_id)
    loss = div + dcd.ar_weight * ar_loss if dcd.ar_weight else div
    return loss, {**metrics, "dcd": div, "teacher_accept_proxy": 1.0 - 0.5 * (teacher_tv * rows).sum() / n}


def refresh(carry, params, step, *, start: int, every: int):
    """The teacher after the update that made the step count `step`: the student's params at the start of
    DCD and every `every` steps after it, else unchanged."""
    due = (step >= start) & ((step - start) % every == 0)
    return jax.tree.map(lambda t, p: jnp.where(due, p, t), carry, params)


def dcd_objective(config: ModelConfig, lora: LoraConfig, cfg: DrafterConfig, dcd: DcdConfig,
                  total_steps: int) -> Objective:
    """An `Objective` for a run of `total_steps` (trainable: the adapter, frozen: the AR base, carry: the
    teacher adapter). Two compiles: the drafter's own loss before `dcd.start`, DCD after (`static_at`); the
    block curriculum as in `drafter.drafter_objective`."""
    if lora.noise == "mask" and config.mask_token_id is None:
        raise ConfigError(missing_mask_token("LoraConfig.noise='mask' needs", otherwise="use noise='uniform'"))
    start = dcd.start_step(total_steps)

    def loss_fn(lora_params, base_params, batch, key, info):
        s = block_size_traced(info.step, info.total_steps, cfg)
        pair = make_pair_batch(key, batch, s, config, lora)
        if info.static == "dcd":
            loss, metrics = dcd_loss(lora_params, info.carry, base_params, config, lora, pair, cfg, dcd)
        else:
            loss, metrics = drafter_loss(lora_params, base_params, config, lora, pair, cfg)
        return loss, {**metrics, "block_size": s.astype(jnp.float32)}

    return Objective(loss_fn, static_at=lambda step, total: "dcd" if step >= start else "tv",
                     forward_passes=2.0 * (dcd.passes + 1), name="uno-dcd",
                     init_carry=lambda params: jax.tree.map(jnp.copy, params),
                     next_carry=lambda carry, params, step: refresh(carry, params, step, start=start,
                                                                    every=dcd.refresh_every))
