"""The checkpoint contract (`zarya_jax.checkpoint.load/save`, …): re-exported from `zarya_jax.nn.checkpoint`."""
from .nn.checkpoint import load, load_config, load_prompt_format, load_zarya_config, save, tokenizer_dir

__all__ = ["load", "load_config", "load_prompt_format", "load_zarya_config", "save", "tokenizer_dir"]
