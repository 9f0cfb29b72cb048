"""`GenerationConfig` (the decoding mode and the shared sampling knobs, docs/algorithms.md §4–§7) and
`GenerationOutput`.

The config is a frozen, hashable dataclass: it is a jit static argument, so one compile serves every
call with the same (batch, prompt bucket, config) — the mode's traced knobs aside (`sampling.mode`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..config import missing_mask_token
from .mode import Mode, named

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
LAYER_LOOPS = ("auto", "split", "scan")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Knobs of `zarya_jax.sampling.generate`: the decoding mode with its own knobs, and the sampling
    knobs every mode shares.

    mode: a `Mode` (e.g. `slotted.Slotted(slot_size=4)`) or a mode's name (`modes.MODES`: "ar", "mdm",
      "slotted", "spec-self", "spec-lora", "spec-model", "spec-self-fused", "spec-lora-fused"), which
      becomes that mode with its default knobs. Each mode's knobs are documented in its file. Default
      "ar" (plain AR: it needs no mask token and no adapter, so it decodes any checkpoint).
    max_new_tokens: the budget G of generated tokens per row.
    temperature (0 = greedy), top_k (0 = off), top_p (1.0 = off), repetition_penalty (1.0 = off): docs/algorithms.md §4.
    eos_token_id: None → the model config's; stop_at_eos: a row stops after its first EOS.
    prompt_bucket: padded prompt length is rounded up to a multiple of it (bounds the compiles).
    kv_cache_dtype: K/V storage of the cache, "auto" (the model's compute dtype) or one of
      `KV_CACHE_DTYPES` ("bfloat16" halves an fp32 model's cache; attention still computes in the model's dtype).
    layer_loop: how a pass runs the layers. "split": the program splits the params' layer stack into one
      tree per layer once, before its decode loop (`model.split_layers`), and every pass reads each layer's
      weights where they lie, at the cost of a second copy of the weights for the call; "scan": a scan over
      the stack, which copies each layer's weights out of it on every pass but holds one layer at a time
      (on a pod with FSDP-sharded weights, one layer gathered at a time); "auto": "split" on a CPU, "scan"
      elsewhere (`LAYER_LOOPS`, docs/decoding.md#compilation-and-the-cache).
    """

    mode: Mode | str = "ar"
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos_token_id: int | None = None
    stop_at_eos: bool = True
    prompt_bucket: int = 16
    kv_cache_dtype: str = "auto"
    layer_loop: str = "auto"

    def __post_init__(self):
        if isinstance(self.mode, str):
            object.__setattr__(self, "mode", named(self.mode))
        elif not isinstance(self.mode, Mode):
            raise ValueError(f"GenerationConfig.mode={self.mode!r}: expected a Mode or a mode's name")

    @property
    def needs_mask_token(self) -> bool:
        """Whether decoding reads the mask token (the mode's `needs_mask_token`)."""
        return self.mode.needs_mask_token

    def replace(self, **changes) -> "GenerationConfig":
        return dataclasses.replace(self, **changes)

    def with_knobs(self, **fields) -> "GenerationConfig":
        """This config with shared fields and/or the mode's fields replaced (a field that is neither:
        ValueError naming both sets)."""
        shared = [f.name for f in dataclasses.fields(self) if f.name != "mode"]
        own = [f.name for f in dataclasses.fields(self.mode)]
        unknown = [k for k in fields if k not in shared and k not in own]
        if unknown:
            raise ValueError(f"knob(s) {unknown}: not a field of mode {self.mode.name!r} ({own}) nor a shared "
                             f"GenerationConfig field ({shared})")
        mode = dataclasses.replace(self.mode, **{k: v for k, v in fields.items() if k in own})
        return dataclasses.replace(self, mode=mode, **{k: v for k, v in fields.items() if k in shared})

    def as_dict(self) -> dict[str, Any]:
        """A flat record: {"mode": name, the mode's fields, the shared fields} (`from_dict` inverts it)."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "mode"}
        return {"mode": self.mode.name, **dataclasses.asdict(self.mode), **shared}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "GenerationConfig":
        """The config of an `as_dict` record."""
        record = dict(record)
        return cls(mode=record.pop("mode")).with_knobs(**record)

    def validate(self, model_config=None, prompts=None) -> None:
        """Raises ValueError naming the bad value and what was expected (called before compiling): the
        shared fields, then the mode's own (`Mode.check`)."""
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _int_at_least("top_k", self.top_k, 0)
        _int_at_least("prompt_bucket", self.prompt_bucket, 1)
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"GenerationConfig.temperature={self.temperature!r}: expected a finite value ≥ 0")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"GenerationConfig.top_p={self.top_p!r}: expected a value in (0, 1]")
        if not (isinstance(self.repetition_penalty, (int, float)) and math.isfinite(self.repetition_penalty)
                and self.repetition_penalty > 0):
            raise ValueError(
                f"GenerationConfig.repetition_penalty={self.repetition_penalty!r}: expected a finite value > 0")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(f"GenerationConfig.layer_loop={self.layer_loop!r}: expected one of {LAYER_LOOPS}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"GenerationConfig.kv_cache_dtype={self.kv_cache_dtype!r}: expected one of {KV_CACHE_DTYPES}")
        self.mode.check(self)
        if model_config is not None:
            self._validate_model(model_config)
        if prompts is not None:
            self._validate_prompts(model_config, prompts)

    def _validate_model(self, mc) -> None:
        if self.needs_mask_token and mc.mask_token_id is None:
            raise ValueError(missing_mask_token(f"mode {self.mode.name!r} needs", otherwise=(
                "decode with mode ar, or spec-lora with a uniform-noise LoRA drafter (neither reads one)")))
        eos = self.eos_token_id
        if eos is not None and not 0 <= eos < mc.vocab_size:
            raise ValueError(f"GenerationConfig.eos_token_id={eos}: outside the vocabulary [0, {mc.vocab_size})")
        if self.top_k > mc.vocab_size:
            raise ValueError(f"GenerationConfig.top_k={self.top_k}: larger than the vocabulary ({mc.vocab_size})")

    def _validate_prompts(self, mc, prompts) -> None:
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise ValueError(f"prompts: expected a non-empty list of token-id lists, got {type(prompts).__name__} "
                             f"of length {len(prompts) if hasattr(prompts, '__len__') else '?'}")
        for i, p in enumerate(prompts):
            if isinstance(p, str) or not hasattr(p, "__len__"):
                raise ValueError(f"prompts[{i}]: expected a list of token ids, got {type(p).__name__}")
            if len(p) == 0:
                raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
            arr = np.asarray(p)
            if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(f"prompts[{i}]: expected a flat list of integer token ids")
            if mc is not None and (arr.min() < 0 or arr.max() >= mc.vocab_size):
                raise ValueError(f"prompts[{i}] has token id {int(arr.min() if arr.min() < 0 else arr.max())} "
                                 f"outside the vocabulary [0, {mc.vocab_size})")
            if mc is not None:
                look = self.mode.lookahead()
                need = len(p) + self.max_new_tokens + look
                if need > mc.max_position_embeddings:
                    # Every term named with the knob behind it: the mode's rows are not the prompt's or the budget's.
                    terms = f"{len(p)} prompt + {self.max_new_tokens} new (max_new_tokens={self.max_new_tokens})"
                    if look:
                        terms += f" + {look} look-ahead rows of {self.mode.lookahead_source()}"
                    raise ValueError(f"prompts[{i}] needs {need} positions ({terms}) but the model has "
                                     f"max_position_embeddings={mc.max_position_embeddings}")


def _int_at_least(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"GenerationConfig.{name}={value!r}: expected an integer ≥ {low}")


@dataclasses.dataclass
class GenerationOutput:
    """Result of `generate`.

    tokens: np.int32 [B, max_new_tokens], generated tokens in logical order; after `lengths[b]` the
      row holds the pad id (model pad, else EOS, else 0).
    lengths: np.int32 [B], generated tokens per row, the first EOS included.
    num_forward_passes: np.int32 [B], model passes that row took part in (prefill counts as one pass).
    tokens_per_forward: np.float32 [B], lengths / num_forward_passes.
    stats: dict with "mode" (its name), "loop_passes" (passes of the batched program), "mean_tokens_per_forward",
      per-mode extras and, with `debug=True`, "trace".
    logprobs: np.float32 [B, max_new_tokens] for modes "ar" and "spec-*", else None: log p(token) of each
      generated token under the AR model at the sampling temperature (1 when greedy), the mask token
      banned, before top-k / top-p / repetition penalty — what a teacher-forced forward over prompt +
      output gives (`primitives.token_logprob`); 0 after `lengths[b]`. Modes "mdm" and "slotted" sample
      from MDM rows and accept by thresholds, so their tokens have no AR-policy probability to report.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    num_forward_passes: np.ndarray
    tokens_per_forward: np.ndarray
    stats: dict = dataclasses.field(default_factory=dict)
    logprobs: np.ndarray | None = None
