"""Inference (docs/algorithms.md §4–§7): `generate(params, config, prompts, GenerationConfig(mode=…), key)`.

A decoding mode is a small frozen dataclass defined in its own module (`mode.Mode`): its knobs, their
checks, which of them are traced, and its `decoder.Decoder`. The eight modes, by their one name
(`modes.MODES`, `modes.mode(name, **knobs)`): `ar.AR` ("ar", the autoregressive baseline), `mdm.MDM`
("mdm", mode A, first-hitting MDM sampling, docs/algorithms.md §5), `slotted.Slotted` ("slotted", mode
B, ReFusion plan-and-infill, §6), `spec.SpecSelf` / `spec.SpecLora` ("spec-self", "spec-lora", Ψ-Spec
with the self or LoRA drafter, §7), `spec_model.SpecModel` ("spec-model", a separate draft model,
§7.6), `fused.FusedSelf` / `fused.FusedLora` ("spec-self-fused", "spec-lora-fused", one forward pass
per cycle, §7.5). `generate` (the one entry point) validates and pads the prompts and runs the mode's
decoder. `config` holds `GenerationConfig` (the mode and the shared sampling knobs) and
`GenerationOutput`; building blocks: `primitives` (sampling, §4), `decoding` (what the modes' loops
share: prefill, sampler, log-probabilities, output assembly), `prompts` (padding/bucketing), `passes`
(one decode pass as its own program, the cache donated: benchmarks, plans). Depends on
`zarya_jax.nn` and `zarya_jax.config` only (no optimizer, no data pipeline).
"""
from .ar import AR
from .config import GenerationConfig, GenerationOutput
from .fused import FusedLora, FusedSelf
from .generate import generate
from .mdm import MDM
from .mode import Mode
from .modes import MODES, mode
from .prompts import pad_prompts
from .slotted import Slotted
from .spec import SpecLora, SpecSelf
from .spec_model import SpecModel

__all__ = ["AR", "FusedLora", "FusedSelf", "GenerationConfig", "GenerationOutput", "MDM", "MODES", "Mode", "SpecLora",
           "SpecModel", "SpecSelf", "Slotted", "generate", "mode", "pad_prompts"]
