"""Shared fixtures (from `zarya_jax.testing`): tiny configs and params built once per session (compiles are
the slow part)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# libtpu (the test extra has it, for TPU-target compiles) would otherwise probe for a TPU at start-up.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest

from zarya_jax.config import ModelConfig, ZaryaConfig
from zarya_jax.testing import TINY, random_params


@pytest.fixture(scope="session")
def tiny_config() -> ModelConfig:
    """Byte-tokenizer-sized model with the mask token at id 259 and EOS at 258 (`zarya_jax.testing.TINY`;
    `TINY.replace(**changes)` for a variant)."""
    return TINY


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
    """Its initial params from PRNGKey(0) (`zarya_jax.testing.random_params`: shared, read-only)."""
    return random_params(tiny_config)


@pytest.fixture(scope="session")
def zarya_config() -> ZaryaConfig:
    return ZaryaConfig()


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs():
    """Each test module's compiled programs are dropped when it ends. Every XLA:CPU executable holds memory
    mappings of its own, and one process compiling the whole suite's programs runs into the kernel's
    limit on mappings per process (`vm.max_map_count`, 65,530 here): XLA then aborts in compilation."""
    yield
    jax.clear_caches()


@pytest.fixture
def compile_cache(tmp_path_factory):
    """A session-wide persistent compile cache directory for the subprocesses a test starts (training
    processes that compile the same step share one compile). The test process itself never turns the
    cache on: XLA's CPU client has been seen to crash while serialising an executable for it (a rare
    segmentation fault inside `executable.serialize()`), and in-process tests do not need it."""
    path = tmp_path_factory.getbasetemp() / "jax_compile_cache"
    path.mkdir(exist_ok=True)
    yield str(path)


@pytest.fixture(scope="session")
def qwen3_cache(tmp_path_factory) -> str:
    """A `ZARYA_CACHE` root holding Qwen3's tokenizer (`conversion.qwen3_tokenizer`), built once per session."""
    from conversion import qwen3_tokenizer

    root = tmp_path_factory.mktemp("zarya_cache")
    qwen3_tokenizer.build(str(root / "qwen3-tokenizer"))
    return str(root)


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(qwen3_cache) -> str:
    return os.path.join(qwen3_cache, "qwen3-tokenizer")
