"""The experiment's configuration: one typed tree of sections, each a frozen dataclass.

`ExperimentConfig` is the trainer's sections (`model`, `zarya`, `optim`, `data`, `mesh`, `train`, see
`zarya_jax.train.config`) plus `task` (the embedded task generator, or your own files), `drafter`
(Uno's LoRA drafter, trained only for `spec-lora`), `eval` (modes, budget, batch, answer extraction and
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
from ..objectives.dcd import DcdConfig
from ..objectives.drafter import DrafterConfig
from ..train.config import RunConfig, TrainConfig
from ..train.optim import OptimConfig

DEFAULT_MODES = ("ar", "mdm", "slotted", "spec-self")


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
    its adapter (`rank`, `alpha`), its optimizer (`lr`, `warmup_steps`) and its run (`steps`,
    `batch_size`, the block curriculum `block_sizes`), the layers that carry it (`layers`: all | top |
    bottom | indices, `LoraConfig.layers`), its objective (`objective`: tv | dcd) and, for dcd, the
    consistency-distillation knobs (`dcd.*`, `objectives.dcd.DcdConfig`). The rest of its run comes from the
    experiment's own sections (data, mesh, train) and the tokenizer and prompt format from the base
    checkpoint."""

    steps: int = 300
    rank: int = 16
    alpha: float = 32.0
    lr: float = 2e-3
    warmup_steps: int = 20
    batch_size: int = 16
    block_sizes: tuple[int, ...] = (2, 4, 8)
    layers: str | tuple[int, ...] = "all"
    objective: str = "tv"
    dcd: DcdConfig = DcdConfig()

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"drafter.{name}={getattr(self, name)}: expected ≥ 1")
        self.lora_config(), self.objective_config()  # their own checks, now rather than after training

    def lora_config(self) -> LoraConfig:
        return LoraConfig(rank=self.rank, alpha=self.alpha, layers=self.layers)

    def objective_config(self) -> DrafterConfig:
        return DrafterConfig(block_sizes=self.block_sizes, objective=self.objective)


@dataclasses.dataclass(frozen=True)
class GoalsSection:
    """The report's targets (test split): AR's exact match (`ar_accuracy`, with a stretch goal), mode B's
    tokens per forward and its accuracy gap to AR (a fraction: 0.03 = 3 points), the self-drafter's tokens
    per forward. Speculative modes are also held to AR's outputs token for token (lossless)."""

    ar_accuracy: float = 0.8
    ar_accuracy_stretch: float = 0.9
    slotted_tokens_per_forward: float = 2.0
    slotted_accuracy_gap: float = 0.03
    spec_self_tokens_per_forward: float = 2.5


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(RunConfig):
    """The trainer's sections plus the task, the drafter, the evaluation, the frontier and the goals."""

    task: TaskSection = TaskSection()
    drafter: DrafterSection = DrafterSection()
    eval: EvalConfig = EvalConfig()
    frontier: FrontierConfig = FrontierConfig()
    goals: GoalsSection = GoalsSection()

    def __post_init__(self):
        if self.frontier.enabled and not (self.task.num_val or self.task.val_file):
            raise ConfigError("the frontier chooses decoding knobs on a validation split: set task.num_val ≥ 1 (or "
                              "task.val_file), or frontier.enabled=false to use eval.knobs")


def default_config() -> ExperimentConfig:
    """The quickstart defaults, tuned for a 2-core CPU (see docs/results.md for measured results): a 0.82M
    Qwen3 on the byte-level task, 2500 steps of batch 32 with the slot curriculum 2 → 4 → 8 and λ = 0.3
    (more weight on the AR rows, which also verify every parallel mode's tokens)."""
    return ExperimentConfig(
        model=ModelConfig(vocab_size=264, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                          num_kv_heads=2, head_dim=32, max_position_embeddings=512, mask_token_id=259,
                          eos_token_id=258, pad_token_id=256),
        zarya=ZaryaConfig(slotted_training=True, slot_size_set=(2, 4, 8), slot_step_borders=(0.1, 0.4, 1.0),
                          diffusion_loss_proportion=0.3),
        optim=OptimConfig(lr=2e-3, warmup_steps=100, schedule="cosine", min_lr_ratio=0.05, weight_decay=0.01),
        data=DataConfig(tokenizer="byte", max_length=88, batch_size=32, pack=False, seed=0),
        train=TrainConfig(steps=2500, log_every=25, eval_every=0, save_every=500, keep=1, keep_best=0,
                          async_checkpointing=False),
        eval=EvalConfig(modes=DEFAULT_MODES, max_new_tokens=32, batch_size=25, limit=0, answer="final",
                        answer_regex="", seed=0, ckpt="", batch1_examples=40,
                        knobs=ModeKnobs(mdm=Knobs(steps=8, alpha0=0.5),
                                        slotted=Knobs(slot_size=8, serial_num_blocks=4, slot_threshold=0.9,
                                                      token_threshold=0.9, ar_infill=True, ar_first_token=True),
                                        spec_self=Knobs(draft_length=8), spec_lora=Knobs(draft_length=8))),
        frontier=FrontierConfig())


SMOKE = {"task.num_train": 64, "task.num_test": 4, "task.num_val": 4, "model.hidden_size": 32,
         "model.intermediate_size": 64, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
         "model.head_dim": 16, "zarya.slot_size_set": [4], "zarya.slot_step_borders": [1.0], "data.batch_size": 8,
         "optim.warmup_steps": 2, "train.steps": 4, "train.log_every": 1,
         "train.save_every": 0, "eval.batch_size": 4, "eval.max_new_tokens": 8, "eval.batch1_examples": 2,
         "eval.knobs.slotted.slot_size": 4, "eval.knobs.slotted.serial_num_blocks": 2,
         "eval.knobs.spec-self.draft_length": 4, "frontier.slotted_slot_size": [4],
         "frontier.slotted_serial_num_blocks": [0], "frontier.slotted_slot_threshold": [0.9],
         "frontier.slotted_token_threshold": [0.5, 0.9], "frontier.slotted_corrections": ["refusion", "both"],
         "frontier.mdm_steps": [0, 2], "frontier.mdm_alpha0": [0.5], "frontier.mdm_orders": ["confidence"],
         "frontier.mdm_sequential": ["ar"], "frontier.draft_lengths": [4]}
"""The smoke size (`--smoke`, tests): seconds instead of minutes, a tiny model, a handful of steps and
examples, one slot size."""


# Settings that change how a run is shown or checked, not what it computes.
_PRESENTATION = {"train": ("progress_bar", "verify_checkpoints")}


def comparable(config_dict: dict) -> dict:
    """A config as JSON (`overrides.to_dict`), without the settings that do not change the results."""
    out = json.loads(json.dumps(config_dict))
    for section, names in _PRESENTATION.items():
        for name in names:
            out.get(section, {}).pop(name, None)
    return out
