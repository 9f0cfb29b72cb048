"""A draft model for speculative sampling (docs/algorithms.md §7.6): sized, then trained with the shared loop.

A draft model is a small Qwen3 that reads and writes the base's ids: its structure (`SIZE_FIELDS`) is
its own, everything else (vocabulary, special ids, positions, RoPE, norms) is the base checkpoint's
(`draft_model_config`). Its size is given explicitly or as a parameter budget (`sized_to`: the largest
model of the base's shape family within the budget, every parameter counted, the tied embedding once).
`train_draft_model` trains it on the data with `draft.loss` = "ntp" (the AR trainer's next-token loss)
or "tv" (distilled from the frozen base, `objectives.distill`) and exports it to WORKDIR/final, a normal
checkpoint (`zarya_jax.checkpoint.load`, `inference.load_for_inference`). The draft settings and the
base checkpoint's content are part of the run's identity (`train.identity`), as for Uno's drafter. The
data are read with a tokenizer that must be the base's (`train.inherit.check_tokenizer`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import jax

from .. import overrides as ov
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


@dataclasses.dataclass(frozen=True)
class DraftModelRunConfig(rc.RunConfig):
    """The run sections (`model` gives the draft model's size, `SIZE_FIELDS`; the rest comes from the
    base checkpoint) plus `draft` (the loss)."""

    draft: DistillConfig = DistillConfig()


DEFAULTS = {"train.objective": "ar"}


def load_config(name_or_path: str, overrides: list[str] | dict[str, Any] = ()) -> DraftModelRunConfig:
    """A preset or YAML/JSON file, then the dotted overrides (`model.hidden_size=…`, `draft.loss=tv`, …)."""
    return rc.load(name_or_path, {**DEFAULTS, **ov.parse_all(overrides)}, cls=DraftModelRunConfig)


def _settings(base: str, model: ModelConfig, draft: DistillConfig) -> dict:
    return {"base": os.path.abspath(base), "draft": dataclasses.asdict(draft),
            "model": {f: getattr(model, f) for f in SIZE_FIELDS}, "params": model.num_params()}


def train_draft_model(cfg: DraftModelRunConfig, base: str, workdir: str, *, force: bool = False,
                      hooks: Sequence[Hook] = ()) -> dict:
    """Trains (or resumes) a draft model for the checkpoint `base` into `workdir`; returns the loop's
    summary (`final_params`: the exported draft checkpoint, WORKDIR/final, when the run completed).
    WORKDIR/draft_model.json records the settings."""
    if not os.path.isdir(base):
        raise FileNotFoundError(f"--base {base!r}: expected a checkpoint directory")
    base_config = ckpt_lib.load_config(base)
    inherit.check_tokenizer(cfg.data.tokenizer, base, base_config, cfg.train.allow_tokenizer_mismatch, "--base")
    run = cfg.run_config()
    model = draft_model_config(base_config, run.model)
    recorded = ckpt_lib.load_prompt_format(base)
    data = run.data
    if recorded is not None and PromptFormat.of(data) == PromptFormat():  # render as the base was trained
        data = dataclasses.replace(data, **dataclasses.asdict(recorded))
    run = run.replace(model=model, data=data, train=dataclasses.replace(run.train, objective="ar", init_from=""))
    settings = _settings(base, model, cfg.draft)
    frozen = objective = None
    if cfg.draft.loss == "tv":
        verify = run.train.verify_checkpoints
        frozen = lambda mesh: ckpt_lib.load(base, mesh=mesh, verify=verify)[0]  # straight onto the run's mesh
        objective = distill_objective(model, base_config, cfg.draft)
    else:
        objective = ar_objective(model)
    sums = file_fingerprint(os.path.join(base, ckpt_lib.CHECKSUMS_FILE))
    identity = {"draft_model": {**json.loads(json.dumps(settings)), "base": sums or os.path.realpath(base)}}
    summary = train(run, workdir, force=force, objective=objective, frozen_params=frozen, hooks=hooks,
                    identity_extra=identity)
    atomic_write_json(os.path.join(workdir, SETTINGS_FILE), settings)
    return summary
