"""A draft model for speculative sampling (docs/algorithms.md §7.6): sized, then trained with the shared loop.

A draft model is a small Qwen3 that reads and writes the base's ids: its structure (`SIZE_FIELDS`) is
its own, everything else (vocabulary, special ids, positions, RoPE, norms) is the base checkpoint's
(`draft_model_config`). `DraftModelRun` is its run's own section, the experiment's `draft_model` section
too: `steps`, `batch_size`, optimizer (`optim`), objective (`objective`, `DistillConfig`: `loss` "tv",
distilled from the frozen base, `objectives.distill`, or "ntp", the AR trainer's next-token loss) and
size: explicit (`hidden_size` > 0 …) or a parameter budget (`sized_to`: the largest model of the base's
shape family within `params_ratio` × a gated-LoRA adapter's parameters, every parameter counted, the tied
embedding once). `DraftModelRunConfig` (the command line's) is the trainer's `model` (runtime fields),
`data`, `mesh` and `train` sections plus `draft_model` (`train.config.SideRunConfig`), so its keys are the
experiment's: `draft_model.objective.loss`, `draft_model.optim.lr`, `draft_model.hidden_size`.
`train_draft_model` trains it on the data and exports it to WORKDIR/final, a normal checkpoint
(`zarya_jax.checkpoint.load`, `inference.load_for_inference`). The draft settings and the base
checkpoint's content are part of the run's identity (`train.identity`), as for Uno's drafter. The data
are read with a tokenizer that must be the base's (`train.inherit.check_tokenizer`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar, Sequence

import jax

from ..config import ConfigError, LoraConfig, ModelConfig, PromptFormat
from ..files import atomic_write_json
from .. import checkpoint as ckpt_lib
from .. import lora as lora_lib
from ..objectives.ar import ar_objective
from ..objectives.distill import DistillConfig, distill_objective
from . import config as rc
from . import inherit
from .hooks import Hook
from .identity import file_fingerprint
from .loop import train
from .optim import OptimConfig

SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
               "tie_word_embeddings")
SETTINGS_FILE = "draft_model.json"


def draft_model_config(base: ModelConfig, size: ModelConfig) -> ModelConfig:
    """The base's config with the structure (`SIZE_FIELDS`) and runtime fields of `size`."""
    return base.replace(**{f: getattr(size, f) for f in SIZE_FIELDS}).with_runtime_of(size)


def lora_budget(base: ModelConfig, lora: LoraConfig) -> int:
    """Parameters of a gated-LoRA adapter `lora` on `base` (what a draft model's budget is relative to)."""
    return lora_lib.num_params(jax.eval_shape(lambda k: lora_lib.init_lora(base, lora, k), jax.random.PRNGKey(0)))


def sized_to(base: ModelConfig, budget: int) -> ModelConfig:
    """The largest draft model of the base's shape family with at most `budget` parameters
    (`ModelConfig.num_params`: everything, the tied embedding table once).

    The family: 1 … base.num_layers layers; width = heads × the base's head_dim; the base's MLP ratio;
    KV heads the largest divisor of the heads within the base's KV/heads ratio (at least 1); tied
    embeddings (at this scale the table is most of a small model). Ties: the deeper model.
    """
    if budget < 1:
        raise ConfigError(f"draft model budget={budget}: expected ≥ 1 parameter")
    ratio_f = base.intermediate_size / base.hidden_size
    best = None
    for layers in range(1, base.num_layers + 1):
        for heads in range(1, 4 * base.num_heads + 1):
            kv_most = max(1, heads * base.num_kv_heads // base.num_heads)
            kv = max(k for k in range(1, kv_most + 1) if heads % k == 0)
            d = heads * base.head_dim
            cand = draft_model_config(base, base.replace(
                hidden_size=d, intermediate_size=max(1, round(ratio_f * d)), num_layers=layers, num_heads=heads,
                num_kv_heads=kv, tie_word_embeddings=True))
            n = cand.num_params()
            if n <= budget and (best is None or n >= best.num_params()):
                best = cand
    if best is None:
        smallest = draft_model_config(base, base.replace(hidden_size=base.head_dim, num_layers=1, num_heads=1,
                                                         num_kv_heads=1, tie_word_embeddings=True,
                                                         intermediate_size=max(1, round(ratio_f * base.head_dim))))
        raise ConfigError(f"draft model budget={budget} parameters: below the smallest model of the base's family "
                          f"({smallest.num_params()} parameters: one layer, one head of {base.head_dim})")
    return best


# Uno trains a draft model, as its adapter, without weight decay on a short cosine schedule of its own
DRAFT_MODEL_OPTIM = OptimConfig(lr=3e-3, warmup_steps=20, schedule="cosine", weight_decay=0.0)
EXPLICIT_SIZE = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")


@dataclasses.dataclass(frozen=True)
class DraftModelRun:
    """An independent draft model for a frozen checkpoint (docs/algorithms.md §7.6): its objective
    (`objective`, `DistillConfig`: `loss` tv, distilled from the base, + `ce_weight` × cross-entropy: 1 by
    default, as TV alone stalls from a random init, see docs/uno.md; or ntp, next-token loss on the data),
    its optimizer (`optim`: AdamW at lr 3e-3, 20 warmup steps, cosine, no weight decay), its run (`steps`,
    `batch_size`) and its size: explicit (`hidden_size` > 0, with `intermediate_size`, `num_layers`,
    `num_heads`, `num_kv_heads`, the base's head_dim; embeddings tied), or `params_ratio` × the parameters
    of a gated-LoRA adapter on the base (the experiment's drafter's `drafter.lora`, the command line's
    `--lora-rank`; `sized_to`)."""

    steps: int = 300
    batch_size: int = 16
    objective: DistillConfig = DistillConfig(loss="tv", ce_weight=1.0)
    optim: OptimConfig = DRAFT_MODEL_OPTIM
    params_ratio: float = 1.0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"draft_model.{name}={getattr(self, name)}: expected ≥ 1")
        if not self.params_ratio > 0:
            raise ConfigError(f"draft_model.params_ratio={self.params_ratio}: expected > 0")
        if self.hidden_size and any(getattr(self, f) < 1 for f in EXPLICIT_SIZE):
            raise ConfigError(f"draft_model: an explicit size (hidden_size={self.hidden_size}) needs every one of "
                              f"{list(EXPLICIT_SIZE)} ≥ 1, got {[getattr(self, f) for f in EXPLICIT_SIZE]}")

    def size(self, base: ModelConfig, lora: LoraConfig) -> ModelConfig:
        """The draft model's config for `base`: its explicit size, else sized to `params_ratio` × the
        parameters of the adapter `lora` on the base."""
        if self.hidden_size:
            return draft_model_config(base, base.replace(tie_word_embeddings=True,
                                                         **{f: getattr(self, f) for f in EXPLICIT_SIZE}))
        return sized_to(base, int(self.params_ratio * lora_budget(base, lora)))


# The keys of the former flat draft-model section, and where each lives now.
MOVED_KEYS = {**{f"draft_model.{f.name}": f"draft_model.objective.{f.name}" for f in dataclasses.fields(DistillConfig)},
              "draft_model.lr": "draft_model.optim.lr", "draft_model.warmup_steps": "draft_model.optim.warmup_steps"}


@dataclasses.dataclass(frozen=True)
class DraftModelRunConfig(rc.SideRunConfig):
    """`python -m experiments.train_draft_model`'s config: the trainer's `model` (runtime fields; the rest
    is the base checkpoint's and the section's size), `data`, `mesh`, `train`, and the `draft_model` section."""

    draft_model: DraftModelRun = DraftModelRun()

    SECTION: ClassVar[str] = "draft_model"
    # the command line's former keys (`draft.*`, the size as `model.*`) and the trainer keys the section holds
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        **MOVED_KEYS, **rc.SideRunConfig.moved("draft_model"),
        **{f"draft.{f.name}": f"draft_model.objective.{f.name}" for f in dataclasses.fields(DistillConfig)},
        **{f"model.{f}": f"draft_model.{f}" for f in EXPLICIT_SIZE}}


def load_config(name_or_path: str, overrides: list[str] | dict[str, Any] = ()) -> DraftModelRunConfig:
    """A preset or YAML/JSON file (its data, mesh and train sections and the model's runtime fields), then
    the dotted overrides (`draft_model.hidden_size=…`, `draft_model.objective.loss=ntp`, …)."""
    return DraftModelRunConfig.load(name_or_path, overrides)


def _settings(base: str, model: ModelConfig, draft: DistillConfig) -> dict:
    """What WORKDIR/draft_model.json records."""
    return {"base": os.path.abspath(base), "draft": dataclasses.asdict(draft),
            "model": {f: getattr(model, f) for f in SIZE_FIELDS}, "params": model.num_params()}


def train_draft_model(cfg: DraftModelRunConfig, base: str, workdir: str, *, lora: LoraConfig = LoraConfig(rank=16),
                      force: bool = False, hooks: Sequence[Hook] = ()) -> dict:
    """Trains (or resumes) a draft model for the checkpoint `base` into `workdir`, sized by
    `cfg.draft_model` (a budget relative to the adapter `lora` on the base); returns the loop's summary
    (`final_params`: the exported draft checkpoint, WORKDIR/final, when the run completed).
    WORKDIR/draft_model.json records the settings."""
    if not os.path.isdir(base):
        raise FileNotFoundError(f"--base {base!r}: expected a checkpoint directory")
    base_config = ckpt_lib.load_config(base)
    inherit.check_tokenizer(cfg.data.tokenizer, base, base_config, cfg.train.allow_tokenizer_mismatch, "--base")
    run = cfg.run_config(cfg.draft_model.size(base_config, lora), objective="ar", init_from="")
    model, draft = run.model, cfg.draft_model.objective
    recorded = ckpt_lib.load_prompt_format(base)
    if recorded is not None and PromptFormat.of(run.data) == PromptFormat():  # render as the base was trained
        run = run.replace(data=dataclasses.replace(run.data, **dataclasses.asdict(recorded)))
    settings = _settings(base, model, draft)
    frozen = objective = None
    if draft.loss == "tv":
        verify = run.train.verify_checkpoints
        frozen = lambda mesh: ckpt_lib.load(base, mesh=mesh, verify=verify)[0]  # straight onto the run's mesh
        objective = distill_objective(model, base_config, draft)
    else:
        objective = ar_objective(model)
    sums = file_fingerprint(os.path.join(base, ckpt_lib.CHECKSUMS_FILE))
    identity = {"draft_model": {**json.loads(json.dumps(settings)), "base": sums or os.path.realpath(base)}}
    summary = train(run, workdir, force=force, objective=objective, frozen_params=frozen, hooks=hooks,
                    identity_extra=identity)
    atomic_write_json(os.path.join(workdir, SETTINGS_FILE), settings)
    return summary
