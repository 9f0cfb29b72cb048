"""zarya_jax: Zarya (hybrid AR / masked-diffusion LM on Qwen3) and Uno's Ψ-Spec in JAX/Flax.

The front door (README "Python"): `Sampler(load_for_inference(ckpt), GenerationConfig(mode=...))
.sample(texts)` decodes prompt texts in any decoding mode (`zarya_jax.inference`; `GenerationConfig` is
`zarya_jax.sampling`'s). They are imported on first use, so `import zarya_jax` stays light.

Subpackages, each importing only those below it: `experiment` (an experiment as a library object:
typed stages, `run(config, workdir) -> Report`, sweeps) → `train` (the trainer: the Zarya run, the LoRA
drafter and the draft model runs), `rl` (GRPO's pure core) and `eval` (evaluation, the decoding
frontier, diagnostics) → `inference` (a checkpoint loaded for decoding, the `Sampler`), `sampling`
(the decoding modes: AR, mode A `mdm`, mode B `slotted`, Ψ-Spec `spec` with the self or LoRA drafter,
`spec_model` with a draft model, `fused` speculation in one pass per cycle) and `objectives` (training
losses: Zarya's hybrid loss and its `reconstruction` pass, the AR baseline, Uno's `drafter`, its
consistency distillation `dcd`, a draft model's `distill`) → `model` (the Qwen3 Linen model, each
parameter created with its logical axes), `checkpoint` (Orbax model checkpoints), `lora` (gated-LoRA
adapters and their noise convention) and `data` (tokenizers, records, batches) → `nn` (the network's
parts: attention kernels, masks, the KV cache, partitioning, the HF ⇄ JAX tensor map,
checksums) → `config` (the frozen configs), `overrides` (dotted `--set` overrides), `files` (atomic writes, output-path guards), `lock` (one run per workdir), `timing` (wall-clock timing of
compiled programs: one call, a loop's slope). `target`
names the devices a program is compiled for (TPU topologies, GPUs, this host); `provenance` records
where a reported number comes from (commit, versions, machine); `testing` holds the fixtures the tests
and benchmarks share.
"""
from .config import LoraConfig, ModelConfig, ZaryaConfig, preset

__version__ = "0.1.0"
# The front door, imported on first use (PEP 562): it loads the samplers, which `import zarya_jax` need not.
_FRONT_DOOR = ("Inference", "SampleOutput", "Sampler", "load_for_inference")
__all__ = ["LoraConfig", "ModelConfig", "ZaryaConfig", "preset", "__version__", *_FRONT_DOOR]


def __getattr__(name: str):
    if name in _FRONT_DOOR:
        from . import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'zarya_jax' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_FRONT_DOOR))
