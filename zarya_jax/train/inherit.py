"""What a run takes from the checkpoint it starts from: its tokenizer, and a base run's data shapes.

A checkpoint carries its tokenizer (CKPT/tokenizer/: `conversion.hf_to_jax` stores the Hugging Face one,
with `<mdm_mask>` when it added it; a training run's final/ stores the run's). A run that starts from a
checkpoint (`train --init-from CKPT` and `train()` with `train.init_from`, a drafter or draft model on
`--base CKPT`, GRPO on `--base CKPT`) reads that tokenizer unless another is named (`tokenizer_for`,
`init_tokenizer`), and is refused when the tokenizer it would read is not the checkpoint's
(`check_tokenizer`): training a Qwen3 checkpoint on byte ids runs without an error and learns nothing
useful, so it needs `train.allow_tokenizer_mismatch=true`.

A drafter or draft model also takes the global batch, length and accumulation of the run that trained
its base (`from_base`: RUN/run_config.json beside RUN/final), since the base's size, not a preset's,
decides what fits in memory; the drafter takes that run's precision and remat too.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ..config import ConfigError, ModelConfig
from ..data.tokenizer import load_tokenizer
from .. import checkpoint as ckpt_lib
from . import config as rc
from .identity import CONFIG_FILE

ALLOW = "train.allow_tokenizer_mismatch"
DEFAULT_TOKENIZER = rc.DataConfig().tokenizer
# What a run on a base checkpoint takes from the base run (below `--set`, above the `--config` file).
BASE_RUN_KEYS = ("data.batch_size", "data.max_length", "optim.grad_accum_steps")
BASE_RUNTIME_KEYS = ("model.dtype", "model.remat", "model.remat_policy")
_STRUCTURE = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")


def tokenizer_for(ckpt: str, explicit: str | None) -> tuple[str | None, str | None]:
    """(the tokenizer a run starting from `ckpt` reads, a one-line note saying so): `explicit` (the command
    line's `data.tokenizer`) when given (no note), else the checkpoint's own CKPT/tokenizer/, else
    (None, None): the config's `data.tokenizer` stands."""
    if explicit is not None:
        return str(explicit), None
    own = ckpt_lib.tokenizer_dir(ckpt)
    if own is None:
        return None, None
    return own, f"tokenizer: {own} (the checkpoint's own; --set data.tokenizer=… reads another)"


def init_tokenizer(run: rc.RunConfig, explicit: str | None = None) -> tuple[rc.RunConfig, str | None]:
    """`run` reading the tokenizer of its `train.init_from` checkpoint unless one is named, checked against
    the checkpoint; and the note of `tokenizer_for`. Named: `explicit` (the command line's `--set
    data.tokenizer`, which may name the default too), else `run.data.tokenizer` when it is not the default
    (`byte`, what a preset says when it says nothing). A run without a checkpoint, or whose checkpoint is
    missing (the trainer names it), is returned as it is."""
    init = run.train.init_from
    if not init or not os.path.isdir(init):
        return run, None
    if explicit is None and run.data.tokenizer != DEFAULT_TOKENIZER:
        explicit = run.data.tokenizer
    spec, note = tokenizer_for(init, explicit)
    if spec is not None:
        run = run.replace(data=dataclasses.replace(run.data, tokenizer=spec))
    check_tokenizer(run.data.tokenizer, init, ckpt_lib.load_config(init), run.train.allow_tokenizer_mismatch,
                    "--init-from")
    return run, note


def check_tokenizer(spec: str, ckpt: str, config: ModelConfig, allow: bool, flag: str) -> None:
    """Refuses (`ConfigError`) a tokenizer `spec` that is not the one of checkpoint `ckpt` (given as `flag`):
    one with another number of tokens than CKPT/tokenizer/, or, for a checkpoint without a tokenizer, one
    whose ids cover less than half of the vocabulary's rows (the byte tokenizer's 264 on Qwen3's 151,936).
    `allow` (`train.allow_tokenizer_mismatch`) lets it through."""
    own = ckpt_lib.tokenizer_dir(ckpt)
    if allow or (own is not None and os.path.realpath(spec) == os.path.realpath(own)):
        return
    tok = load_tokenizer(spec)
    if own is not None:
        own_size = load_tokenizer(own).vocab_size
        if tok.vocab_size == own_size:
            return
        theirs, fix = f"its tokenizer {own} has {own_size:,}", f"--set data.tokenizer={own}"
    elif 2 * tok.vocab_size >= config.vocab_size:
        return
    else:
        theirs = f"it has no tokenizer, and {config.vocab_size:,} vocabulary rows"
        fix = "--set data.tokenizer=DIR with the tokenizer it was trained with"
    raise ConfigError(f"data.tokenizer={spec!r} ({tok.vocab_size:,} tokens) is not the tokenizer of {flag} {ckpt} "
                      f"({theirs}): the model would train on ids it does not read. Use the checkpoint's: leave "
                      f"data.tokenizer unset, or {fix}; to train with this one anyway, --set {ALLOW}=true")


def base_run_config(base: str) -> tuple[str, dict] | None:
    """(the run directory, its recorded run config as a dict) of the run whose final/ checkpoint is `base`,
    or None (a converted checkpoint, a copied final/, a run config of another model)."""
    run_dir = os.path.dirname(os.path.abspath(base))
    path = os.path.join(run_dir, CONFIG_FILE)
    if not (os.path.isdir(base) and os.path.isfile(path)):
        return None
    config = ckpt_lib.load_config(base)
    try:
        with open(path) as f:
            raw = json.load(f)
        same = all(raw["model"][f] == getattr(config, f) for f in _STRUCTURE)
    except (OSError, ValueError, KeyError, TypeError):  # not a run config this version can read: not used
        return None
    return (run_dir, raw) if same else None


def from_base(base: str, explicit: dict[str, Any],
              keys: tuple[str, ...] | dict[str, str]) -> tuple[dict[str, Any], str | None]:
    """The overrides a run on base checkpoint `base` takes from it, below the command line's `explicit` ones:
    `data.tokenizer` (the checkpoint's tokenizer) and `keys` from the run that trained it (when `base` is
    RUN/final; a mapping {key of that run's config: this run's key} where they differ, e.g. a drafter's batch
    is `drafter.batch_size`); and a one-line note listing them (None when there are none)."""
    keys = keys if isinstance(keys, dict) else {key: key for key in keys}
    out: dict[str, Any] = {}
    own = ckpt_lib.tokenizer_dir(base)
    if "data.tokenizer" not in explicit and own is not None:
        out["data.tokenizer"] = own
    found = base_run_config(base)
    if found is not None:
        raw = found[1]
        for key, ours in keys.items():
            section, _, name = key.partition(".")
            if ours not in explicit and name in (raw.get(section) or {}):
                out[ours] = raw[section][name]
    if not out:
        return out, None
    source = f"{base} and its run {found[0]}" if found is not None else base
    items = ", ".join(f"{k}={v}" for k, v in out.items())
    return out, f"from {source}: {items} (--set KEY=VALUE overrides)"
