"""zarya_jax: Zarya (hybrid AR / masked-diffusion LM on Qwen3) and Uno's Ψ-Spec in JAX/Flax.

Subpackages, each importing only those below it: `experiment` (an experiment as a library object:
typed stages, `run(config, workdir) -> Report`, sweeps) → `train` (the trainer), `rl` (GRPO's pure core)
and `eval` (evaluation) → `inference` (a checkpoint loaded for decoding), `sampling` (inference) and
`objectives` (training losses) → `nn` (the network and its files) and `data` (tokenizers, records,
batches) → `config` (the frozen configs), `overrides` (dotted `--set` overrides), `files` (atomic writes,
output-path guards), `lock` (one run per workdir). `model`, `checkpoint` and `lora` are the stable names
of `nn.model`, `nn.checkpoint` and `nn.lora`; `provenance` records where a reported number comes from
(commit, versions, machine); `testing` holds the fixtures the tests and benchmarks share.
"""
from .config import LoraConfig, ModelConfig, ZaryaConfig, preset

__version__ = "0.1.0"
__all__ = ["LoraConfig", "ModelConfig", "ZaryaConfig", "preset", "__version__"]
