"""The experiment's configuration: one typed tree of sections, each a frozen dataclass, composed from the
library's own configs rather than copies of their fields.

`ExperimentConfig` holds the trainer's sections (`model`, `zarya`, `optim`, `data`, `mesh`, `train`, see
`zarya_jax.train.config`; `config.trainer` is them as the `RunConfig` the training loop takes), `task` (the
embedded task generator, or your own files), `drafter` (`TaskDrafterRun`: Uno's LoRA drafter, trained only
for `spec-lora` / `spec-lora-fused`, from its `lora` adapter, `objective`, `dcd` and `optim` sections),
`draft_model` (`DraftModelRun`: an independent draft model, trained only for `spec-model`, with its own
`objective` and `optim`; the drafter's and the draft model's sections are those of
`experiments.train_drafter` / `train_draft_model` too, `train.drafter.DrafterRun`,
`train.draft_model.DraftModelRun`, so a key is spelled alike there), `eval` (modes, budget, batch, answer
extraction and per-mode decoding knobs `eval.knobs.<mode>.<field>`), `frontier` (the grid and the choice
rule) and `goals` (the numbers the report's targets are measured against). Every config is a frozen,
hashable dataclass (a jit static argument; equal configs hash equal). Every `--set` of the quickstart and every key of a sweep file is a
dotted key of this tree (`drafter.optim.weight_decay`, `draft_model.optim.lr`, `drafter.lora.rank`), typed
and checked by `zarya_jax.overrides`; each field is validated once, where its section is built. A key
that has moved (`drafter.lr`, now `drafter.optim.lr`) is an error naming its new place (`MOVED_KEYS`).
"""
from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

from ..config import ConfigError, LoraConfig, ModelConfig, ZaryaConfig
from ..data.pipeline import DataConfig
from ..eval import tasks
from ..eval.evaluate import EvalConfig, mode_knobs
from ..eval import frontier as frontier_lib
from ..eval.frontier import FrontierConfig
from ..eval.speed import SpeedConfig
from ..objectives.drafter import DrafterConfig
from ..train import draft_model as draft_model_run
from ..train import drafter as drafter_run
from ..train.config import PRESENTATION, RunConfig, TrainConfig
from ..train.draft_model import DraftModelRun
from ..train.drafter import DrafterRun
from ..train.sharding import MeshConfig
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
    """The embedded arithmetic task (`zarya_jax.eval.tasks`): `name` one of `tasks.TASKS` (`arith`, the terse
    answers; `long`, worked solutions of 123–271 tokens) at `difficulty`, or your own `train_file` +
    `test_file` (and `val_file`; without it the last `num_val` records of `train_file` are held out for
    validation)."""

    name: str = "arith"
    difficulty: int = 1
    num_train: int = 50000
    num_test: int = 200
    num_val: int = 100
    seed: int = 0
    train_file: str = ""
    test_file: str = ""
    val_file: str = ""

    def __post_init__(self):
        try:
            tasks.task_config(self.difficulty, self.name)
        except ValueError as e:
            raise ConfigError(f"task.name={self.name!r}, task.difficulty={self.difficulty!r}: {e}") from None
        for name in ("num_train", "num_test", "num_val"):
            value = getattr(self, name)
            if not 0 <= value <= tasks.MAX_PROBLEMS:
                raise ConfigError(f"task.{name}={value}: expected 0 … {tasks.MAX_PROBLEMS}")
        if bool(self.train_file) != bool(self.test_file):
            raise ConfigError("task.train_file and task.test_file must be given together")


@dataclasses.dataclass(frozen=True)
class TaskDrafterRun(DrafterRun):
    """The experiment's `drafter` section: Uno's LoRA drafter (`train.drafter.DrafterRun`, the command line's
    section too: `steps`, `batch_size`, `lora`, `objective`, `dcd`, `optim`), trained on the frozen checkpoint
    only when `eval.modes` has spec-lora (docs/algorithms.md §7). The rest of its run comes from the
    experiment's trainer sections (data, mesh, train) and the tokenizer and prompt format from the base
    checkpoint. `task_difficulty` (0: the task's) and `task_seed` (None: the task's) train it on shifted data
    instead: the embedded task at another difficulty or seed (the held-out splits' prompts excluded), while it
    is still evaluated on the experiment's own test split."""

    task_difficulty: int = 0
    task_seed: int | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.task_difficulty:
            tasks.task_config(self.task_difficulty)

    def shifted(self) -> bool:
        """Whether the drafter trains on other data than the base (another difficulty or task seed)."""
        return bool(self.task_difficulty) or self.task_seed is not None


# The experiment's drafter at toy scale: rank 16, alpha 32 (not Uno's 128 / 2048), blocks 2 → 16, CE on
# (TV alone stalls on a plain AR base: docs/uno.md, the diagnostics).
TOY_DRAFTER = TaskDrafterRun(lora=LoraConfig(rank=16, alpha=32.0),
                             objective=DrafterConfig(block_sizes=(2, 4, 8, 16), ce_weight=1.0))


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
class ExperimentConfig:
    """The trainer's sections, then the task, the drafter, the draft model, the evaluation, the frontier, the
    choice for time (`speed`: needs the frontier and AR among the modes, else skipped) and the goals. Each stage of `zarya_jax.experiment.stages` takes the sections it reads, never the whole
    (`zarya_jax.experiment.plan` binds them)."""

    model: ModelConfig
    zarya: ZaryaConfig = ZaryaConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    train: TrainConfig = TrainConfig()
    task: TaskSection = TaskSection()
    drafter: TaskDrafterRun = TOY_DRAFTER
    draft_model: DraftModelRun = DraftModelRun()
    eval: EvalConfig = EvalConfig()
    frontier: FrontierConfig = FrontierConfig()
    speed: SpeedConfig = SpeedConfig()
    goals: GoalsSection = GoalsSection()

    # The keys of the former flat drafter / draft-model sections, and where each lives now: a sweep file
    # or `--set` still naming one is an error that names the new key (`zarya_jax.overrides`).
    MOVED_KEYS: ClassVar[dict[str, str]] = {**drafter_run.MOVED_KEYS, **draft_model_run.MOVED_KEYS}

    def __post_init__(self):
        if self.drafter.task_difficulty:
            try:
                tasks.task_config(self.drafter.task_difficulty, self.task.name)
            except ValueError as e:
                raise ConfigError(f"drafter.task_difficulty={self.drafter.task_difficulty}: {e}") from None
        if self.drafter.shifted() and self.task.train_file:
            raise ConfigError("drafter.task_difficulty / drafter.task_seed shift the embedded task's data, but "
                              f"the experiment trains on task.train_file={self.task.train_file!r}")
        if self.frontier.enabled and not (self.task.num_val or self.task.val_file):
            raise ConfigError("the frontier chooses decoding knobs on a validation split: set task.num_val ≥ 1 (or "
                              "task.val_file), or frontier.enabled=false to use eval.knobs")
        if self.frontier.enabled:
            swept = {mode for mode, _ in frontier_lib.grid_points(self.frontier, self.eval.modes,
                                                                  self.eval.max_new_tokens)}
            for mode in (m for m in self.eval.modes if m not in swept):
                raise ConfigError(f"frontier.grid.{mode}: no point of it decodes at eval.max_new_tokens="
                                  f"{self.eval.max_new_tokens} (e.g. a block or slot larger than the budget)")

    @property
    def trainer(self) -> RunConfig:
        """The trainer's sections, as the `RunConfig` that `train.loop.train` takes."""
        return RunConfig(model=self.model, zarya=self.zarya, optim=self.optim, data=self.data, mesh=self.mesh,
                         train=self.train)

    def replace(self, **sections) -> "ExperimentConfig":
        return dataclasses.replace(self, **sections)


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
                        knobs=mode_knobs({"mdm": {"steps": 8, "alpha0": 0.5},
                                          "slotted": {"slot_size": 8, "serial_num_blocks": 4, "slot_threshold": 0.9,
                                                      "token_threshold": 0.9, "ar_infill": True,
                                                      "ar_first_token": True},
                                          "spec-self": {"draft_length": 8}, "spec-lora": {"draft_length": 8},
                                          "spec-model": {"draft_length": 4}, "spec-self-fused": {"draft_length": 4},
                                          "spec-lora-fused": {"draft_length": 4}})),
        frontier=FrontierConfig())


SMOKE = {"task.num_train": 64, "task.num_test": 4, "task.num_val": 4, "model.hidden_size": 32,
         "model.intermediate_size": 64, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
         "model.head_dim": 16, "zarya.slot_size_set": [4], "zarya.slot_step_borders": [1.0], "data.batch_size": 8,
         "optim.warmup_steps": 2, "train.steps": 4, "drafter.steps": 4, "drafter.batch_size": 8,
         "drafter.optim.warmup_steps": 1, "drafter.objective.block_sizes": [4], "train.log_every": 1,
         "train.save_every": 0, "eval.batch_size": 4, "eval.max_new_tokens": 8, "eval.batch1_examples": 2,
         "eval.knobs.slotted.slot_size": 4, "eval.knobs.slotted.serial_num_blocks": 2,
         "eval.knobs.spec-self.draft_length": 4, "frontier.grid.slotted.slot_size": [4],
         "frontier.grid.slotted.serial_num_blocks": [0], "frontier.grid.slotted.slot_threshold": [0.9],
         "frontier.grid.slotted.token_threshold": [0.5, 0.9],
         "frontier.grid.slotted.ar_infill,ar_first_token": [[False, False], [True, True]],
         "frontier.grid.mdm.steps": [0, 2], "frontier.grid.mdm.alpha0": [0.5], "frontier.grid.mdm.order": ["confidence"],
         "frontier.grid.mdm.sequential": ["ar"],
         **{f"frontier.grid.{m}.draft_length": [4] for m in ("spec-self", "spec-lora", "spec-model")},
         **{f"frontier.grid.{m}.draft_length": [2] for m in ("spec-self-fused", "spec-lora-fused")},
         **{f"frontier.grid.{m}.scenarios": [0] for m in ("spec-self-fused", "spec-lora-fused")},
         "draft_model.steps": 4, "draft_model.batch_size": 8, "speed.batches": [1, 2], "speed.examples": 2,
         "speed.repeats": 1}
"""The smoke size (`--smoke`, tests): seconds instead of minutes, a tiny model, a handful of steps and
examples, one slot size."""

# The long-answer task (`--task long`, `tasks.LONG_DIFFICULTY`): rows that hold the longest prompt + answer
# (376 byte tokens) and its EOS, a budget that holds the longest answer (271) and a look-ahead block; the
# model's 512 positions hold prompt + budget + a draft window. Applied before --smoke, so a smoke run stays tiny.
LONG_TASK = {"task.name": "long", "data.max_length": 384, "eval.max_new_tokens": 288}


def comparable(config_dict: dict) -> dict:
    """A config as JSON (`overrides.to_dict`), without the settings that do not change the results."""
    out = json.loads(json.dumps(config_dict))
    for key in PRESENTATION:  # how a run is shown or checked, not what it computes (`train.config`)
        section, _, name = key.partition(".")
        out.get(section, {}).pop(name, None)
    return out
