"""Shared fixtures: tiny configs and params built once per session (compiles are the slow part)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import pytest

from zarya_jax.config import ModelConfig, ZaryaConfig


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    """Byte-tokenizer-sized model with the mask token at id 259 and EOS at 258."""
    return ModelConfig(vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16, max_position_embeddings=512, mask_token_id=259,
                       eos_token_id=258, pad_token_id=256)


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
    from zarya_jax.model import init_params

    return init_params(tiny_config, jax.random.PRNGKey(0))


@pytest.fixture(scope="session")
def zarya_config() -> ZaryaConfig:
    return ZaryaConfig()
