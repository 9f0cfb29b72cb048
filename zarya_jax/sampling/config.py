"""`GenerationConfig` (every sampling knob, docs/algorithms.md §4–§7) and `GenerationOutput`.

The config is a frozen, hashable dataclass: it is a jit static argument, so one compile serves every
call with the same (batch, prompt bucket, config).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..config import missing_mask_token

MODES = ("ar", "mdm", "slotted", "spec")
DRAFTERS = ("lora", "self", "model")
FUSED_DRAFTERS = ("self", "lora")  # a drafter whose draft fits in the verify pass (not a separate model)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
MDM_ORDERS = ("random", "logical", "confidence")
MDM_SEQUENTIAL = ("mask", "ar")
# Which knobs each sampler reads; setting another (e.g. `slot_size` for AR) would be silently ignored,
# so `check_knobs` refuses it. `mode`, `slotted_generation` and `drafter` choose the sampler.
COMMON_KNOBS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "eos_token_id",
                "stop_at_eos", "prompt_bucket", "kv_cache_dtype")
MODE_KNOBS = {"ar": COMMON_KNOBS, "mdm": COMMON_KNOBS + ("steps", "alpha0", "mdm_order", "mdm_sequential"),
              "slotted": COMMON_KNOBS + ("slot_size", "serial_num_blocks", "max_block_size", "slot_threshold",
                                         "token_threshold",
                                         "ar_infill", "ar_first_token"),
              "spec": COMMON_KNOBS + ("draft_length", "fused", "draft_passes", "draft_when_active_below")}
ROUTING_FIELDS = ("mode", "slotted_generation", "drafter", "fused")


def check_knobs(mode: str, fields, prefix: str = "") -> None:
    """Raises ValueError for a field among `fields` that sampler `mode` ("*": every sampler) does not
    read, or a routing field, naming the modes that read it. `prefix` goes before the field name."""
    readable = COMMON_KNOBS if mode == "*" else MODE_KNOBS[mode]
    for field in fields:
        if field in ROUTING_FIELDS:
            raise ValueError(f"knob {prefix}{field}: it chooses the sampler; choose the mode instead")
        if field not in readable:
            owners = [m for m, knobs in MODE_KNOBS.items() if field in knobs]
            what = "every mode" if mode == "*" else f"mode {mode!r}"
            raise ValueError(f"knob {prefix}{field} is not read by {what} (it would be ignored); it is a knob of "
                             f"{owners}. {what[0].upper() + what[1:]} reads {list(readable)}")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Knobs of `zarya_jax.sampling.generate`.

    mode: "ar" | "mdm" (mode A, docs/algorithms.md §5) | "slotted" (mode B, docs/algorithms.md §6) | "spec" (docs/algorithms.md §7); None routes
      by `slotted_generation` as the paper does (True → "slotted", False → "mdm").
    temperature (0 = greedy), top_k (0 = off), top_p (1.0 = off), repetition_penalty (1.0 = off): docs/algorithms.md §4.
    steps, alpha0: mode A's T (0 → ceil(M/4) diffusion steps of ≤ 4 tokens) and diffusion share.
    mdm_order, mdm_sequential: mode A beyond the paper (defaults = the paper): the diffusion tokens in
      "random" | "logical" | "confidence" order; the sequential phase read from the mask's own row
      ("mask", MDM convention) or from the AR row of the token before it ("ar"); see `sampling.mdm`.
    slot_size, serial_num_blocks, slot_threshold, token_threshold: mode B. `slot_threshold` in [0, 1];
      any value > 1 is accepted and means "one slot per plan" (no first-token probability exceeds it,
      so the single most confident slot is always chosen, as in ReFusion's code).
    max_block_size: mode B's largest block (window rows of one pass): more blocks than `serial_num_blocks`
      when ⌊G/NB⌋ exceeds it, so a pass's memory is bounded whatever G (docs/algorithms.md §6.0). The
      block is part of the algorithm (a plan chooses among its slots), so where it binds the output
      differs from the unbounded layout's; where ⌊G/NB⌋ ≤ max_block_size nothing changes.
    ar_infill, ar_first_token: mode B's AR corrections (beyond the paper; off = ReFusion's rule): the token
      forced after an accepted prefix is the AR row's own choice, and a slot that directly follows
      committed text starts with the AR choice for that position (see `sampling.slotted`).
    draft_length, drafter: mode "spec" (F and "lora" | "self" | "model": Uno's gated-LoRA adapter, Zarya
      self-drafting, or a separate draft model passed to `generate` as `draft_params` / `draft_config`,
      classic speculative sampling, docs/algorithms.md §7.6).
    draft_passes: mode "spec" with drafter "lora": draft passes per cycle (docs/algorithms.md §7.7); pass k
      re-drafts the block from pass k−1's drafts, the last pass's q is verified (lossless for any k).
    fused: mode "spec" with drafter "self" or "lora" in one forward pass per cycle (docs/algorithms.md §7.5;
      `draft_length` is its K drafts per cycle).
    draft_when_active_below: mode "spec" (not fused): a cycle drafts only while the still-active rows are
      at most this fraction of the batch, else it is one AR pass (one token, one forward): speculation
      where decoding is memory-bound, in the same compiled loop (traced: no recompile per value). 1.0
      drafts every cycle, 0.0 never drafts (plain AR through the spec loop).
    eos_token_id: None → the model config's; stop_at_eos: a row stops after its first EOS.
    prompt_bucket: padded prompt length is rounded up to a multiple of it (bounds the compiles).
    kv_cache_dtype: K/V storage of the cache, "auto" (the model's compute dtype) or one of
      `KV_CACHE_DTYPES` ("bfloat16" halves an fp32 model's cache; attention still computes in the model's dtype).
    """

    mode: str | None = None
    slotted_generation: bool = False
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    steps: int = 0
    alpha0: float = 0.25
    mdm_order: str = "random"
    mdm_sequential: str = "mask"
    slot_size: int = 8
    serial_num_blocks: int = 2
    max_block_size: int = 256
    slot_threshold: float = 0.9
    token_threshold: float = 0.9
    ar_infill: bool = False
    ar_first_token: bool = False
    draft_length: int = 8
    drafter: str = "lora"
    fused: bool = False
    draft_passes: int = 1
    draft_when_active_below: float = 1.0
    eos_token_id: int | None = None
    prompt_bucket: int = 16
    stop_at_eos: bool = True
    kv_cache_dtype: str = "auto"

    @property
    def resolved_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        return "slotted" if self.slotted_generation else "mdm"

    @property
    def needs_mask_token(self) -> bool:
        """Whether decoding reads the mask token: modes A and B, and the self drafter, which drafts from it
        (modes ar and spec with a uniform-noise LoRA drafter or a draft model do not)."""
        mode = self.resolved_mode
        return mode in ("mdm", "slotted") or (mode == "spec" and self.drafter == "self")

    def replace(self, **changes) -> "GenerationConfig":
        return dataclasses.replace(self, **changes)

    def validate(self, model_config=None, prompts=None) -> None:
        """Raises ValueError naming the bad value and what was expected (called before compiling)."""
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"GenerationConfig.mode={self.mode!r}: expected one of {MODES} or None")
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _int_at_least("top_k", self.top_k, 0)
        _int_at_least("steps", self.steps, 0)
        _int_at_least("slot_size", self.slot_size, 1)
        _int_at_least("serial_num_blocks", self.serial_num_blocks, 1)
        _int_at_least("max_block_size", self.max_block_size, 1)
        _int_at_least("draft_length", self.draft_length, 1)
        _int_at_least("draft_passes", self.draft_passes, 1)
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
        if not (isinstance(self.alpha0, (int, float)) and 0.0 <= self.alpha0 <= 1.0):
            raise ValueError(f"GenerationConfig.alpha0={self.alpha0!r}: expected a value in [0, 1]")
        if not (isinstance(self.slot_threshold, (int, float)) and self.slot_threshold >= 0.0
                and not math.isnan(self.slot_threshold)):
            raise ValueError(f"GenerationConfig.slot_threshold={self.slot_threshold!r}: expected a value in "
                             "[0, 1] (or > 1 for one slot per plan)")
        if not (isinstance(self.token_threshold, (int, float)) and 0.0 <= self.token_threshold <= 1.0):
            raise ValueError(f"GenerationConfig.token_threshold={self.token_threshold!r}: expected a value in [0, 1]")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"GenerationConfig.kv_cache_dtype={self.kv_cache_dtype!r}: expected one of {KV_CACHE_DTYPES}")
        if self.mdm_order not in MDM_ORDERS:
            raise ValueError(f"GenerationConfig.mdm_order={self.mdm_order!r}: expected one of {MDM_ORDERS}")
        if self.mdm_sequential not in MDM_SEQUENTIAL:
            raise ValueError(
                f"GenerationConfig.mdm_sequential={self.mdm_sequential!r}: expected one of {MDM_SEQUENTIAL}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"GenerationConfig.drafter={self.drafter!r}: expected one of {DRAFTERS}")
        if not isinstance(self.fused, bool):
            raise ValueError(f"GenerationConfig.fused={self.fused!r}: expected True or False")
        if self.fused and (self.resolved_mode != "spec" or self.drafter not in FUSED_DRAFTERS):
            raise ValueError(f"GenerationConfig.fused=True is a mode of Ψ-Spec with the self or LoRA drafter; got "
                             f"mode={self.resolved_mode!r}, drafter={self.drafter!r} (expected mode='spec', drafter "
                             f"in {FUSED_DRAFTERS})")
        if self.fused and self.draft_passes > 1:
            raise ValueError(f"GenerationConfig.draft_passes={self.draft_passes}: the fused loop drafts once per cycle, "
                             "inside the verify pass (expected 1 with fused=True)")
        if self.draft_passes > 1 and (self.resolved_mode != "spec" or self.drafter != "lora"):
            raise ValueError(f"GenerationConfig.draft_passes={self.draft_passes} re-drafts with the LoRA drafter; got "
                             f"mode={self.resolved_mode!r}, drafter={self.drafter!r} (expected mode='spec', drafter='lora')")
        if not (isinstance(self.draft_when_active_below, (int, float)) and not isinstance(self.draft_when_active_below, bool)
                and 0.0 <= self.draft_when_active_below <= 1.0):
            raise ValueError(f"GenerationConfig.draft_when_active_below={self.draft_when_active_below!r}: expected a "
                             "fraction of the batch's rows in [0, 1]")
        if self.draft_when_active_below != 1.0 and self.drafter == "model":
            raise ValueError(f"GenerationConfig.draft_when_active_below={self.draft_when_active_below}: the draft-model "
                             "loop drafts every cycle (expected 1.0 with drafter='model')")
        if self.fused and self.draft_when_active_below != 1.0:
            raise ValueError(f"GenerationConfig.draft_when_active_below={self.draft_when_active_below}: the fused "
                             "speculation loop drafts every cycle (expected 1.0 with fused=True)")
        if self.resolved_mode == "slotted" and self.slot_size > self.max_new_tokens:
            raise ValueError(
                f"GenerationConfig.slot_size={self.slot_size} does not fit max_new_tokens={self.max_new_tokens}: "
                "mode B needs at least one whole slot (slot_size ≤ max_new_tokens)")
        if self.resolved_mode == "slotted" and self.slot_size > self.max_block_size:
            raise ValueError(
                f"GenerationConfig.slot_size={self.slot_size} does not fit max_block_size={self.max_block_size}: "
                "a block holds whole slots (raise max_block_size or lower slot_size)")
        if model_config is not None:
            self._validate_model(model_config)
        if prompts is not None:
            self._validate_prompts(model_config, prompts)

    def _validate_model(self, mc) -> None:
        if self.needs_mask_token and mc.mask_token_id is None:
            raise ValueError(missing_mask_token(f"mode {self.resolved_mode!r} needs", otherwise=(
                "decode with mode ar, or spec with a uniform-noise LoRA drafter (neither reads one)")))
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
                # the fused window's last scenario rows reach K positions past the last draft
                reach = (2 if self.fused else 1) * self.draft_length
                need = len(p) + self.max_new_tokens + (reach if self.resolved_mode == "spec" else 0)
                if need > mc.max_position_embeddings:
                    raise ValueError(
                        f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={self.max_new_tokens} it needs "
                        f"{need} positions but the model has max_position_embeddings={mc.max_position_embeddings}")


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
    stats: dict with "mode", "loop_passes" (passes of the batched program), "mean_tokens_per_forward",
      per-mode extras and, with `debug=True`, "trace".
    logprobs: np.float32 [B, max_new_tokens] for modes "ar" and "spec", else None: log p(token) of each
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
