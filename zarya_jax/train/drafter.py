"""Uno's drafter run (docs/algorithms.md §7): train a gated-LoRA adapter on a frozen checkpoint with the shared loop.

`DrafterRunConfig` is the entry point's config tree: the trainer's sections (the model comes from the
base checkpoint) plus `lora` (rank, alpha and the noise convention the adapter is trained and sampled
with) and `drafter` (block curriculum, loss weights, `objective` tv | dcd) and `dcd` (consistency distillation:
teacher passes, refresh period, divergence, weight of the drafter loss, start; `objectives.dcd`). `train_drafter` loads and freezes the base
(read by the loop straight onto the run's mesh, `checkpoint.load(mesh=)`: no device holds it whole),
trains only the adapter (sharded, checkpointed, resumable like any run) and saves it to
WORKDIR/adapter/ (`lora.save`); WORKDIR/drafter.json records the settings. The settings and the
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
from typing import Any, Sequence

import jax

from .. import overrides as ov
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

# Uno trains the adapter without weight decay; the trained params are an adapter, not a model. The CE
# term is on: the TV gradient vanishes on the confident wrong drafts a fresh adapter makes on a plain
# AR base (docs/uno.md, the diagnostics).
DEFAULTS = {"optim.weight_decay": 0.0, "train.export_final": False, "drafter.ce_weight": 1.0}


@dataclasses.dataclass(frozen=True)
class DrafterRunConfig(rc.RunConfig):
    """The run sections plus the adapter (`lora`), the drafter objective (`drafter`) and, for
    `drafter.objective=dcd`, consistency distillation (`dcd`)."""

    lora: LoraConfig = LoraConfig()
    drafter: DrafterConfig = DrafterConfig()
    dcd: DcdConfig = DcdConfig()


def load_config(name_or_path: str, overrides: list[str] | dict[str, Any] = ()) -> DrafterRunConfig:
    """A preset or YAML/JSON file (its model section is replaced by the base checkpoint's) with the
    drafter defaults, then the dotted overrides."""
    return rc.load(name_or_path, {**DEFAULTS, **ov.parse_all(overrides)}, cls=DrafterRunConfig)


def _settings(base: str, cfg: DrafterRunConfig) -> dict:
    """What WORKDIR/drafter.json records."""
    d = cfg.drafter
    out = {"base": os.path.abspath(base), "lora": {"rank": cfg.lora.rank, "alpha": cfg.lora.alpha},
           "drafter": {"block_sizes": list(d.block_sizes), "block_borders": d.block_borders, "noise": cfg.lora.noise,
                       "tv_weight": d.tv_weight, "ce_weight": d.ce_weight, "kl_weight": d.kl_weight}}
    # recorded only when not the default, so runs from before these knobs keep their identity (and resume)
    if cfg.lora.layers != "all":
        out["lora"]["layers"] = cfg.lora.layers_text()
    if d.objective == "dcd":
        out["drafter"]["objective"] = "dcd"
        out["dcd"] = dataclasses.asdict(cfg.dcd)
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
    if cfg.lora.noise == "mask" and base_config.mask_token_id is None:
        raise ConfigError(missing_mask_token("lora.noise=mask needs", f"--base {base}",
                                             otherwise="train the adapter with lora.noise=uniform"))
    run = cfg.run_config()
    run = run.replace(model=base_config.with_runtime_of(run.model))
    recorded = ckpt_lib.load_prompt_format(base)
    if recorded is not None and PromptFormat.of(run.data) == PromptFormat():  # render as the base was trained
        run = run.replace(data=dataclasses.replace(run.data, **dataclasses.asdict(recorded)))
    settings = _settings(base, cfg)
    verify = run.train.verify_checkpoints
    model_config, lora = run.model, cfg.lora
    lora_lib.check_lora(jax.eval_shape(lambda: lora_lib.init_lora(model_config, lora, jax.random.PRNGKey(0))),
                        model_config, lora)  # a layer selection the base lacks: refused before training
    if cfg.drafter.objective == "dcd":
        objective = dcd_objective(model_config, lora, cfg.drafter, cfg.dcd, run.train.steps)
    else:
        objective = drafter_objective(model_config, lora, cfg.drafter)
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
