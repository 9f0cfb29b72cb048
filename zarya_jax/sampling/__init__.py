"""Inference (docs/algorithms.md §4–§7): `generate(params, config, prompts, GenerationConfig(...), key)`.

`generate` (the one entry point) validates and pads the prompts and runs one of the `decoder.Decoder`s,
one per mode and module: `ar` (autoregressive baseline), `mdm` (mode A, first-hitting MDM sampling,
docs/algorithms.md §5), `slotted` (mode B, ReFusion plan-and-infill, docs/algorithms.md §6), `spec` (Ψ-Spec, docs/algorithms.md §7). `config` holds
`GenerationConfig` and `GenerationOutput`; building blocks: `primitives` (sampling, §4), `decoding` (what
the modes' loops share: prefill, sampler, log-probabilities, output assembly), `prompts`
(padding/bucketing), `passes` (one decode pass as its own program, the cache donated: benchmarks,
plans). Depends on `zarya_jax.nn` and `zarya_jax.config` only (no optimizer, no data pipeline).
"""
from .config import GenerationConfig, GenerationOutput
from .generate import generate
from .prompts import pad_prompts

__all__ = ["GenerationConfig", "GenerationOutput", "generate", "pad_prompts"]
