"""The decoder protocol: what every decoding mode gives `generate()` (docs/algorithms.md §4).

`generate` does the work all modes share — validating the config and the prompts, padding them into
one bucketed batch, compiling one program per (batch, bucket, model config, generation config with
the mode's `static()`), fetching the result and assembling the `GenerationOutput` — and the mode's
`Decoder` (`Mode.decoder`, set in the mode's file) does the rest:

- `run(params, tokens, lengths, key, *, config, gcfg, debug, knobs[, lora_params, lora][, draft_params,
  draft_config])`: the decode itself, traced inside one `jax.jit` (`tokens` int32 [B, P] right-padded,
  `lengths` [B]; `gcfg` the static generation config, whose mode has its traced fields reset;
  `knobs` the mode itself with its traced fields as arrays, `Mode.arrays`; the adapter only for a
  decoder that `uses_adapter`, the draft model only for one that `uses_draft_model`).
  Returns a dict with at least `tokens` [B, G] (logical order, pad after the end), `lengths` [B],
  `num_forward_passes` [B] and `loop_passes`.
- `stats(raw, gcfg, tokens, lengths, out_lengths) -> dict`: mode-specific statistics from the host copy
  of that dict (physical order, acceptance, …).
- `check(config, gcfg, weights, weights_config)`: mode-specific validation of the weights at the edge,
  before compiling (the knobs are checked by `Mode.check`); the drafter's weights and their config are
  the adapter (`lora_params`, `lora`), or the draft model (`draft_params`, `draft_config`) for a decoder
  that `uses_draft_model`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np


def no_stats(raw: dict, gcfg, tokens: np.ndarray, lengths: np.ndarray, out_lengths: np.ndarray) -> dict:
    return {}


def no_check(config, gcfg, lora_params, lora) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Decoder:
    """One decoding mode behind `generate()` (module doc)."""

    run: Callable[..., dict]
    stats: Callable[..., dict[str, Any]] = no_stats
    check: Callable[..., None] = no_check
    uses_adapter: bool = False
    uses_draft_model: bool = False
