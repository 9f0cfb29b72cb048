"""Inference (SPEC §4–§7): `generate(params, config, prompts, GenerationConfig(...), key)`.

Modes: "ar" (autoregressive baseline), "mdm" (mode A, first-hitting MDM sampling, SPEC §5),
"slotted" (mode B, ReFusion plan-and-infill, SPEC §6), "spec" (Ψ-Spec, SPEC §7). Building blocks:
`primitives` (sampling, §4), `prompts` (padding/bucketing), one module per mode.
"""
from .config import GenerationConfig, GenerationOutput
from .generate import generate
from .prompts import pad_prompts

__all__ = ["GenerationConfig", "GenerationOutput", "generate", "pad_prompts"]
