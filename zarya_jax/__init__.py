"""zarya_jax: Zarya (hybrid AR / masked-diffusion LM on Qwen3) and Uno's Ψ-Spec in JAX/Flax.

Subpackages, each importing only those below it: `experiment` (an experiment as a library object) →
`train`, `sampling`, `eval` → `inference` (a checkpoint loaded for decoding), `objectives` → `nn`,
`data` → `config`, `overrides`, `files`. `model`, `checkpoint` and `lora` are the stable names of
`nn.model`, `nn.checkpoint` and `nn.lora`; `testing` holds the fixtures the tests and benchmarks share.
"""
from .config import LoraConfig, ModelConfig, ZaryaConfig, preset

__version__ = "0.1.0"
__all__ = ["LoraConfig", "ModelConfig", "ZaryaConfig", "preset", "__version__"]
