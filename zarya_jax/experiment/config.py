"""The experiment's configuration: one typed tree of sections, each a frozen dataclass.

`ExperimentConfig` is the trainer's sections (`model`, `zarya`, `optim`, `data`, `mesh`, `train`, see
`zarya_jax.train.config`) plus `task` (the embedded task generator, or your own files), `drafter`
(Uno's LoRA drafter, trained only for `spec-lora` / `spec-lora-fused`), `draft_model` (an independent draft model, trained only
for `spec-model`), `eval` (modes, budget, batch, answer extraction and
per-mode decoding knobs `eval.knobs.<mode>.<GenerationConfig field>`), `frontier` (the grid and the
choice rule) and `goals` (the numbers the report's targets are measured against). Every `--set` of the
quickstart and every key of a sweep file is a dotted key of this tree, typed and checked by
`zarya_jax.overrides`; each field is validated once, where its section is built.
"""
from __future__ import annotations

import dataclasses
import json

from ..config import ConfigError, LoraConfig, ModelConfig, ZaryaConfig
from ..data.pipeline import DataConfig
from ..eval import tasks
from ..eval.evaluate import EvalConfig, Knobs, ModeKnobs
from ..eval.frontier import FrontierConfig
from ..objectives.distill import LOSSES as DRAFT_LOSSES
from ..objectives.dcd import DcdConfig
from ..objectives.drafter import DrafterConfig
from ..train.config import RunConfig, TrainConfig
from ..train.optim import OptimConfig

DEFAULT_MODES = ("ar", "mdm", "slotted", "spec-self", "spec-lora", "spec-self-fused", "spec-lora-fused")
# Uno's setting (`train.objective=ar`): a plain AR model, frozen, and the LoRA drafter trained on it
UNO_MODES = ("ar", "spec-lora", "spec-lora-fused")
# ... with its own base run (plain next-token loss learns the task in 1500 steps of batch 32) and a longer
# drafter run (1500 steps of 16): on a plain AR base the adapter learns to look ahead from scratch, where a
# Zarya base already drafts (its MDM rows) and the default 400 steps of 8 suffice (docs/uno.md)
UNO_DEFAULTS = {"eval.modes": list(UNO_MODES), "data.batch_size": 32, "train.steps": 1500, "optim.warmup_steps": 100,
                "drafter.steps": 1500, "drafter.batch_size": 16}


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """The embedded arithmetic task (`zarya_jax.eval.tasks`), or your own `train_file` + `test_file` (and
    `val_file`; without it the last `num_val` records of `train_file` are held out for validation)."""

    difficulty: int = 1
    num_train: int = 50000
    num_test: int = 200
    num_val: int = 100
    seed: int = 0
    train_file: str = ""
    test_file: str = ""
    val_file: str = ""

    def __post_init__(self):
        tasks.task_config(self.difficulty)
        for name in ("num_train", "num_test", "num_val"):
            value = getattr(self, name)
            if not 0 <= value <= tasks.MAX_PROBLEMS:
                raise ConfigError(f"task.{name}={value}: expected 0 … {tasks.MAX_PROBLEMS}")
        if bool(self.train_file) != bool(self.test_file):
            raise ConfigError("task.train_file and task.test_file must be given together")


@dataclasses.dataclass(frozen=True)
class DrafterSection:
    """Uno's LoRA drafter, trained on the frozen checkpoint only when `eval.modes` has spec-lora (docs/algorithms.md §7):
    its adapter (`rank`, `alpha`, the `noise` convention of its draft rows, the `layers` that carry it: all |
    top | bottom | indices, `LoraConfig.layers`), its objective (the block curriculum `block_sizes`, the loss
    weights `tv_weight`, `ce_weight`, `kl_weight`, and `objective`: tv | dcd, with the consistency-distillation
    knobs `dcd.*`, `objectives.dcd.DcdConfig`), its optimizer (`lr`, `warmup_steps`) and its run (`steps`,
    `batch_size`). The rest of its run comes from the experiment's own sections (data, mesh, train) and the
    tokenizer and prompt format from the base checkpoint. `task_difficulty` (0: the task's) and `task_seed`
    (-1: the task's) train it on shifted data instead: the embedded task at another difficulty or seed (the
    held-out splits' prompts excluded), while it is still evaluated on the experiment's own test split."""

    steps: int = 400
    rank: int = 16
    alpha: float = 32.0
    lr: float = 2e-3
    warmup_steps: int = 20
    batch_size: int = 8
    block_sizes: tuple[int, ...] = (2, 4, 8, 16)
    noise: str = "uniform"
    tv_weight: float = 1.0
    ce_weight: float = 1.0  # TV alone stalls on a plain AR base (docs/uno.md: the diagnostics)
    kl_weight: float = 0.0
    task_difficulty: int = 0
    task_seed: int = -1
    layers: str | tuple[int, ...] = "all"
    objective: str = "tv"
    dcd: DcdConfig = DcdConfig()

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"drafter.{name}={getattr(self, name)}: expected ≥ 1")
        if self.task_difficulty:
            tasks.task_config(self.task_difficulty)
        if self.task_seed < -1:
            raise ConfigError(f"drafter.task_seed={self.task_seed}: expected a seed ≥ 0, or -1 (the task's own)")
        self.lora_config(), self.objective_config()  # their own checks, now rather than after training

    def shifted(self) -> bool:
        """Whether the drafter trains on other data than the base (another difficulty or task seed)."""
        return bool(self.task_difficulty) or self.task_seed >= 0

    def lora_config(self) -> LoraConfig:
        return LoraConfig(rank=self.rank, alpha=self.alpha, noise=self.noise, layers=self.layers)

    def objective_config(self) -> DrafterConfig:
        return DrafterConfig(block_sizes=self.block_sizes, tv_weight=self.tv_weight, ce_weight=self.ce_weight,
                             kl_weight=self.kl_weight, objective=self.objective)


@dataclasses.dataclass(frozen=True)
class DraftModelSection:
    """The independent draft model of `spec-model` (docs/algorithms.md §7.6), trained for the frozen checkpoint only
    when `eval.modes` has spec-model: its loss (`ntp`: next-token loss on the data; `tv`: distilled from
    the base, + `ce_weight` × cross-entropy: 1 by default, as TV alone stalls from a random init, see
    docs/uno.md), its run (`steps`, `lr`, `warmup_steps`, `batch_size`) and
    its size: explicit (`hidden_size` > 0, with `intermediate_size`, `num_layers`, `num_heads`,
    `num_kv_heads`, the base's head_dim; embeddings tied), or `params_ratio` × the parameters of the
    experiment's LoRA drafter (`drafter.rank` on the base; `train.draft_model.sized_to`: the largest model
    of the base's shape family within that budget, every parameter counted, the tied embedding once)."""

    loss: str = "tv"
    ce_weight: float = 1.0
    steps: int = 300
    lr: float = 3e-3
    warmup_steps: int = 20
    batch_size: int = 16
    params_ratio: float = 1.0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0

    def __post_init__(self):
        if self.loss not in DRAFT_LOSSES:
            raise ConfigError(f"draft_model.loss={self.loss!r}: expected one of {DRAFT_LOSSES}")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"draft_model.{name}={getattr(self, name)}: expected ≥ 1")
        if not self.params_ratio > 0:
            raise ConfigError(f"draft_model.params_ratio={self.params_ratio}: expected > 0")
        if self.ce_weight < 0:
            raise ConfigError(f"draft_model.ce_weight={self.ce_weight}: expected ≥ 0")
        explicit = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")
        if self.hidden_size and any(getattr(self, f) < 1 for f in explicit):
            raise ConfigError(f"draft_model: an explicit size (hidden_size={self.hidden_size}) needs every one of "
                              f"{list(explicit)} ≥ 1, got {[getattr(self, f) for f in explicit]}")


@dataclasses.dataclass(frozen=True)
class GoalsSection:
    """The report's targets (test split): AR's exact match (`ar_accuracy`, with a stretch goal), mode B's
    tokens per forward and its accuracy gap to AR (a fraction: 0.03 = 3 points), the self-drafter's and the
    LoRA drafter's tokens per forward, and each fused mode's tokens per forward as a multiple of its
    drafter's two-pass mode (`fused_self_gain`, `fused_lora_gain`). Speculative modes are also held to AR's
    outputs token for token (lossless)."""

    ar_accuracy: float = 0.8
    ar_accuracy_stretch: float = 0.9
    slotted_tokens_per_forward: float = 2.0
    slotted_accuracy_gap: float = 0.03
    spec_self_tokens_per_forward: float = 2.5
    spec_lora_tokens_per_forward: float = 2.5
    fused_self_gain: float = 1.7
    fused_lora_gain: float = 1.5


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(RunConfig):
    """The trainer's sections plus the task, the drafter, the draft model, the evaluation, the frontier and
    the goals."""

    task: TaskSection = TaskSection()
    drafter: DrafterSection = DrafterSection()
    draft_model: DraftModelSection = DraftModelSection()
    eval: EvalConfig = EvalConfig()
    frontier: FrontierConfig = FrontierConfig()
    goals: GoalsSection = GoalsSection()

    def __post_init__(self):
        if self.drafter.shifted() and self.task.train_file:
            raise ConfigError("drafter.task_difficulty / drafter.task_seed shift the embedded task's data, but "
                              f"the experiment trains on task.train_file={self.task.train_file!r}")
        if self.frontier.enabled and not (self.task.num_val or self.task.val_file):
            raise ConfigError("the frontier chooses decoding knobs on a validation split: set task.num_val ≥ 1 (or "
                              "task.val_file), or frontier.enabled=false to use eval.knobs")


def default_config() -> ExperimentConfig:
    """The quickstart defaults, tuned for a 2-core CPU (see docs/results.md for measured results): a 0.82M
    Qwen3 on the byte-level task, 7000 steps of batch 8 with the slot curriculum 2 → 4 → 8 and λ = 0.3
    (more weight on the AR rows, which also verify every parallel mode's tokens).

    Batch 8: on this task a small batch learns more per example (measured: 48k examples at batch 8 reach
    the exact match 64k reach at batch 16, and 64k at batch 32 stay 10 points below), and a CPU step costs
    in proportion to its rows. Rematerialised layers (`model.remat`): XLA:CPU runs a layer scan's backward
    faster recomputing each layer than reading back the stacked activations (about 1.3× per step here)."""
    return ExperimentConfig(
        model=ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                          num_kv_heads=2, head_dim=32, max_position_embeddings=512, mask_token_id=259,
                          eos_token_id=258, pad_token_id=256, remat=True),
        zarya=ZaryaConfig(slotted_training=True, slot_size_set=(2, 4, 8), slot_step_borders=(0.1, 0.4, 1.0),
                          diffusion_loss_proportion=0.3),
        optim=OptimConfig(lr=2e-3, warmup_steps=300, schedule="cosine", min_lr_ratio=0.05, weight_decay=0.01),
        data=DataConfig(tokenizer="byte", max_length=88, batch_size=8, pack=False, seed=0),
        train=TrainConfig(steps=7000, log_every=50, eval_every=0, save_every=1000, keep=1, keep_best=0,
                          async_checkpointing=False),
        eval=EvalConfig(modes=DEFAULT_MODES, max_new_tokens=32, batch_size=25, limit=0, answer="final",
                        answer_regex="", seed=0, ckpt="", batch1_examples=40,
                        knobs=ModeKnobs(mdm=Knobs(steps=8, alpha0=0.5),
                                        slotted=Knobs(slot_size=8, serial_num_blocks=4, slot_threshold=0.9,
                                                      token_threshold=0.9, ar_infill=True, ar_first_token=True),
                                        spec_self=Knobs(draft_length=8), spec_lora=Knobs(draft_length=8),
                                        spec_model=Knobs(draft_length=4), spec_self_fused=Knobs(draft_length=4),
                                        spec_lora_fused=Knobs(draft_length=4))),
        frontier=FrontierConfig())


SMOKE = {"task.num_train": 64, "task.num_test": 4, "task.num_val": 4, "model.hidden_size": 32,
         "model.intermediate_size": 64, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
         "model.head_dim": 16, "zarya.slot_size_set": [4], "zarya.slot_step_borders": [1.0], "data.batch_size": 8,
         "optim.warmup_steps": 2, "train.steps": 4, "drafter.steps": 4, "drafter.batch_size": 8,
         "drafter.warmup_steps": 1, "drafter.block_sizes": [4], "train.log_every": 1,
         "train.save_every": 0, "eval.batch_size": 4, "eval.max_new_tokens": 8, "eval.batch1_examples": 2,
         "eval.knobs.slotted.slot_size": 4, "eval.knobs.slotted.serial_num_blocks": 2,
         "eval.knobs.spec-self.draft_length": 4, "frontier.slotted_slot_size": [4],
         "frontier.slotted_serial_num_blocks": [0], "frontier.slotted_slot_threshold": [0.9],
         "frontier.slotted_token_threshold": [0.5, 0.9], "frontier.slotted_corrections": ["refusion", "both"],
         "frontier.mdm_steps": [0, 2], "frontier.mdm_alpha0": [0.5], "frontier.mdm_orders": ["confidence"],
         "frontier.mdm_sequential": ["ar"], "frontier.draft_lengths": [4], "frontier.fused_draft_lengths": [2],
         "draft_model.steps": 4,
         "draft_model.batch_size": 8}
"""The smoke size (`--smoke`, tests): seconds instead of minutes, a tiny model, a handful of steps and
examples, one slot size."""


# Settings that change how a run is shown or checked, not what it computes.
_PRESENTATION = {"train": ("progress_bar", "verify_checkpoints", "allow_tokenizer_mismatch")}


def comparable(config_dict: dict) -> dict:
    """A config as JSON (`overrides.to_dict`), without the settings that do not change the results."""
    out = json.loads(json.dumps(config_dict))
    for section, names in _PRESENTATION.items():
        for name in names:
            out.get(section, {}).pop(name, None)
    return out
