"""The adapter contract (`zarya_jax.lora.init_lora/save/load/merge`, …): re-exported from `zarya_jax.nn.lora`."""
from .nn.lora import (ADAPTER_FILE, PROJECTIONS, check_lora, init_lora, load, merge, metadata, noise_tokens, num_params,
                      projection_shapes, save)

__all__ = ["ADAPTER_FILE", "PROJECTIONS", "check_lora", "init_lora", "load", "merge", "metadata", "noise_tokens",
           "num_params", "projection_shapes", "save"]
