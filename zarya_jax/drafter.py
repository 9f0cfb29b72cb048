"""Uno's diffusion drafter training (SPEC §7): paired `[noisy ; clean]` layout, block attention, TV loss.

One forward over `2L` rows: the noisy copy (rows `0..L-1`, gate on) then the clean copy (rows
`L..2L-1`, gate off, i.e. exactly the frozen AR model), both at the same logical positions `0..L-1`.
The sequence is cut into blocks of `S` tokens (the draft block size, grown by a curriculum):
- a clean row sees the clean rows before it (causal);
- a noisy row of block b sees the clean rows of blocks < b and the noisy rows of its own block
  at or before it (causal inside the block).

**[decision]** The first row of each noisy block keeps its clean token with the gate off: it is the
*seed* of the Ψ-Spec draft pass (`[seed, z1 … z_{S−1}]`, seed gate-off, noise gate-on), so the
training block is the inference draft window exactly. A seed row sees what its clean twin sees, so
its output is the AR distribution and it carries no loss. The other rows get noise tokens: uniform
random ids (never the mask id) or, with `noise="mask"`, the mask token.

Loss per supervised noisy row i (next-token convention, as the AR row at the same index):
`tv_weight·Σ_v |q_i − sg(p_i)| + ce_weight·(−log q_i(x_{i+1})) + kl_weight·KL(q_i ‖ sg(p_i))`,
averaged over supervised rows; q from the noisy row, p from the clean row. `1 − ½Σ|q−p|` is the
probability that a draft from q is accepted against p (speculative sampling), reported as
`accept_proxy`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from . import model as model_lib
from .config import ConfigError, LoraConfig, ModelConfig

Array = jax.Array
BLOCK_CURRICULUM = (2, 4, 6, 8, 12, 16)


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Drafter-training knobs (SPEC §7). `block_borders`: progress (step/total) at which each block
    size of `block_sizes` ends; None spreads them evenly."""

    block_sizes: tuple[int, ...] = BLOCK_CURRICULUM
    block_borders: tuple[float, ...] | None = None
    noise: str = "uniform"
    tv_weight: float = 1.0
    ce_weight: float = 0.0
    kl_weight: float = 0.0

    def __post_init__(self):
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
        if self.noise not in ("uniform", "mask"):
            raise ConfigError(f"DrafterConfig.noise={self.noise!r}: expected 'uniform' or 'mask'")
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


def noise_tokens(key: Array, shape: tuple[int, ...], vocab_size: int, mask_token_id: int | None,
                 noise: str = "uniform") -> Array:
    """Noise ids: uniform over the vocabulary minus the mask token, or all `mask_token_id`."""
    if noise == "mask":
        if mask_token_id is None:
            raise ConfigError("noise='mask' needs ModelConfig.mask_token_id")
        return jnp.full(shape, mask_token_id, jnp.int32)
    if mask_token_id is None:
        return jax.random.randint(key, shape, 0, vocab_size, jnp.int32)
    z = jax.random.randint(key, shape, 0, vocab_size - 1, jnp.int32)
    return z + (z >= mask_token_id)  # skip the mask id, keep the rest uniform


def pair_mask(valid: Array, block_size) -> Array:
    """bool [b, 2L, 2L] attention over `[noisy ; clean]` (see module doc). valid bool [b, L].

    `block_size` may be a traced int: the curriculum changes the mask, not the shapes (one compile).
    """
    b, length = valid.shape
    i = jnp.arange(length)[:, None]
    k = jnp.arange(length)[None, :]
    blk_i, blk_k = i // block_size, k // block_size
    causal = k <= i
    nn_ = causal & (blk_i == blk_k)
    nc = k < blk_i * block_size
    top = jnp.concatenate([nn_, nc], axis=1)
    bottom = jnp.concatenate([jnp.zeros_like(causal), causal], axis=1)
    m = jnp.concatenate([top, bottom], axis=0)[None]
    v2 = jnp.concatenate([valid, valid], axis=1)
    m = m & v2[:, None, :] & v2[:, :, None]
    return m | jnp.eye(2 * length, dtype=bool)[None]  # padding rows see themselves: finite softmax


def make_pair_batch(key: Array, tokens: Array, valid: Array, target_mask: Array, block_size,
                    config: ModelConfig, cfg: DrafterConfig) -> dict:
    """Builds the paired inputs. tokens int [b, L]; valid bool [b, L] (not padding); target_mask bool
    [b, L]: row i is supervised on its next token x_{i+1} (e.g. answer tokens, i+1 < length).

    Returns {'tokens','positions','gate': [b, 2L], 'mask': [b, 2L, 2L], 'rows': bool [b, L]
    (supervised noisy rows), 'targets': [b, L]}.
    """
    b, length = tokens.shape
    tokens = tokens.astype(jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    seed = (pos % block_size) == 0
    z = noise_tokens(key, (b, length), config.vocab_size, config.mask_token_id, cfg.noise)
    noisy = jnp.where(seed, tokens, z)
    gate = jnp.concatenate([~seed & valid, jnp.zeros_like(valid)], axis=1)
    targets = jnp.concatenate([tokens[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)
    has_next = jnp.concatenate([valid[:, 1:], jnp.zeros((b, 1), bool)], axis=1)
    return {"tokens": jnp.concatenate([noisy, tokens], axis=1), "positions": jnp.concatenate([pos, pos], axis=1),
            "gate": gate, "mask": pair_mask(valid, block_size),
            "rows": ~seed & valid & has_next & target_mask.astype(bool), "targets": targets}


def _masked_log_softmax(logits: Array, mask_token_id: int | None) -> Array:
    # The mask token is never sampled (SPEC §4), so neither distribution may put mass on it.
    if mask_token_id is not None:
        logits = logits.at[..., mask_token_id].set(-jnp.inf)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def drafter_loss(lora_params, params, config: ModelConfig, lora: LoraConfig, batch: dict,
                 cfg: DrafterConfig) -> tuple[Array, dict]:
    """TV (+CE, +KL) loss of the gated-LoRA drafter against the stop-gradient AR rows (SPEC §7).

    Differentiable in `lora_params` only (the clean half runs gate-off, the base params are frozen
    by the caller). Returns (loss scalar, metrics {'tv','ce','kl','accept_proxy','rows'}).
    """
    length = batch["tokens"].shape[1] // 2
    logits, _ = model_lib.apply(params, config, batch["tokens"], batch["positions"], window_mask=batch["mask"],
                                gate=batch["gate"], lora_params=lora_params, lora=lora)
    log_q = _masked_log_softmax(logits[:, :length], config.mask_token_id)
    log_p = jax.lax.stop_gradient(_masked_log_softmax(logits[:, length:], config.mask_token_id))
    q, p = jnp.exp(log_q), jnp.exp(log_p)
    rows = batch["rows"].astype(jnp.float32)
    n = jnp.maximum(rows.sum(), 1.0)
    tv_row = jnp.abs(q - p).sum(-1)
    ce_row = -jnp.take_along_axis(log_q, batch["targets"][..., None], axis=-1)[..., 0]
    # where() on the logs, not on the product: -inf logs at the mask id would give NaN gradients
    kl_row = jnp.sum(q * (jnp.where(q > 0, log_q, 0.0) - jnp.where(p > 0, log_p, 0.0)), axis=-1)
    tv, ce, kl = ((x * rows).sum() / n for x in (tv_row, ce_row, kl_row))
    loss = cfg.tv_weight * tv
    if cfg.ce_weight:
        loss = loss + cfg.ce_weight * ce
    if cfg.kl_weight:
        loss = loss + cfg.kl_weight * kl
    return loss, {"tv": tv, "ce": ce, "kl": kl, "accept_proxy": 1.0 - 0.5 * tv, "rows": rows.sum()}
