"""Shared fixtures of the tests and the benchmarks (as gemma's `gm/testing`): one tiny model config,
a deterministic synthetic text, small models trained on it in seconds, and random Hugging Face Qwen3
models with their weights copied into our params.

- `TINY`: a byte-tokenizer-sized Qwen3 (2 layers × 64d, vocab 264) with the mask token at 259, EOS at
  258 and pad at 256 (`TINY.replace(**changes)` varies it; tests/conftest.py's `tiny_config` fixture is
  it); `random_params(config, seed)` a model's initial params, built once per process (the
  `tiny_params` fixture); `normal_params` every leaf standard normal, for file round trips.
- `synthetic_tokens` / `batch_of`: letter sequences with a per-row stride, x_{i+1} = a + (x_i − a + k)
  mod 26, as a supervised batch.
- `pretrain_ar`: an AR model on that text (+ an MDM loss on masked copies, so it can self-draft);
  `fit_adapter`: a gated-LoRA drafter trained on it with the TV loss and the block curriculum.
- `UNO_CONFIG` (`TINY` with an untied head), `UNO_LORA`, `UNO_DRAFTER` and, built once per process,
  `uno_random_params()`, `uno_trained_params()` (briefly trained with AR + MDM losses, so the AR model is
  predictable and its MDM pass can self-draft) and `uno_adapters()` (an untrained adapter and one
  trained a little with the TV loss): the models of the Uno tests; `ragged_prompts` their prompts.
- `SPEC_SMALL`, `sharp_params`, `two_token_distribution`, `two_token_tv`: the exact-distribution
  check of the speculative samplers (an 8-token model whose first two sampled tokens' exact joint
  distribution is enumerated with full forwards, against a histogram of sampled pairs).
- `check_against_full_forward`: every cached pass a sampler recorded (its debug trace) against one full
  causal forward without a cache (the samplers' reference).
- `random_torch_model` / `random_hf_model`: a random transformers `Qwen3ForCausalLM` of a `ModelConfig`
  (and its params).
- `chat_tokenizer`: a character-level Hugging Face tokenizer with Qwen3's chat template and special
  tokens, saved to a directory (nothing to download), and its vocabulary.
"""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .config import LoraConfig, ModelConfig, to_hf_dict
from .nn import hf_params
from . import lora as lora_lib
from . import model as model_lib
from .objectives import drafter as drafter_lib

TINY = ModelConfig(vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, max_position_embeddings=512, mask_token_id=259, eos_token_id=258, pad_token_id=256)
LETTERS = 97  # 'a'
ALPHABET = 26


def write_sum_records(path, count: int, seed: int = 0) -> str:
    """`count` JSONL records "a+b=" → "a+b" (a, b < 50, drawn in order from `seed`) at `path`: the small
    training file the trainer's tests share. Returns the path as a string."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(count):
            a, b = rng.integers(0, 50, 2)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return str(path)


@functools.cache
def random_params(config: ModelConfig = TINY, seed: int = 0):
    """`config`'s initial params from PRNGKey(`seed`) (`model.init_params`, jitted: the op-by-op init is
    slow on a busy CPU), built once per process and shared: treat them as read-only."""
    return jax.jit(model_lib.init_params, static_argnums=0)(config, jax.random.PRNGKey(seed))


def normal_params(config: ModelConfig = TINY, seed: int = 0):
    """Params of `config`'s shapes with every leaf standard normal (numpy's `default_rng(seed)`), the norm
    scales too (an init's are all ones): a file round trip that loses, swaps or re-initialises a leaf shows."""
    rng = np.random.default_rng(seed)
    params = {}
    for e in hf_params.entries(config):
        shape = hf_params.stacked_shape(e, config)
        hf_params.set_path(params, e.path, jax.device_put(rng.standard_normal(shape, dtype=np.float32)))
    return params


# ------------------------------------------------------------------ synthetic text and quick training
def synthetic_tokens(rng: np.random.Generator, batch: int, length: int, strides=(1, 2, 3)) -> np.ndarray:
    """int32 [batch, length] letter ids: x_{i+1} = a + (x_i − a + k) mod 26, k drawn per row."""
    start = rng.integers(0, ALPHABET, (batch, 1))
    k = rng.choice(np.asarray(strides), (batch, 1))
    return (LETTERS + (start + k * np.arange(length)[None, :]) % ALPHABET).astype(np.int32)


def batch_of(tokens: np.ndarray) -> dict:
    """Rows of tokens as a supervised batch (`data.batch` layout), every token an answer token."""
    b, n = tokens.shape
    return {"tokens": jnp.asarray(tokens), "segment_ids": jnp.ones((b, n), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)),
            "answer_mask": jnp.ones((b, n), bool)}


def pretrain_ar(config: ModelConfig, *, steps: int = 200, batch: int = 32, length: int = 32, lr: float = 3e-3,
                mdm_weight: float = 0.0, seed: int = 0):
    """A small AR model on the synthetic text (next-token CE). With mdm_weight > 0, also a masked
    copy (random mask rate, MDM convention: a mask predicts its own token) so the model can self-draft.
    Returns (params, final loss)."""
    params = jax.jit(model_lib.init_params, static_argnums=0)(config, jax.random.PRNGKey(seed))
    opt = optax.adam(lr)
    state = opt.init(params)

    def loss_fn(p, toks, key):
        logits = model_lib.forward(p, config, toks)
        lp = jax.nn.log_softmax(logits[:, :-1], -1)
        ce = -jnp.take_along_axis(lp, toks[:, 1:, None], -1).mean()
        if mdm_weight == 0:
            return ce
        k1, k2 = jax.random.split(key)
        rate = jax.random.uniform(k1, (toks.shape[0], 1), minval=0.1, maxval=1.0)
        masked = jax.random.bernoulli(k2, rate, toks.shape) & (jnp.arange(toks.shape[1]) > 0)
        noisy = jnp.where(masked, config.mask_token_id, toks)
        lq = jax.nn.log_softmax(model_lib.forward(p, config, noisy), -1)
        mce = -jnp.take_along_axis(lq, toks[..., None], -1)[..., 0]
        return ce + mdm_weight * (mce * masked).sum() / jnp.maximum(masked.sum(), 1)

    @jax.jit
    def step(p, s, toks, key):
        loss, g = jax.value_and_grad(loss_fn)(p, toks, key)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss

    rng = np.random.default_rng(seed)
    for i in range(steps):
        params, state, loss = step(params, state, jnp.asarray(synthetic_tokens(rng, batch, length)),
                                   jax.random.PRNGKey(i))
    return params, float(loss)


def fit_adapter(params, config: ModelConfig, lora: LoraConfig, dcfg: drafter_lib.DrafterConfig, *, steps: int = 100,
                batch: int = 16, length: int = 32, lr: float = 3e-3, seed: int = 0, lora_params=None):
    """In-memory drafter training (TV loss, block curriculum, the adapter's noise) on the synthetic text:
    only the adapter is differentiated and updated. Returns (lora_params, [loss per step])."""
    if lora_params is None:
        lora_params = lora_lib.init_lora(config, lora, jax.random.PRNGKey(seed + 1))
    opt = optax.adam(lr)
    state = opt.init(lora_params)

    @jax.jit
    def step(lp, s, b, key, block):
        pair = drafter_lib.make_pair_batch(key, b, block, config, lora)
        (loss, m), g = jax.value_and_grad(drafter_lib.drafter_loss, has_aux=True)(lp, params, config, lora, pair, dcfg)
        upd, s = opt.update(g, s, lp)
        return optax.apply_updates(lp, upd), s, loss

    rng = np.random.default_rng(seed + 7)
    losses = []
    for i in range(steps):
        block = drafter_lib.block_size_at(i, steps, dcfg)
        lora_params, state, loss = step(lora_params, state, batch_of(synthetic_tokens(rng, batch, length)),
                                        jax.random.PRNGKey(1000 + i), jnp.int32(block))
        losses.append(float(loss))
    return lora_params, losses


# ------------------------------------------------------------------ the Uno test models
UNO_CONFIG = TINY.replace(tie_word_embeddings=False)
UNO_LORA = LoraConfig(rank=8, alpha=64.0)
UNO_DRAFTER = drafter_lib.DrafterConfig(block_sizes=(2, 4, 6))


def uno_random_params():
    """`UNO_CONFIG` with random weights (varied greedy outputs)."""
    return random_params(UNO_CONFIG)


@functools.cache
def uno_trained_params():
    """`UNO_CONFIG` trained for 80 steps on the synthetic text with AR and MDM losses."""
    params, _ = pretrain_ar(UNO_CONFIG, steps=80, batch=16, length=24, lr=1e-2, mdm_weight=1.0)
    return params


@functools.cache
def uno_adapters():
    """(untrained adapter, adapter trained for 120 TV steps on `uno_trained_params()`, its losses)."""
    untrained = lora_lib.init_lora(UNO_CONFIG, UNO_LORA, jax.random.PRNGKey(1))
    trained, losses = fit_adapter(uno_trained_params(), UNO_CONFIG, UNO_LORA, UNO_DRAFTER, steps=120, lr=1e-2,
                                  lora_params=untrained)
    return untrained, trained, losses


RAGGED_LENGTHS = (9, 3, 14, 1, 6)


def ragged_prompts(trained: bool, lengths=RAGGED_LENGTHS) -> list[list[int]]:
    """Prompts of ragged `lengths` (one of a single token): synthetic letter text (what the trained Uno
    model predicts) or random byte ids."""
    rng = np.random.default_rng(7)
    if trained:
        rows = synthetic_tokens(rng, len(lengths), max(lengths))
        return [list(map(int, r[:n])) for r, n in zip(rows, lengths)]
    return [list(map(int, rng.integers(0, 256, n))) for n in lengths]


# ------------------------------------------------------------------ exact sampling distributions
SPEC_SMALL = ModelConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                         num_kv_heads=1, head_dim=16, max_position_embeddings=64, mask_token_id=7, eos_token_id=None,
                         pad_token_id=0, tie_word_embeddings=False)


def sharp_params(config: ModelConfig, seed: int, scale: float = 60.0):
    """Random params of an untied-head `config` with the head scaled by `scale`: a non-flat next-token
    distribution that depends on the input."""
    params = random_params(config, seed)
    return {**params, "lm_head": params["lm_head"] * scale}


def two_token_distribution(params, config: ModelConfig, prompt: list[int], vocab: int) -> np.ndarray:
    """float64 [vocab, vocab]: the AR model's exact joint p(t1) p(t2 | t1) of the two tokens after `prompt`
    at temperature 1 over ids 0 … vocab−1 (the ids above, the mask among them, never sampled), from full
    causal forwards over prompt + t1."""
    seqs = jnp.asarray([list(prompt) + [t1] for t1 in range(vocab)], jnp.int32)
    logits = np.asarray(model_lib.forward(params, config, seqs), np.float64)[..., :vocab]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return probs[0, len(prompt) - 1][:, None] * probs[:, len(prompt)]


def two_token_tv(tokens: np.ndarray, exact: np.ndarray) -> float:
    """Total variation between the histogram of the pairs tokens[:, :2] (int [n, ≥2]) and `exact` [v, v].
    Sampling noise alone gives E[TV] ≈ 0.5 Σ sqrt(2 p / (π n))."""
    v = exact.shape[0]
    hist = np.bincount(tokens[:, 0] * v + tokens[:, 1], minlength=v * v).reshape(v, v) / len(tokens)
    return float(0.5 * np.abs(hist - exact).sum())


# ------------------------------------------------------------------ the samplers' reference
@functools.partial(jax.jit, static_argnums=3)
def _reference_forward(params, tokens, positions, config):
    return model_lib.forward(params, config, tokens, positions)


def reference_sequences(trace, phys_tok, phys_pos, groups_of=None, select=None):
    """Yields (pass n, row b, window row indices, tokens, positions) for every reference forward."""
    n_pass, b, w = np.asarray(trace["valid"]).shape
    for n in range(n_pass):
        for r in range(b):
            valid = np.asarray(trace["valid"][n, r])
            if not valid.any() or (select is not None and not select(n, r)):
                continue
            c = int(trace["cache_len"][n, r])
            prefix_t = list(phys_tok[r, :c])
            prefix_p = list(phys_pos[r, :c])
            assert min(prefix_t) >= 0 and min(prefix_p) >= 0
            groups = groups_of(n, r) if groups_of is not None else np.zeros(w, int)
            for g in np.unique(groups[valid]):
                idx = np.flatnonzero(valid & (groups == g))
                yield n, r, idx, prefix_t + list(trace["tokens"][n, r, idx]), prefix_p + list(
                    trace["positions"][n, r, idx])


def check_against_full_forward(params, config, trace, phys_tok, phys_pos, groups_of=None, select=None,
                               atol=3e-5):
    """Asserts each pass a sampler recorded (`generate(debug=True)`'s trace: it saw the cache, a prefix of
    the physical sequence, plus its window) gives the logits of one full causal forward without a cache
    over that prefix and the pass's valid window rows (physical order, logical positions as RoPE
    positions, docs/algorithms.md §0); slot-local passes are recomputed slot by slot. Returns how many
    were checked. `groups_of(n, b)` -> int [window] recomputes each group separately; `select(n, b)` -> bool
    filters passes."""
    items = list(reference_sequences(trace, phys_tok, phys_pos, groups_of, select))
    assert items, "no pass recorded"
    # Shapes rounded up to buckets so that every check in a session reuses one compiled forward.
    width = -(-max(len(t) for *_, t, _ in items) // 32) * 32
    rows = -(-len(items) // 64) * 64
    toks = np.zeros((rows, width), np.int32)
    pos = np.zeros((rows, width), np.int32)
    for i, (*_, t, p) in enumerate(items):
        toks[i, : len(t)] = t  # right padding: causal rows before it are unaffected
        pos[i, : len(p)] = p
    ref = np.asarray(_reference_forward(params, jnp.asarray(toks), jnp.asarray(pos), config))
    logits = np.asarray(trace["logits"])
    for i, (n, r, idx, t, _) in enumerate(items):
        k = len(idx)
        np.testing.assert_allclose(logits[n, r, idx], ref[i, len(t) - k: len(t)], atol=atol, rtol=1e-5,
                                   err_msg=f"pass {n}, row {r}, window rows {idx.tolist()}")
    return len(items)


# ------------------------------------------------------------------ random Hugging Face models
def random_torch_model(config: ModelConfig, seed: int = 0, **hf_overrides):
    """A random transformers Qwen3ForCausalLM with `config`'s dimensions (fp32, eager attention, CPU,
    weights from `torch.manual_seed(seed)`); `hf_overrides` go to its Qwen3Config (e.g.
    `initializer_range=0.2`, `attn_implementation="sdpa"`). Touches no JAX array."""
    import torch  # torch and transformers' PyTorch side load only for the HF comparisons
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    hf_config = Qwen3Config.from_dict({**to_hf_dict(config), "dtype": "float32", "attn_implementation": "eager",
                                       **hf_overrides})
    return Qwen3ForCausalLM(hf_config).eval()


def random_hf_model(config: ModelConfig, seed: int = 0, **hf_overrides):
    """(`random_torch_model(config, seed, **hf_overrides)`, the same weights as our params pytree)."""
    model = random_torch_model(config, seed, **hf_overrides)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    return model, jax.tree.map(jnp.asarray, hf_params.from_hf(state, config))


# A Qwen3-style chat template (system turn, user/assistant turns, the generation prompt, `enable_thinking`).
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
CHAT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<mdm_mask>", "<think>", "</think>")


def chat_tokenizer(directory: str) -> dict[str, int]:
    """Saves a character-level tokenizer (printable ASCII + newline) with Qwen3's special tokens and chat
    template to `directory` (EOS `<|im_end|>`, pad `<|endoftext|>`); returns its vocabulary (≤ 128 ids,
    so the tiny presets' 264-row embedding covers it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # transformers' side, for HF tests only
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {t: i for i, t in enumerate(list(CHAT_SPECIALS) + ["<unk>"] + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIALS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 unk_token="<unk>")
    hf.chat_template = QWEN_CHAT_TEMPLATE
    hf.save_pretrained(directory)
    return vocab
