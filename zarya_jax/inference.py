"""The Python front door: a checkpoint loaded for inference (`load_for_inference`, the one loader every
command, the experiment pipeline and the lm-eval adapter share, so each reads a checkpoint the same
way) and a `Sampler` that decodes text in any mode, in the manner of gemma's `gm.text.Sampler`:

    from zarya_jax import Sampler, load_for_inference
    from zarya_jax.sampling import GenerationConfig

    sampler = Sampler(load_for_inference("runs/quickstart/train/final"), GenerationConfig(mode="slotted"))
    sampler.sample(["What is 12+7?"]).texts

It reads nothing of the trainer: only the checkpoint (`checkpoint`), its tokenizer
(`data.tokenizer`), the prompt format its training recorded (`data.render`), a LoRA adapter (`lora`)
and a draft model (another checkpoint); `sampling.generate` decodes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np

from . import overrides as ov
from .config import ConfigError, LoraConfig, ModelConfig, PromptFormat
from .data.render import render_prompt
from .data.tokenizer import load_tokenizer
from . import checkpoint as ckpt_lib
from . import lora as lora_lib
from .sampling import GenerationConfig, GenerationOutput, generate
from .sampling.spec_model import check_compatible


@dataclasses.dataclass(frozen=True)
class Inference:
    """A checkpoint ready to decode: `params` and `config` (`checkpoint.load`), the `tokenizer` and where
    it came from (`tokenizer_spec`: 'byte' or a directory, what `data.tokenizer` takes), the
    `prompt_format` its training recorded (with any overrides), an optional LoRA drafter (`adapter`
    with its `lora` config, checked against the model) and an optional draft model (`draft_params`
    with its `draft_config`, reading the model's ids) for mode "spec-model"."""

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

    def with_adapter(self, adapter: str, verify: bool = True, mesh=None) -> "Inference":
        """This model with the LoRA drafter adapter saved in directory `adapter` (`lora.save`), checked
        against the model, loaded onto `mesh` when one is given (as `load_for_inference`)."""
        lora_params, lora = lora_lib.load(adapter, verify=verify, mesh=mesh)
        lora_lib.check_lora(lora_params, self.config, lora)
        return dataclasses.replace(self, adapter=lora_params, lora=lora)

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
    model = Inference(ckpt=os.path.abspath(ckpt), params=params, config=config, tokenizer=tok, tokenizer_spec=spec,
                      prompt_format=fmt)
    model = model.with_adapter(adapter, verify=verify, mesh=mesh) if adapter else model
    return model.with_draft_model(draft, verify=verify, mesh=mesh) if draft else model


# ------------------------------------------------------------------ the front door
@dataclasses.dataclass(frozen=True)
class SampleOutput:
    """What `Sampler.sample` returns, one entry per prompt, in order.

    texts: the continuations (the prompt excluded), decoded from `tokens`.
    tokens: their token ids, the first EOS included (`GenerationOutput.lengths`).
    logprobs: float32 arrays, log p of each of those tokens under the AR model (`GenerationOutput.logprobs`),
      for the modes that have them ("ar" and "spec-*"); None for "mdm" and "slotted".
    prompt_tokens: the ids the model read: each prompt rendered in the checkpoint's prompt format.
    stats: `generate`'s batch statistics ("mode", "mean_tokens_per_forward", the mode's own).
    output: the `GenerationOutput` itself (per-row forward passes and tokens per forward).
    """

    texts: list[str]
    tokens: list[list[int]]
    logprobs: list[np.ndarray] | None
    prompt_tokens: list[list[int]]
    stats: dict
    output: GenerationOutput


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Decodes prompt texts with `model` (an `Inference`, from `load_for_inference`) in the decoding mode
    and with the knobs of `config` (a `GenerationConfig`, e.g. `GenerationConfig(mode="spec-lora",
    max_new_tokens=32)`): each prompt rendered as the checkpoint's training prompts were (its recorded
    prompt format: chat template, system message, template) and tokenized with its tokenizer, all of
    them decoded in one `sampling.generate` call (one batch), the adapter or the draft model the
    `Inference` holds passed to the modes that draft with them ("spec-lora" and "spec-lora-fused": an
    adapter, `load_for_inference(ckpt, adapter=DIR)`; "spec-model": a draft model,
    `load_for_inference(ckpt, draft=CKPT)`). Construction checks the config against the model and
    that the drafter the mode needs is there (ValueError naming what is missing)."""

    model: Inference
    config: GenerationConfig = GenerationConfig()

    def __post_init__(self):
        if not isinstance(self.model, Inference):
            raise ConfigError(f"Sampler: model is a {type(self.model).__name__}: expected an Inference "
                              "(zarya_jax.load_for_inference(ckpt))")
        if not isinstance(self.config, GenerationConfig):
            raise ConfigError(f"Sampler: config is a {type(self.config).__name__}: expected a "
                              "zarya_jax.sampling.GenerationConfig")
        self.config.validate(self.model.config)
        name, drafter = self.config.mode.name, self.drafter
        if drafter == "lora" and self.model.adapter is None:
            raise ConfigError(f"mode {name!r} drafts with a LoRA adapter, and {self.model.ckpt} was loaded "
                              "without one: load_for_inference(ckpt, adapter=DIR)")
        if drafter == "model" and self.model.draft_params is None:
            raise ConfigError(f"mode {name!r} drafts with a draft model, and {self.model.ckpt} was loaded "
                              "without one: load_for_inference(ckpt, draft=CKPT)")

    @property
    def drafter(self) -> str | None:
        """What the mode drafts with: "self", "lora" (the `Inference`'s adapter), "model" (its draft model),
        or None (modes that do not draft)."""
        return getattr(self.config.mode, "drafter", None)

    def encode(self, texts: str | Sequence[str]) -> list[list[int]]:
        """The token ids the model reads for each prompt text (rendered in the checkpoint's prompt format)."""
        tokenizer, fmt = self.model.tokenizer, self.model.prompt_format
        return [tokenizer.encode(render_prompt(text, tokenizer, fmt)) for text in prompt_texts(texts)]

    def sample(self, texts: str | Sequence[str], *, seed: int = 0) -> SampleOutput:
        """Continues each of `texts` (a list of prompt strings, or one string) → `SampleOutput`. `seed` seeds
        the sampling (`jax.random.PRNGKey(seed)`; greedy decoding, temperature 0, does not read it)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 32:
            raise ValueError(f"seed={seed!r}: expected an integer in [0, 2^32)")
        prompts = self.encode(texts)
        weights = {"lora": self.model.lora_kwargs, "model": self.model.draft_kwargs}.get(self.drafter, {})
        out = generate(self.model.params, self.model.config, prompts, self.config, jax.random.PRNGKey(seed),
                       **weights)
        lengths = [int(n) for n in out.lengths]
        tokens = [out.tokens[r, :n].tolist() for r, n in enumerate(lengths)]
        logprobs = None if out.logprobs is None else [out.logprobs[r, :n] for r, n in enumerate(lengths)]
        return SampleOutput(texts=[self.model.tokenizer.decode(t) for t in tokens], tokens=tokens,
                            logprobs=logprobs, prompt_tokens=prompts, stats=out.stats, output=out)


def prompt_texts(texts: str | Sequence[str]) -> list[str]:
    """`texts` as a non-empty list of non-empty strings (one string: a list of it); ValueError otherwise."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)):
        raise ValueError(f"texts: expected a list of prompt strings (or one string), got a {type(texts).__name__}")
    if not texts:
        raise ValueError("texts: expected at least one prompt, got an empty list")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{i}]={text!r}: expected a prompt string, got a {type(text).__name__}")
        if not text:
            raise ValueError(f"texts[{i}] is empty: expected a non-empty prompt string")
    return list(texts)
