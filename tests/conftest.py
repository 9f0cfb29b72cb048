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


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """Session-wide persistent compile cache, so tests (and their subprocesses) that compile the same
    step share one compile; the settings are restored after the module."""
    path = tmp_path_factory.getbasetemp() / "jax_compile_cache"
    path.mkdir(exist_ok=True)
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    old = {k: getattr(jax.config, k) for k in names}
    for k, v in zip(names, (str(path), 0.0, 0)):
        jax.config.update(k, v)
    yield str(path)
    for k, v in old.items():
        jax.config.update(k, v)
