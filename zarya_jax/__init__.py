"""zarya_jax: Zarya (hybrid AR / masked-diffusion LM on Qwen3) and Uno's Ψ-Spec in JAX/Flax.

Subpackages, each importing only those below it: `train` (the trainer) and `eval` (evaluation, on top of
`sampling`) → `sampling` (inference) and `objectives` (training losses) → `nn` (the network and its files)
and `data` (tokenizers, records, batches) → `config` (the frozen configs), `overrides` (dotted `--set`
overrides), `files` (atomic writes). `model`, `checkpoint` and `lora` are the stable names of `nn.model`,
`nn.checkpoint` and `nn.lora`; `provenance` records where a reported number comes from (commit, versions,
machine); `testing` holds the fixtures the tests and benchmarks share.
"""
from .config import LoraConfig, ModelConfig, ZaryaConfig, preset

__version__ = "0.1.0"
__all__ = ["LoraConfig", "ModelConfig", "ZaryaConfig", "preset", "__version__"]
