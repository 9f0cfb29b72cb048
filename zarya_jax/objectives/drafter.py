"""Uno's diffusion drafter training (docs/algorithms.md §7): paired `[noisy ; clean]` layout, block attention, TV loss.

One forward over `2L` rows: the noisy copy (rows `0..L-1`, gate on) then the clean copy (rows
`L..2L-1`, gate off, i.e. exactly the frozen AR model), both at the same logical positions `0..L-1`.
The sequence is cut into blocks of `S` tokens (the draft block size, grown by a curriculum):
- a clean row sees the clean rows before it (causal);
- a noisy row of block b sees the clean rows of blocks < b and the noisy rows of its own block
  at or before it (causal inside the block).

**[decision]** The first row of each noisy block keeps its clean token with the gate off: it is the
*seed* of the Ψ-Spec draft pass (`[seed, z1 … z_{S−1}]`, seed gate-off, noise gate-on), so the
training block is the inference draft window exactly. A seed row sees what its clean twin sees, so
its output is the AR distribution and it carries no loss. The other rows get noise tokens by the
adapter's convention (`LoraConfig.noise`, `lora.noise_tokens`): uniform random ids (never the mask
id) or the mask token; the adapter is saved with it, so sampling uses the same noise.

Loss per supervised noisy row i (next-token convention, as the AR row at the same index):
`tv_weight·Σ_v |q_i − sg(p_i)| + ce_weight·(−log q_i(x_{i+1})) + kl_weight·KL(q_i ‖ sg(p_i))`,
averaged over supervised rows; q from the noisy row, p from the clean row. `1 − ½Σ|q−p|` is the
probability that a draft from q is accepted against p (speculative sampling), reported as
`accept_proxy`.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ..config import ConfigError, LoraConfig, ModelConfig, missing_mask_token
from ..nn import kv_cache
from .. import model as model_lib
from ..lora import noise_tokens
from .base import Objective
from .losses import draft_row_losses, head_draft_row_losses

Array = jax.Array
BLOCK_CURRICULUM = (2, 4, 6, 8, 12, 16)
# `DrafterConfig.objective`: the drafter's own loss ("tv": TV + CE + KL to the AR rows, this module) or
# discrete consistency distillation on top of it ("dcd", `objectives.dcd`).
DRAFTER_OBJECTIVES = ("tv", "dcd")


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Drafter-training knobs (docs/algorithms.md §7). `block_borders`: progress (step/total) at which each block
    size of `block_sizes` ends; None spreads them evenly. `objective`: "tv" (the loss below) or "dcd"
    (consistency distillation, `objectives.dcd`, configured by its own `DcdConfig`)."""

    block_sizes: tuple[int, ...] = BLOCK_CURRICULUM
    block_borders: tuple[float, ...] | None = None
    tv_weight: float = 1.0
    ce_weight: float = 0.0
    kl_weight: float = 0.0
    objective: str = "tv"

    def __post_init__(self):
        if self.objective not in DRAFTER_OBJECTIVES:
            raise ConfigError(f"DrafterConfig.objective={self.objective!r}: expected one of {DRAFTER_OBJECTIVES}")
        object.__setattr__(self, "block_sizes", tuple(int(s) for s in self.block_sizes))
        if not self.block_sizes or any(s < 2 for s in self.block_sizes):
            raise ConfigError(f"DrafterConfig.block_sizes={self.block_sizes}: expected sizes ≥ 2 "
                              "(a block is a seed plus at least one noise token)")
        if self.block_borders is not None:
            object.__setattr__(self, "block_borders", tuple(float(b) for b in self.block_borders))
            if len(self.block_borders) != len(self.block_sizes) or list(self.block_borders) != sorted(
                    self.block_borders):
                raise ConfigError(f"DrafterConfig.block_borders={self.block_borders}: expected one increasing "
                                  f"border per block size in {self.block_sizes}")
        for name in ("tv_weight", "ce_weight", "kl_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"DrafterConfig.{name}={getattr(self, name)}: expected ≥ 0")
        if self.tv_weight + self.ce_weight + self.kl_weight == 0:
            raise ConfigError("DrafterConfig: tv_weight, ce_weight and kl_weight are all 0; nothing to train")


def block_size_at(step: int, total_steps: int, cfg: DrafterConfig) -> int:
    """Curriculum: the first block size whose border is ≥ progress = step / total_steps (2→…→16)."""
    progress = step / max(total_steps, 1)
    n = len(cfg.block_sizes)
    borders = cfg.block_borders or tuple((i + 1) / n for i in range(n))
    for size, border in zip(cfg.block_sizes, borders):
        if progress <= border:
            return size
    return cfg.block_sizes[-1]


def block_size_traced(step, total_steps: int, cfg: DrafterConfig):
    """`block_size_at` for a traced step (int32 scalar): the curriculum without recompiles.

    The borders are resolved on the host, exactly as `block_size_at`, into the last step of each size,
    so float32 rounding of step / total cannot move a border.
    """
    last = []
    for size in cfg.block_sizes[:-1]:
        steps = [s for s in range(total_steps + 1) if block_size_at(s, total_steps, cfg) == size]
        last.append(max(steps) if steps else -1)
    idx = jnp.sum(jnp.asarray(step, jnp.int32) > jnp.asarray(last, jnp.int32)) if last else 0
    return jnp.asarray(cfg.block_sizes, jnp.int32)[idx]


def pair_mask(segment_ids: Array, positions: Array, block_size) -> Array:
    """bool [b, 2L, 2L] attention over `[noisy ; clean]` (module doc). segment_ids int [b, L] (0 =
    padding, packed examples 1, 2, …), positions int [b, L] logical, restarting per example.

    Blocks are cut on logical positions (`pos // S`), so packed examples each start a block.
    `block_size` may be traced: the curriculum changes the mask, not the shapes (one compile).
    """
    b, length = segment_ids.shape
    seg_q, seg_k = segment_ids[:, :, None], segment_ids[:, None, :]
    same = (seg_q == seg_k) & (seg_k > 0)
    causal = (jnp.arange(length)[:, None] >= jnp.arange(length)[None, :])[None]
    blk = positions // block_size
    nn_ = same & causal & (blk[:, :, None] == blk[:, None, :])
    nc = same & (positions[:, None, :] < (blk * block_size)[:, :, None])
    cc = same & causal
    m = jnp.concatenate([jnp.concatenate([nn_, nc], axis=2),
                         jnp.concatenate([jnp.zeros_like(cc), cc], axis=2)], axis=1)
    return m | jnp.eye(2 * length, dtype=bool)[None]  # padding rows see themselves: finite softmax


def make_pair_batch(key: Array, batch: dict, block_size, config: ModelConfig, lora: LoraConfig,
                    noise: Array | None = None) -> dict:
    """The paired inputs from a supervised batch (`zarya_jax.data.batch` layout: tokens, segment_ids,
    positions, answer_mask, each [b, L]); the noise rows follow the adapter's `lora.noise` (drawn from
    `key`, or the given `noise` int [b, L], e.g. to replay an inference draft pass's noise).

    Returns {'tokens','positions','gate': [b, 2L], 'mask': [b, 2L, 2L], 'rows': bool [b, L] (noisy
    rows supervised: not a seed, next token in the same example and an answer token), 'targets' [b, L],
    'segment_ids' [b, L] (the clean half's mask is causal within them)}.
    """
    tokens = batch["tokens"].astype(jnp.int32)
    seg = batch["segment_ids"].astype(jnp.int32)
    pos = batch["positions"].astype(jnp.int32)
    b, length = tokens.shape
    valid = seg > 0
    seed = (pos % block_size) == 0
    z = noise_tokens(key, (b, length), config.vocab_size, config.mask_token_id, lora.noise) if noise is None else noise
    noisy = jnp.where(seed, tokens, z)
    gate = jnp.concatenate([~seed & valid, jnp.zeros_like(valid)], axis=1)
    shift = lambda x, fill: jnp.concatenate([x[:, 1:], jnp.full((b, 1), fill, x.dtype)], axis=1)
    has_next = valid & (shift(seg, 0) == seg)
    rows = ~seed & has_next & shift(batch["answer_mask"].astype(bool), False)
    return {"tokens": jnp.concatenate([noisy, tokens], axis=1), "positions": jnp.concatenate([pos, pos], axis=1),
            "gate": gate, "mask": pair_mask(seg, pos, block_size), "rows": rows, "targets": shift(tokens, 0),
            "segment_ids": seg}


def drafter_loss(lora_params, params, config: ModelConfig, lora: LoraConfig, batch: dict,
                 cfg: DrafterConfig) -> tuple[Array, dict]:
    """TV (+CE, +KL) loss of the gated-LoRA drafter against the stop-gradient AR rows (docs/algorithms.md §7).

    Differentiable in `lora_params` only (the clean half runs gate-off, the base params are frozen
    by the caller). Returns (loss scalar, metrics {'tv','ce','kl','accept_proxy','rows'}). The terms come
    from the final hidden states, projected onto the vocabulary a block of positions at a time
    (`losses.head_draft_row_losses`): no [b, 2L, V] logits.
    """
    return drafter_hidden_terms(pair_hidden(lora_params, params, config, lora, batch), params, config, batch, cfg)


def pair_hidden(lora_params, params, config: ModelConfig, lora: LoraConfig, batch: dict) -> tuple[Array, Array]:
    """The drafter's forward over a paired batch (`make_pair_batch` layout): the final-normed hidden states
    (noisy [b, L, d], clean [b, L, d]) that `model.lm_head` maps to the q and p logits.

    The same as one forward over the 2L rows under `batch["mask"]`, computed in two: the clean
    half is the frozen AR model (gate off, and it never attends to the noisy half), so no trainable
    parameter reaches it; it runs once, outside the gradient, and the noisy half reads its K/V as a
    cache (the inference draft pass reads the verified prefix the same way). The backward pass then
    covers the L noisy rows instead of 2L. The clean half's mask is causal within the examples
    (`batch["segment_ids"]`), so it runs through the kernel `config.attention` picks (splash on TPU);
    its padding rows differ from the pair mask's, and nothing reads them (no supervised row, no
    noisy row's cache).
    """
    length = batch["tokens"].shape[1] // 2
    tokens, positions, mask = batch["tokens"], batch["positions"], batch["mask"]
    clean_mask = ({"segment_ids": batch["segment_ids"]} if "segment_ids" in batch
                  else {"window_mask": mask[:, length:, length:]})
    clean, (k, v) = jax.lax.stop_gradient(model_lib.apply(
        params, config, tokens[:, length:], positions[:, length:], return_hidden=True, **clean_mask))
    noisy, _ = model_lib.apply(params, config, tokens[:, :length], positions[:, :length],
                               window_mask=mask[:, :length, :length], cache=kv_cache.of_window((k, v)),
                               cache_mask=mask[:, :length, length:], gate=batch["gate"][:, :length],
                               lora_params=lora_params, lora=lora, return_hidden=True)
    return noisy, clean


def pair_logits(lora_params, params, config: ModelConfig, lora: LoraConfig, batch: dict) -> Array:
    """`pair_hidden` projected: logits fp32 [b, 2L, V] (noisy rows then clean rows), for evaluation
    (`agreement_counts`); the train step keeps to the hidden states."""
    noisy, clean = pair_hidden(lora_params, params, config, lora, batch)
    return model_lib.lm_head(params, config, jnp.concatenate([noisy, clean], axis=1))


def _reduce_terms(terms, batch: dict, cfg: DrafterConfig) -> tuple[Array, dict]:
    """The drafter loss and metrics from the per-row (TV, CE, KL) [b, L] over the supervised rows."""
    rows = batch["rows"].astype(jnp.float32)
    n = jnp.maximum(rows.sum(), 1.0)
    tv, ce, kl = ((x * rows).sum() / n for x in terms)
    loss = cfg.tv_weight * tv
    if cfg.ce_weight:
        loss = loss + cfg.ce_weight * ce
    if cfg.kl_weight:
        loss = loss + cfg.kl_weight * kl
    return loss, {"tv": tv, "ce": ce, "kl": kl, "accept_proxy": 1.0 - 0.5 * tv, "rows": rows.sum()}


def drafter_terms(logits: Array, batch: dict, cfg: DrafterConfig, exclude_id: int | None) -> tuple[Array, dict]:
    """`drafter_loss` from the paired logits [b, 2L, V] (noisy rows: q, clean rows: p); `exclude_id` the
    mask token."""
    # The mask token is never sampled (docs/algorithms.md §4), so neither distribution may put mass on it; the terms are
    # fused reductions over the vocabulary (`losses.draft_row_losses`), p a constant.
    return _reduce_terms(draft_row_losses(logits, batch["targets"], exclude_id), batch, cfg)


def drafter_hidden_terms(hidden: tuple[Array, Array], params, config: ModelConfig, batch: dict,
                         cfg: DrafterConfig) -> tuple[Array, dict]:
    """`drafter_terms` from `pair_hidden`'s (noisy, clean) hidden states, projected block by block through
    the base's `lm_head` (the mask token excluded, as there)."""
    head = functools.partial(model_lib.lm_head, params, config)
    noisy, clean = hidden
    return _reduce_terms(head_draft_row_losses(head, noisy, head, clean, batch["targets"], config.mask_token_id),
                         batch, cfg)


def drafter_objective(config: ModelConfig, lora: LoraConfig, cfg: DrafterConfig):
    """An `Objective`: trainable = the adapter, frozen = the AR base params; the block size follows the
    curriculum from the traced step (one compile for the whole run). No export: the caller saves the
    adapter (`lora.save`)."""
    if lora.noise == "mask" and config.mask_token_id is None:
        raise ConfigError(missing_mask_token("LoraConfig.noise='mask' needs", otherwise="use noise='uniform'"))

    def loss_fn(lora_params, base_params, batch, key, info):
        s = block_size_traced(info.step, info.total_steps, cfg)
        pair = make_pair_batch(key, batch, s, config, lora)
        loss, metrics = drafter_loss(lora_params, base_params, config, lora, pair, cfg)
        return loss, {**metrics, "block_size": s.astype(jnp.float32)}

    # one forward over 2L rows; the clean half is the AR model's own pass
    return Objective(loss_fn, forward_passes=2.0, name="uno-drafter")


@functools.partial(jax.jit, static_argnames=("config", "lora", "block_size"))
def agreement_counts(params, lora_params, batch: dict, key: Array, *, config: ModelConfig, lora: LoraConfig,
                     block_size: int) -> tuple[Array, Array]:
    """Teacher-forced agreement of the drafter with the AR argmax, per draft position, on a supervised
    batch: the training layout with blocks of `block_size` S (block offset j is the draft c_j of an
    inference window of length S, `sampling.spec.draft_pass`), every block alignment (positions shifted
    by 0 … S−1; RoPE is relative, so the shift moves the blocks and nothing else).

    Returns (agree, count) int [S]: at offset j ≥ 1, how many supervised rows had argmax q_j = argmax p
    (the AR row at the same index: what greedy Ψ-Spec accepts), out of how many; offset 0 is the seed.
    The mask token is excluded from both argmaxes, as the samplers exclude it.
    """
    length = batch["tokens"].shape[1]

    def one_shift(shift, totals):
        shifted = {**batch, "positions": batch["positions"] + shift}
        pair = make_pair_batch(jax.random.fold_in(key, shift), shifted, block_size, config, lora)
        logits = pair_logits(lora_params, params, config, lora, pair)
        if config.mask_token_id is not None:
            logits = logits.at[..., config.mask_token_id].set(-jnp.inf)
        best = jnp.argmax(logits, axis=-1)
        offset = shifted["positions"] % block_size
        # a block cut before the example's first token has no seed: not an inference window
        rows = pair["rows"] & (shifted["positions"] - offset >= shift)
        same = (best[:, :length] == best[:, length:]) & rows
        onehot = jax.nn.one_hot(offset, block_size, dtype=jnp.int32)
        return (totals[0] + jnp.einsum("bl,bls->s", same.astype(jnp.int32), onehot),
                totals[1] + jnp.einsum("bl,bls->s", rows.astype(jnp.int32), onehot))

    # a loop, not S unrolled forwards: one compiled pass whatever the block size
    zeros = jnp.zeros((block_size,), jnp.int32)
    return jax.lax.fori_loop(0, block_size, one_shift, (zeros, zeros))
