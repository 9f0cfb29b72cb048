"""GRPO's pure core: group-normalised advantages, per-token log-probabilities of completions under the
current params, and the clipped importance-ratio objective with a KL penalty to a frozen reference.

One GRPO step, for P prompts with G = `num_generations` completions each (N = P·G rows, prompt-major:
rows p·G … p·G + G − 1 are prompt p's group):
1. Rollouts: `generate()` in mode "ar", "spec-self" or "spec-lora" (the on-policy samplers) returns the completions and
   their log-probabilities under the sampling policy; `rollout_batch` lays them out for scoring and keeps
   those log-probabilities as the old policy's, π_old (no second pass over the rollouts).
2. Rewards r_i (`zarya_jax.rl.rewards`), and advantages A_i = (r_i − mean_g r) / (std_g r + 1e-6) over
   each group (`group_advantages`; std with ddof = 1, so a group of two identical rewards gets 0).
3. Per completion token t of row i, with log π = `completion_logprobs` under the current params, the
   ratio ρ = exp(log π − log π_old) and the frozen reference's log π_ref:
       ℓ_it = −min(ρ·A_i, clip(ρ, 1 − ε, 1 + ε)·A_i) + β·(exp(log π_ref − log π) − (log π_ref − log π) − 1)
   (the KL term is the k3 estimator of KL(π ‖ π_ref): unbiased, ≥ 0), aggregated over the completion
   tokens by `loss_agg_mode` (`aggregate`). With `num_iterations` = μ > 1, the same rollouts serve μ
   updates; π_old stays the rollout policy, so the clip bounds how far those updates move.

Every log-probability here is `primitives.token_logprob` at the rollout temperature (mask token banned,
before top-k / top-p / repetition penalty), so at the rollout params log π equals the sampler's
`GenerationOutput.logprobs` and ρ = 1; rollouts must therefore sample that distribution (the RL config
refuses `rl.top_k > 0`). The knob names are tunix's `GRPOConfig`'s.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ConfigError
from .. import model as model_lib
from ..objectives.losses import map_sequence_blocks
from ..sampling import primitives

Array = jax.Array
LOSS_AGG_MODES = ("token-mean", "sequence-mean-token-mean", "sequence-mean-token-sum")
ADVANTAGE_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """num_generations: completions per prompt (G ≥ 2: an advantage compares a completion with its group);
    beta: weight of the KL penalty to the reference policy (0 turns it off); epsilon: clip range of the
    importance ratio; num_iterations: updates per batch of rollouts; loss_agg_mode: one of
    `LOSS_AGG_MODES` (see `aggregate`)."""

    num_generations: int = 4
    beta: float = 0.04
    epsilon: float = 0.2
    num_iterations: int = 1
    loss_agg_mode: str = "sequence-mean-token-mean"

    def __post_init__(self):
        for name, low in (("num_generations", 2), ("num_iterations", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(f"GRPOConfig.{name}={value!r}: expected an integer ≥ {low}")
        for name in ("beta", "epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise ConfigError(f"GRPOConfig.{name}={value!r}: expected a finite number ≥ 0")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(f"GRPOConfig.loss_agg_mode={self.loss_agg_mode!r}: expected one of {LOSS_AGG_MODES}")


# --------------------------------------------------------------------------- advantages
def group_advantages(rewards, num_generations: int) -> np.ndarray:
    """float32 [N]: (r − group mean) / (group std + 1e-6) over consecutive groups of `num_generations`
    rewards (N = P·G, prompt-major); std with ddof = 1."""
    r = np.asarray(rewards, np.float64)
    if r.ndim != 1 or r.size % num_generations:
        raise ValueError(f"rewards: expected a flat array of groups of num_generations={num_generations}, "
                         f"got shape {r.shape}")
    groups = r.reshape(-1, num_generations)
    adv = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True) + ADVANTAGE_EPS)
    return adv.reshape(-1).astype(np.float32)


# --------------------------------------------------------------------------- rollouts and log-probabilities
def rollout_batch(prompts: list[list[int]], output, pad_id: int, width: int | None = None) -> dict:
    """The rollouts of one `generate()` call as a scoring batch (NumPy):
    tokens int32 [N, W] (prompt_i + completion_i, right-padded with `pad_id`; W = `width`, default the
    longest prompt + G), prompt_lengths [N],
    completions int32 [N, G], mask bool [N, G] (the completion's tokens, EOS included) and
    old_logprobs float32 [N, G] (the sampler's, 0 outside the mask)."""
    if output.logprobs is None:
        raise ValueError(f"the rollouts come from mode {output.stats.get('mode')!r}, which samples off the AR "
                         f"policy; GRPO needs an on-policy sampler: mode 'ar' or 'spec'")
    n, g = output.tokens.shape
    if len(prompts) != n:
        raise ValueError(f"prompts: expected {n} (one per rollout row), got {len(prompts)}")
    prompt_lengths = np.asarray([len(p) for p in prompts], np.int32)
    mask = np.arange(g)[None, :] < np.asarray(output.lengths)[:, None]
    need = int(prompt_lengths.max()) + g
    if width is not None and width < need:
        raise ValueError(f"width={width}: expected ≥ the longest prompt + max_new_tokens = {need}")
    tokens = np.full((n, need if width is None else width), pad_id, np.int32)
    for i, prompt in enumerate(prompts):
        tokens[i, :len(prompt)] = prompt
        tokens[i, len(prompt):len(prompt) + g] = np.where(mask[i], output.tokens[i], pad_id)
    return {"tokens": tokens, "prompt_lengths": prompt_lengths, "completions": np.asarray(output.tokens, np.int32),
            "mask": mask, "old_logprobs": np.where(mask, output.logprobs, 0).astype(np.float32)}


def completion_logprobs(params, config, batch: dict, temperature: float = 1.0) -> Array:
    """float32 [N, G]: log π(completion token | prompt, earlier completion tokens) under `params`, from one
    teacher-forced causal forward over `batch["tokens"]` (`rollout_batch`), at `temperature` (use the
    rollouts'; 1 for greedy ones); 0 outside the mask. Differentiable in `params`."""
    tokens = jnp.asarray(batch["tokens"], jnp.int32)
    n, w = tokens.shape
    g = batch["completions"].shape[1]
    lengths = jnp.asarray(batch["prompt_lengths"], jnp.int32)
    mask = jnp.asarray(batch["mask"], bool)
    valid = jnp.arange(w)[None, :] < (lengths + mask.sum(1))[:, None]
    positions = jnp.broadcast_to(jnp.arange(w, dtype=jnp.int32), (n, w))
    hidden, _ = model_lib.apply(params, config, tokens, positions, segment_ids=valid.astype(jnp.int32),
                                return_hidden=True)
    rows = jnp.minimum(lengths[:, None] - 1 + jnp.arange(g)[None, :], w - 1)  # row j − 1 predicts token j
    picked = jnp.take_along_axis(hidden, rows[..., None], axis=1)  # [N, G, d]
    # only the completion rows are projected, a block of them at a time: no [N, W, V] (or [N, G, V]) logits
    lp = map_sequence_blocks(
        lambda h, t: primitives.token_logprob(model_lib.lm_head(params, config, h), t, temperature or 1.0,
                                              config.mask_token_id),
        picked, jnp.asarray(batch["completions"], jnp.int32))
    return jnp.where(mask, lp, 0.0)


# --------------------------------------------------------------------------- the objective
def row_weights(mask: Array, mode: str, mean_tokens: Array | None = None) -> Array:
    """float32 [N]: the weight w_i of row i's token sum such that the aggregate is the mean over rows of
    w_i · Σ_t ℓ_it — "token-mean": 1 / (completion tokens per row of the whole batch), so the aggregate is
    the batch's token sum over its token count (long completions weigh more); "sequence-mean-token-mean":
    1 / the row's token count; "sequence-mean-token-sum": 1.

    A mean over rows is what the train step's gradient accumulation preserves (it averages the losses of
    equal micro-batches of rows), so a micro-batch given `mean_tokens` (the whole batch's tokens per row,
    [N] or [N, 1], every row the same) aggregates to its share of the whole batch's token mean; without
    it the rows at hand are the batch."""
    m = mask.astype(jnp.float32)
    n = m.shape[0]
    if mode == "token-mean":
        per_row = jnp.sum(m) / n if mean_tokens is None else jnp.reshape(mean_tokens, (n,)).astype(jnp.float32)
        return jnp.broadcast_to(1.0 / jnp.maximum(per_row, 1.0 / n), (n,))
    if mode == "sequence-mean-token-mean":
        return 1.0 / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    if mode == "sequence-mean-token-sum":
        return jnp.ones((n,), jnp.float32)
    raise ConfigError(f"loss_agg_mode={mode!r}: expected one of {LOSS_AGG_MODES}")


def aggregate(per_token: Array, mask: Array, mode: str, mean_tokens: Array | None = None) -> Array:
    """Scalar from per-token values [N, G] over the mask, by `mode` (`row_weights`): "token-mean" — the
    mean over every completion token of the batch; "sequence-mean-token-mean" — each completion's token
    mean, then the mean over completions; "sequence-mean-token-sum" — each completion's token sum, then
    the mean over completions."""
    total = jnp.sum(per_token * mask.astype(jnp.float32), axis=1)
    return jnp.mean(row_weights(mask, mode, mean_tokens) * total)


def policy_loss(logprobs: Array, old_logprobs: Array, ref_logprobs: Array | None, advantages: Array, mask: Array,
                cfg: GRPOConfig, mean_tokens: Array | None = None) -> tuple[Array, dict]:
    """GRPO's loss from per-token log-probabilities [N, G] (module doc, step 3) → (scalar, metrics:
    "kl" (the aggregated k3 estimate), "clip_fraction" (the fraction of completion tokens whose clipping
    removes the gradient: the min picks the clipped term and it differs from the unclipped one, i.e.
    A > 0 and ρ > 1 + ε, or A < 0 and ρ < 1 − ε), "ratio" (mean ρ over tokens)). `ref_logprobs` may be
    None when β = 0. `mean_tokens`: the whole batch's completion tokens per row, for a micro-batch
    (`row_weights`); the metrics are token means over the whole batch the same way."""
    m = mask.astype(jnp.float32)
    ratio = jnp.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon) * adv
    per_token = -jnp.minimum(unclipped, clipped)
    kl = jnp.zeros_like(per_token)
    if cfg.beta:
        if ref_logprobs is None:
            raise ValueError(f"beta={cfg.beta}: the KL penalty needs the reference policy's log-probabilities")
        delta = ref_logprobs - logprobs
        kl = jnp.exp(delta) - delta - 1.0
        per_token = per_token + cfg.beta * kl
    token_mean = lambda x: aggregate(x, mask, "token-mean", mean_tokens)  # noqa: E731
    metrics = {"kl": aggregate(kl, mask, cfg.loss_agg_mode, mean_tokens),
               "clip_fraction": token_mean((clipped < unclipped).astype(jnp.float32)),
               "ratio": token_mean(ratio)}
    return aggregate(per_token, mask, cfg.loss_agg_mode, mean_tokens), metrics


def grpo_loss(params, config, batch: dict, advantages: Array, ref_logprobs: Array | None, cfg: GRPOConfig,
              temperature: float = 1.0) -> tuple[Array, dict]:
    """`policy_loss` with log π from `completion_logprobs(params, …)`, π_old = the batch's rollout
    log-probabilities and the batch's "mean_tokens" when it has one: the function to differentiate in
    `params`."""
    logprobs = completion_logprobs(params, config, batch, temperature)
    return policy_loss(logprobs, jnp.asarray(batch["old_logprobs"]), ref_logprobs, jnp.asarray(advantages),
                       jnp.asarray(batch["mask"]), cfg, batch.get("mean_tokens"))
