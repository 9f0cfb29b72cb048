"""Uno's drafter run (docs/algorithms.md §7): train a gated-LoRA adapter on a frozen checkpoint with the shared loop.

`DrafterRun` is the run's own section, the experiment's `drafter` section too: its `steps`, `batch_size` and
optimizer (`optim`), the adapter (`lora`: rank, alpha, the layers it is on and the noise convention it is
trained and sampled with), the objective (`objective`: block curriculum, loss weights, `objective.objective`
tv | dcd) and consistency distillation (`dcd`: teacher passes, refresh period, divergence, weight of the
drafter loss, start; `objectives.dcd`). `DrafterRunConfig` (the command line's) is the trainer's `model`
(runtime fields), `data`, `mesh` and `train` sections plus `drafter` (`train.config.SideRunConfig`), so
its keys are the experiment's: `drafter.lora.rank`, `drafter.optim.lr`, `drafter.steps`. `train_drafter`
loads and freezes the base (read by the loop straight onto the run's mesh, `checkpoint.load(mesh=)`: no
device holds it whole), trains only the adapter (sharded, checkpointed, resumable like any run) and saves
it to WORKDIR/adapter/ (`lora.save`); WORKDIR/drafter.json records the settings. The settings and the
content of the base checkpoint (its checksums, not its path) are part of the run's identity
(`train.identity`), so a rerun with other drafter settings or another base is refused unless forced.
The data are rendered with the base checkpoint's recorded prompt format (`data.render`) unless the run
sets prompt-format fields of its own (`data.prompt_key`, …), and read with a tokenizer that must be the
base's (`train.inherit.check_tokenizer`; the command line defaults `data.tokenizer` to it).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar, Sequence

import jax

from ..config import ConfigError, LoraConfig, PromptFormat, missing_mask_token
from ..files import atomic_write_json
from .. import checkpoint as ckpt_lib
from .. import lora as lora_lib
from ..objectives.dcd import DcdConfig, dcd_objective
from ..objectives.drafter import DrafterConfig, drafter_objective
from . import config as rc
from . import inherit
from .hooks import Hook
from .identity import file_fingerprint
from .loop import train
from .optim import OptimConfig

# Uno trains the adapter without weight decay, on a short cosine schedule of its own (not the base model's
# optimizer); the trained params are an adapter, not a model.
DRAFTER_OPTIM = OptimConfig(lr=2e-3, warmup_steps=20, schedule="cosine", weight_decay=0.0)


@dataclasses.dataclass(frozen=True)
class DrafterRun:
    """Uno's LoRA drafter on a frozen checkpoint: its run (`steps`, `batch_size`), its optimizer (`optim`,
    `OptimConfig`: AdamW at lr 2e-3, 20 warmup steps, cosine, no weight decay), its adapter (`lora`,
    `LoraConfig`: Uno's rank 128, alpha 2048 by default), its objective (`objective`, `DrafterConfig`: the
    block curriculum `block_sizes` / `block_borders`, the loss weights `tv_weight`, `ce_weight`, `kl_weight`,
    and `objective.objective`: tv | dcd) and consistency distillation (`dcd`, `DcdConfig`). The CE term is on
    by default: the TV gradient vanishes on the confident wrong drafts a fresh adapter makes on a plain AR
    base (docs/uno.md, the diagnostics)."""

    steps: int = 400
    batch_size: int = 8
    lora: LoraConfig = LoraConfig()
    objective: DrafterConfig = DrafterConfig(ce_weight=1.0)
    dcd: DcdConfig = DcdConfig()
    optim: OptimConfig = DRAFTER_OPTIM

    def __post_init__(self):
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"drafter.{name}={getattr(self, name)}: expected ≥ 1")


# The keys of the former flat drafter section (`drafter.rank`, `drafter.tv_weight`, …), the experiment's and
# the command line's alike, and where each lives now.
MOVED_KEYS = {
    **{f"drafter.{f.name}": f"drafter.lora.{f.name}" for f in dataclasses.fields(LoraConfig)},
    **{f"drafter.{f.name}": f"drafter.objective.{f.name}" for f in dataclasses.fields(DrafterConfig)},
    "drafter.lr": "drafter.optim.lr", "drafter.warmup_steps": "drafter.optim.warmup_steps"}


@dataclasses.dataclass(frozen=True)
class DrafterRunConfig(rc.SideRunConfig):
    """`python -m experiments.train_drafter`'s config: the trainer's `model` (runtime fields; the structure is
    the base checkpoint's), `data`, `mesh`, `train`, and the `drafter` section."""

    drafter: DrafterRun = DrafterRun()

    SECTION: ClassVar[str] = "drafter"
    # the command line's former sections (`lora.*`, `dcd.*`) and the trainer keys the section holds
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        **MOVED_KEYS, **rc.SideRunConfig.moved("drafter"),
        **{f"lora.{f.name}": f"drafter.lora.{f.name}" for f in dataclasses.fields(LoraConfig)},
        **{f"dcd.{f.name}": f"drafter.dcd.{f.name}" for f in dataclasses.fields(DcdConfig)}}


# the adapter is saved by `train_drafter` (WORKDIR/adapter), not exported as a model
DEFAULTS = {"train.export_final": False}


def load_config(name_or_path: str, overrides: list[str] | dict[str, Any] = ()) -> DrafterRunConfig:
    """A preset or YAML/JSON file (its data, mesh and train sections and the model's runtime fields) with
    the drafter defaults, then the dotted overrides (`SideRunConfig.load`)."""
    return DrafterRunConfig.load(name_or_path, overrides, DEFAULTS)


def _settings(base: str, cfg: DrafterRunConfig) -> dict:
    """What WORKDIR/drafter.json records."""
    d, lora = cfg.drafter.objective, cfg.drafter.lora
    out = {"base": os.path.abspath(base), "lora": {"rank": lora.rank, "alpha": lora.alpha},
           "drafter": {"block_sizes": list(d.block_sizes), "block_borders": d.block_borders, "noise": lora.noise,
                       "tv_weight": d.tv_weight, "ce_weight": d.ce_weight, "kl_weight": d.kl_weight}}
    # recorded only when not the default, so runs from before these knobs keep their identity (and resume)
    if lora.layers != "all":
        out["lora"]["layers"] = lora.layers_text()
    if d.objective == "dcd":
        out["drafter"]["objective"] = "dcd"
        out["dcd"] = dataclasses.asdict(cfg.drafter.dcd)
    return out


def _identity(base: str, settings: dict) -> dict:
    """The settings with the base checkpoint named by content (its checksums), so a moved base resumes."""
    sums = file_fingerprint(os.path.join(base, ckpt_lib.CHECKSUMS_FILE))
    return {"drafter": {**settings, "base": sums or os.path.realpath(base)}}


def train_drafter(cfg: DrafterRunConfig, base: str, workdir: str, *, force: bool = False,
                  hooks: Sequence[Hook] = ()) -> dict:
    """Trains (or resumes) the adapter on the frozen checkpoint `base`; returns the loop's summary plus
    `adapter` (the saved adapter file) when the run completed."""
    if not os.path.isdir(base):
        raise FileNotFoundError(f"--base {base!r}: expected a checkpoint directory")
    base_config = ckpt_lib.load_config(base)
    inherit.check_tokenizer(cfg.data.tokenizer, base, base_config, cfg.train.allow_tokenizer_mismatch, "--base")
    lora = cfg.drafter.lora
    if lora.noise == "mask" and base_config.mask_token_id is None:
        raise ConfigError(missing_mask_token("drafter.lora.noise=mask needs", f"--base {base}",
                                             otherwise="train the adapter with drafter.lora.noise=uniform"))
    run = cfg.run_config(base_config)
    recorded = ckpt_lib.load_prompt_format(base)
    if recorded is not None and PromptFormat.of(run.data) == PromptFormat():  # render as the base was trained
        run = run.replace(data=dataclasses.replace(run.data, **dataclasses.asdict(recorded)))
    settings = _settings(base, cfg)
    verify = run.train.verify_checkpoints
    model_config = run.model
    lora_lib.check_lora(jax.eval_shape(lambda: lora_lib.init_lora(model_config, lora, jax.random.PRNGKey(0))),
                        model_config, lora)  # a layer selection the base lacks: refused before training
    if cfg.drafter.objective.objective == "dcd":
        objective = dcd_objective(model_config, lora, cfg.drafter.objective, cfg.drafter.dcd, run.train.steps)
    else:
        objective = drafter_objective(model_config, lora, cfg.drafter.objective)
    summary = train(run, workdir, force=force, objective=objective,
                    init_params=lambda key: lora_lib.init_lora(model_config, lora, key),
                    frozen_params=lambda mesh: ckpt_lib.load(base, mesh=mesh, verify=verify)[0], hooks=hooks,
                    return_state=True,
                    identity_extra=_identity(base, json.loads(json.dumps(settings))))
    atomic_write_json(os.path.join(workdir, "drafter.json"), settings)
    state = summary.pop("state")
    if summary["status"] == "completed":
        summary["adapter"] = str(lora_lib.save(os.path.join(workdir, "adapter"), state["params"], lora))
    return summary
