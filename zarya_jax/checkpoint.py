"""The checkpoint contract (`zarya_jax.checkpoint.load/save`, …): re-exported from `zarya_jax.nn.checkpoint`."""
from .nn.checkpoint import (Lazy, checksums, load, load_config, load_prompt_format, load_zarya_config, param_shapes, read_param,
                            save, tokenizer_dir)

__all__ = ["Lazy", "checksums", "load", "load_config", "load_prompt_format", "load_zarya_config", "param_shapes", "read_param",
           "save", "tokenizer_dir"]
