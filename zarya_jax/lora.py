"""The adapter contract (`zarya_jax.lora.init_lora/save/load/merge`, …): re-exported from `zarya_jax.nn.lora`."""
from .nn.lora import (ADAPTER_FILE, FORMAT, PROJECTIONS, check_lora, check_values, init_lora, load, merge, metadata,
                      noise_tokens, num_params, projection_shapes, save)

__all__ = ["ADAPTER_FILE", "FORMAT", "PROJECTIONS", "check_lora", "check_values", "init_lora", "load", "merge",
           "metadata", "noise_tokens", "num_params", "projection_shapes", "save"]
