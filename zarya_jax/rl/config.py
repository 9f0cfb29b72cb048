"""The GRPO run's configuration tree (`RLConfig`: sections rl, data, optim, mesh, train) and what it
resolves to: the rollout sampler of each arm and the reward functions.

Arms (`rl.arm`), the sampler of the rollouts — each is the AR policy exactly (lossless), so the arms
differ only in speed:
- "ar": `generate(mode="ar")`;
- "frozen": Ψ-Spec with a LoRA drafter (`--adapter`) trained once before RL and never updated;
- "refreshed": the same drafter, refreshed every `rl.refresh_every` RL steps by `rl.refresh_steps`
  TV-loss steps on the latest rollouts with the current policy as the teacher;
- "self": Ψ-Spec with the Zarya self-drafter, whose weights are the RL policy's.
Modes "mdm" and "slotted" accept tokens by thresholds, so their rollouts are not the policy's samples:
they are refused by name.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from .. import overrides as ov
from ..config import ConfigError, PromptFormat
from ..sampling import AR, GenerationConfig, SpecLora, SpecSelf
from ..train.config import RESUMABLE_CHANGES, TrainConfig
from ..train.divergence import DivergenceConfig
from ..train.optim import OptimConfig
from ..train.sharding import MeshConfig
from .grpo import GRPOConfig, LOSS_AGG_MODES
from .rewards import default_rewards

ARMS = ("ar", "frozen", "refreshed", "self")
LORA_ARMS = ("frozen", "refreshed")
OFF_POLICY_MODES = ("mdm", "slotted")
# The refreshed drafter's optimizer (`rl.refresh_optim.*`): Uno's adapter training, a constant rate.
REFRESH_OPTIM = OptimConfig(lr=1e-4, warmup_steps=0, schedule="constant", weight_decay=0.0)


@dataclasses.dataclass(frozen=True)
class RLSection:
    """GRPO (tunix's `GRPOConfig` names: num_generations, beta, epsilon, num_iterations, loss_agg_mode),
    the rollouts (prompts_per_step prompts × num_generations completions, sampled at `temperature` from
    the full softmax — `top_k` is refused unless 0 — with up to `max_new_tokens` tokens; for the spec
    arms `draft_length`, `draft_when_active_below` and the drafts' `proposal` / `proposal_temperature`,
    docs/decoding.md: every proposal keeps the rollouts exact samples of the policy), the reward (a dotted import path `module.function` of a function (record, completion
    text) → float; "" = exact match of the final `####` answer + 0.1 × the format term) and the
    refreshed drafter's schedule."""

    arm: str = "ar"
    num_generations: int = 4
    beta: float = 0.04
    epsilon: float = 0.2
    num_iterations: int = 1
    loss_agg_mode: str = "sequence-mean-token-mean"
    prompts_per_step: int = 4
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_k: int = 0
    draft_length: int = 4
    draft_when_active_below: float = 1.0
    proposal: str = "sample"
    proposal_temperature: float = 0.5
    reward: str = ""
    refresh_every: int = 5
    refresh_steps: int = 4
    refresh_optim: OptimConfig = REFRESH_OPTIM

    def __post_init__(self):
        if self.arm in OFF_POLICY_MODES:
            raise ConfigError(f"rl.arm={self.arm!r}: mode {self.arm!r} accepts tokens by confidence thresholds, so "
                              f"its rollouts are not samples of the AR policy (not on-policy); expected one of "
                              f"{ARMS} (AR or lossless Ψ-Spec rollouts)")
        if self.arm not in ARMS:
            raise ConfigError(f"rl.arm={self.arm!r}: expected one of {ARMS}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(f"rl.loss_agg_mode={self.loss_agg_mode!r}: expected one of {LOSS_AGG_MODES}")
        for name in ("num_generations",):
            if getattr(self, name) < 2:
                raise ConfigError(f"rl.num_generations={self.num_generations}: expected ≥ 2 (an advantage compares "
                                  "a completion with the other completions of its prompt)")
        for name in ("num_iterations", "prompts_per_step", "max_new_tokens", "draft_length", "refresh_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rl.{name}={getattr(self, name)}: expected ≥ 1")
        if self.refresh_steps < 0:
            raise ConfigError(f"rl.refresh_steps={self.refresh_steps}: expected ≥ 0")
        if not self.temperature > 0:
            raise ConfigError(f"rl.temperature={self.temperature}: expected > 0 (GRPO needs sampled rollouts: "
                              "a group of greedy completions is one completion repeated)")
        if self.top_k:
            raise ConfigError(f"rl.top_k={self.top_k}: GRPO scores every rollout token under the full softmax at "
                              "rl.temperature (the ratio to the rollout policy, the KL to the reference and the "
                              "gradient), so top-k rollouts would sample another distribution than the one the loss "
                              "scores (off-policy, biased); expected 0 (shape the samples with rl.temperature)")
        self.grpo()  # beta / epsilon ranges
        self.generation_config().validate()  # top_k, draft_when_active_below, …

    def grpo(self) -> GRPOConfig:
        return GRPOConfig(num_generations=self.num_generations, beta=self.beta, epsilon=self.epsilon,
                          num_iterations=self.num_iterations, loss_agg_mode=self.loss_agg_mode)

    def generation_config(self, eos_token_id: int | None = None) -> GenerationConfig:
        """The rollout sampler of the arm: AR, or Ψ-Spec with the self-drafter or the LoRA drafter."""
        if self.arm == "ar":
            mode = AR()
        else:
            spec = SpecSelf if self.arm == "self" else SpecLora
            mode = spec(draft_length=self.draft_length, draft_when_active_below=self.draft_when_active_below,
                        proposal=self.proposal, proposal_temperature=self.proposal_temperature)
        return GenerationConfig(mode=mode, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                eos_token_id=eos_token_id)


@dataclasses.dataclass(frozen=True)
class RLData:
    """train: JSONL records (rendered with the base checkpoint's prompt format) whose prompts the
    rollouts continue; eval: held-out records for the greedy exact match (the first `eval_size`);
    tokenizer: '' for the base checkpoint's own (else `byte`), or another ('byte', 'qwen3' or a directory),
    refused unless it is the base's (`train.allow_tokenizer_mismatch`, `train.inherit.check_tokenizer`)."""

    train: str = ""
    eval: str = ""
    eval_size: int = 64
    tokenizer: str = ""

    def __post_init__(self):
        if self.eval_size < 0:
            raise ConfigError(f"data.eval_size={self.eval_size}: expected ≥ 0")


# RL fine-tuning moves a trained model: a small constant rate, no decay of the weights towards 0.
RL_OPTIM = OptimConfig(lr=1e-5, warmup_steps=0, schedule="constant", weight_decay=0.0, clip_norm=1.0)
# The shared loop's section (`train.config.TrainConfig`), steps and intervals in RL steps. GRPO's loss is a
# centred surrogate near 0 whose gradient is exactly 0 while every group's rewards tie and the policy is the
# reference, so the loss-spike and zero-gradient checks would stop healthy runs: only the params' growth is
# watched by default (`train.divergence.*` turns the others on).
RL_TRAIN = TrainConfig(steps=20, log_every=1, eval_every=5, save_every=5, keep=2, keep_best=0,
                       divergence=DivergenceConfig(zero_grad_steps=0, loss_spike_factor=0.0))
# Knobs of the shared loop that GRPO does not read, refused at another value than RL_TRAIN's: why.
UNREAD = {"objective": "GRPO's objective is set by rl.*", "init_from": "the policy starts from --base",
          "eval_batches": "RL evaluates the exact match of data.eval_size held-out records",
          "keep_best": "RL logs no eval loss to rank checkpoints by"}


@dataclasses.dataclass(frozen=True)
class RLConfig:
    rl: RLSection = RLSection()
    data: RLData = RLData()
    optim: OptimConfig = RL_OPTIM
    mesh: MeshConfig = MeshConfig()
    train: TrainConfig = RL_TRAIN

    def __post_init__(self):
        for name, why in UNREAD.items():
            value = getattr(self.train, name)
            if value != getattr(RL_TRAIN, name):
                raise ConfigError(f"train.{name}={value!r}: not read by RL ({why}); expected "
                                  f"{getattr(RL_TRAIN, name)!r}")


# Fields a resumed run may change without being a different run: the shared loop's, and how many held-out
# records the exact match reads.
RESUMABLE = RESUMABLE_CHANGES | {"data.eval_size"}


def build(overrides: Any = (), base: RLConfig = RLConfig()) -> RLConfig:
    """The default tree (or `base`) with dotted overrides (`rl.beta=0.02`, `optim.lr=3e-6`)."""
    return ov.apply(base, overrides)


def knobs() -> list[tuple[str, str, Any]]:
    return ov.keys(RLConfig)


def load_reward(path: str, fmt: PromptFormat = PromptFormat()):
    """The reward terms [(fn, weight)]: `rewards.default_rewards(fmt)` for "", else the function at the dotted path
    `package.module.function` (weight 1). ConfigError when it does not import or is not callable."""
    if not path:
        return default_rewards(fmt)
    module, _, name = path.rpartition(".")
    if not module:
        raise ConfigError(f"rl.reward={path!r}: expected a dotted import path module.function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"rl.reward={path!r} does not import: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise ConfigError(f"rl.reward={path!r} is a {type(fn).__name__}, not a function (record, completion) → float")
    return ((fn, 1.0),)


def diff(a: RLConfig, b: RLConfig) -> list[str]:
    """Dotted keys whose values differ beyond `RESUMABLE`, as 'key: a -> b'."""
    da, db = ov.to_dict(a), ov.to_dict(b)
    out = []
    for section in da:
        for k in sorted(set(da[section]) | set(db.get(section, {}))):
            key = f"{section}.{k}"
            if key not in RESUMABLE and da[section].get(k) != db.get(section, {}).get(k):
                out.append(f"{key}: {da[section].get(k)!r} -> {db.get(section, {}).get(k)!r}")
    return out
