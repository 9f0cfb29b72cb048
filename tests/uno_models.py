"""Models shared by the Uno tests (test_drafter, test_spec), built once per session (lru_cache).

- `random_model()`: an untied tiny Qwen3 with random weights (varied greedy outputs).
- `trained_model()`: the same shape trained briefly on a deterministic synthetic text (letters with a
  per-sequence stride; see experiments/bench_spec.py) with AR and MDM losses, so the AR model is
  predictable and its MDM pass can self-draft.
- `adapters()`: an untrained adapter and one trained a little with the TV loss on that text.
"""
import functools

import jax

from experiments.bench_spec import fit_adapter, pretrain_ar
from zarya_jax import drafter as drafter_lib
from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import LoraConfig, ModelConfig

CFG = ModelConfig(vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, max_position_embeddings=512, mask_token_id=259, eos_token_id=258, pad_token_id=256,
                  tie_word_embeddings=False)
LORA = LoraConfig(rank=8, alpha=64.0)
DCFG = drafter_lib.DrafterConfig(block_sizes=(2, 4, 6))


@functools.lru_cache(None)
def random_model():
    return jax.jit(model_lib.init_params, static_argnums=0)(CFG, jax.random.PRNGKey(0))


@functools.lru_cache(None)
def trained_model():
    params, _ = pretrain_ar(CFG, steps=80, batch=16, length=24, lr=1e-2, mdm_weight=1.0)
    return params


@functools.lru_cache(None)
def adapters():
    """(untrained adapter, trained adapter, TV losses during training)."""
    untrained = lora_lib.init_lora(CFG, LORA, jax.random.PRNGKey(1))
    trained, losses = fit_adapter(trained_model(), CFG, LORA, DCFG, steps=120, lr=1e-2, lora_params=untrained)
    return untrained, trained, losses
