"""The decoder protocol: what every decoding mode gives `generate()` (docs/algorithms.md §4).

`generate` does the work all modes share — validating the config and the prompts, padding them into
one bucketed batch, compiling one program per (batch, bucket, model config, generation config),
fetching the result and assembling the `GenerationOutput` — and a `Decoder` does the rest:

- `run(params, tokens, lengths, key, *, config, gcfg, debug, dyn[, lora_params, lora][, draft_params,
  draft_config])`: the decode itself, traced inside one `jax.jit` (`tokens` int32 [B, P] right-padded,
  `lengths` [B]; `dyn` the knobs passed as traced scalars, a `slotted.Knobs`; the adapter only for a
  decoder that `uses_adapter`, the draft model only for one that `uses_draft_model`).
  Returns a dict with at least `tokens` [B, G] (logical order, pad after the end), `lengths` [B],
  `num_forward_passes` [B] and `loop_passes`.
- `stats(raw, gcfg, tokens, lengths, out_lengths) -> dict`: mode-specific statistics from the host copy
  of that dict (physical order, acceptance, …).
- `check(config, gcfg, weights, weights_config)`: mode-specific validation at the edge, before compiling;
  the drafter's weights and their config are the adapter (`lora_params`, `lora`), or the draft model
  (`draft_params`, `draft_config`) for a decoder that `uses_draft_model`.
- `knobs(gcfg)`: the mode's traced knobs (`dyn`), default mode B's `slotted.Knobs`.
- `static(gcfg)`: the generation config as the compile key sees it, for a mode whose traced knobs
  stand for fields beyond the reset ones (`generate.static_key`); default unchanged.
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
    knobs: Callable[..., Any] | None = None
    static: Callable[[Any], Any] | None = None
