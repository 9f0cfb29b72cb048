"""Loading a checkpoint for inference: one function every command, the experiment pipeline and the
lm-eval adapter share (`load_for_inference`), so each reads a checkpoint the same way.

It reads nothing of the trainer: only the checkpoint (`nn.checkpoint`), its tokenizer
(`data.tokenizer`), a LoRA adapter (`nn.lora`) and a draft model (another checkpoint).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping

from . import overrides as ov
from .config import ConfigError, LoraConfig, ModelConfig, PromptFormat
from .data.tokenizer import load_tokenizer
from .nn import checkpoint as ckpt_lib
from .nn import lora as lora_lib
from .sampling.spec_model import check_compatible


@dataclasses.dataclass(frozen=True)
class Inference:
    """A checkpoint ready to decode: `params` and `config` (`checkpoint.load`), the `tokenizer` and where
    it came from (`tokenizer_spec`: 'byte' or a directory, what `data.tokenizer` takes), the
    `prompt_format` its training recorded (with any overrides), an optional LoRA drafter (`adapter`
    with its `lora` config, checked against the model) and an optional draft model (`draft_params`
    with its `draft_config`, reading the model's ids) for `drafter="model"`."""

    ckpt: str
    params: Any
    config: ModelConfig
    tokenizer: Any
    tokenizer_spec: str
    prompt_format: PromptFormat
    adapter: Any = None
    lora: LoraConfig | None = None
    draft_params: Any = None
    draft_config: ModelConfig | None = None

    @property
    def lora_kwargs(self) -> dict:
        """`generate(...)`'s keyword arguments for the drafter (empty without one)."""
        return {} if self.adapter is None else {"lora_params": self.adapter, "lora": self.lora}

    @property
    def draft_kwargs(self) -> dict:
        """`generate(...)`'s keyword arguments for the draft model (empty without one)."""
        return {} if self.draft_params is None else {"draft_params": self.draft_params,
                                                     "draft_config": self.draft_config}

    def with_draft_model(self, ckpt: str, verify: bool = True, mesh=None) -> "Inference":
        """This model with the draft model of checkpoint `ckpt` (checked against it: `spec_model.check_compatible`),
        loaded onto `mesh` when one is given (as `load_for_inference`)."""
        if not isinstance(ckpt, (str, os.PathLike)) or not os.path.isdir(ckpt):
            raise FileNotFoundError(f"draft model checkpoint {ckpt!r} does not exist or is not a directory")
        params, config = ckpt_lib.load(os.fspath(ckpt), mesh=mesh, verify=verify)
        try:
            check_compatible(self.config, config)
        except ValueError as e:
            raise ConfigError(f"draft model {ckpt}: {e}") from None
        return dataclasses.replace(self, draft_params=params, draft_config=config)


def tokenizer_spec(ckpt: str, tokenizer: str | None = None, default: str = "byte") -> str:
    """Which tokenizer to read for `ckpt`: an explicit `tokenizer` wins over the checkpoint's recorded one
    (CKPT/tokenizer/), which wins over `default`."""
    return tokenizer or ckpt_lib.tokenizer_dir(ckpt) or default


def prompt_format(ckpt: str | None, overrides: Iterable[str] | Mapping[str, Any] = (),
                  default: PromptFormat = PromptFormat()) -> PromptFormat:
    """How to render records for `ckpt`: the format its training recorded (else `default`), with dotted
    `FIELD=VALUE` overrides (`--format` items or a mapping, typed by `zarya_jax.overrides`)."""
    recorded = ckpt_lib.load_prompt_format(ckpt) if ckpt else None
    return ov.apply(recorded or default, overrides, "--format")


def load_for_inference(ckpt: str, *, tokenizer: str | None = None, adapter: str | None = None,
                       draft: str | None = None, verify: bool = True,
                       format_overrides: Iterable[str] | Mapping[str, Any] = (),
                       default_format: PromptFormat = PromptFormat(),
                       default_tokenizer: str = "byte", mesh=None) -> Inference:
    """Loads `ckpt` (a `zarya_jax.checkpoint` directory) for decoding.

    Tokenizer precedence: an explicit `tokenizer` ('byte' or a directory) wins over the checkpoint's
    recorded one (CKPT/tokenizer/), which wins over `default_tokenizer` ('byte' unless the caller knows
    what the checkpoint was trained with). Prompt format: the checkpoint's recorded one (else
    `default_format`) with `format_overrides` on top. `adapter`: a LoRA drafter directory
    (`lora.save`), loaded and checked against the model. `draft`: a draft model checkpoint
    (`Inference.with_draft_model`). verify: check the checkpoints and the adapter against their checksums.
    mesh: a `jax.sharding.Mesh` to read every param (model, adapter, draft model) straight into its shards
    (`checkpoint.load(mesh=)`: the trainer's sharding rules); None: one local device. Errors (a missing
    or damaged checkpoint, an unreadable tokenizer, a mismatched adapter) are ValueErrors naming the path."""
    if not isinstance(ckpt, (str, os.PathLike)) or not os.path.isdir(ckpt):
        raise FileNotFoundError(f"checkpoint {ckpt!r} does not exist or is not a directory")
    ckpt = os.fspath(ckpt)
    fmt = prompt_format(ckpt, format_overrides, default_format)
    params, config = ckpt_lib.load(ckpt, mesh=mesh, verify=verify)
    spec = tokenizer_spec(ckpt, tokenizer, default_tokenizer)
    tok = load_tokenizer(spec)
    lora_params = lora = None
    if adapter:
        lora_params, lora = lora_lib.load(adapter, verify=verify, mesh=mesh)
        lora_lib.check_lora(lora_params, config, lora)
    model = Inference(ckpt=os.path.abspath(ckpt), params=params, config=config, tokenizer=tok, tokenizer_spec=spec,
                      prompt_format=fmt, adapter=lora_params, lora=lora)
    return model.with_draft_model(draft, verify=verify, mesh=mesh) if draft else model
