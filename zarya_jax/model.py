"""The model contract (`zarya_jax.model.forward`, `init_params`, `apply`): re-exported from
`zarya_jax.nn.model`, where the Qwen3 Linen module lives."""
from .nn.model import apply, forward, init_params

__all__ = ["apply", "forward", "init_params"]
