"""zarya_jax: Zarya (hybrid AR / masked-diffusion LM on Qwen3) and Uno's Ψ-Spec in JAX/Flax."""
from .config import LoraConfig, ModelConfig, ZaryaConfig, preset

__version__ = "0.1.0"
__all__ = ["LoraConfig", "ModelConfig", "ZaryaConfig", "preset", "__version__"]
