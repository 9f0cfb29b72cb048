"""The front door (`zarya_jax.Sampler`, README "Python"): prompt texts rendered in the checkpoint's recorded
prompt format, decoded by `generate` in the configured mode (with the adapter the `Inference` holds for
"spec-lora"), and texts, tokens, log-probs and stats back; bad input is refused before anything compiles."""
import jax
import numpy as np
import pytest

from zarya_jax import Sampler, load_for_inference
from zarya_jax.config import LoraConfig, PromptFormat
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax import checkpoint
from zarya_jax import lora as lora_lib
from zarya_jax.sampling import GenerationConfig, generate

TEXTS = ["abc", "hello there", "x"]
FORMAT = PromptFormat(prompt_template="Q: {prompt}\nA: ")  # recorded by the checkpoint, not the default
LORA = LoraConfig(rank=4, alpha=32.0)


@pytest.fixture(scope="module")
def saved(tiny_config, tiny_params, tmp_path_factory):
    """A checkpoint with the byte tokenizer and FORMAT recorded, and an adapter directory for it."""
    root = tmp_path_factory.mktemp("sampler")
    ckpt = checkpoint.save(root / "ckpt", tiny_params, tiny_config, tokenizer=ByteTokenizer(), prompt_format=FORMAT)
    lora_lib.save(root / "adapter", lora_lib.init_lora(tiny_config, LORA, jax.random.PRNGKey(1)), LORA)
    return str(ckpt), str(root / "adapter")


@pytest.fixture(scope="module")
def model(saved):
    return load_for_inference(saved[0])


def rendered(text: str) -> list[int]:
    """FORMAT's rendering of `text` in bytes, written out here (what `Sampler` must read)."""
    return list(f"Q: {text}\nA: ".encode())


@pytest.mark.parametrize("gc, seed", [(GenerationConfig(mode="ar", max_new_tokens=8), 0),
                                      (GenerationConfig(mode="slotted", max_new_tokens=8, temperature=1.0), 5)],
                         ids=["ar", "slotted-sampled"])
def test_sample_equals_generate(model, tiny_config, tiny_params, gc, seed):
    out = Sampler(model, gc).sample(TEXTS, seed=seed)
    ref = generate(tiny_params, tiny_config, [rendered(t) for t in TEXTS], gc, jax.random.PRNGKey(seed))
    assert out.prompt_tokens == [rendered(t) for t in TEXTS]
    assert out.tokens == [ref.tokens[r, :n].tolist() for r, n in enumerate(ref.lengths)]
    assert out.stats["mode"] == gc.mode.name
    np.testing.assert_equal(out.stats, ref.stats)
    np.testing.assert_array_equal(out.output.num_forward_passes, ref.num_forward_passes)
    if ref.logprobs is None:  # mode B has no AR-policy log-probabilities
        assert out.logprobs is None and gc.mode.name == "slotted"
    else:
        assert [lp.tolist() for lp in out.logprobs] == [ref.logprobs[r, :n].tolist() for r, n in enumerate(ref.lengths)]
        assert all(len(lp) == len(t) and (lp <= 0).all() for lp, t in zip(out.logprobs, out.tokens))


def test_texts_round_trip(model):
    sampler = Sampler(model, GenerationConfig(mode="ar", max_new_tokens=8))
    out = sampler.sample(TEXTS)
    tok = model.tokenizer
    assert [tok.decode(ids) for ids in out.prompt_tokens] == [f"Q: {t}\nA: " for t in TEXTS]
    assert out.texts == [tok.decode(ids) for ids in out.tokens] and all(out.tokens)
    assert sampler.encode(TEXTS) == out.prompt_tokens
    one = sampler.sample(TEXTS[1])  # one string is one prompt
    assert one.texts == out.texts[1:2] and one.tokens == out.tokens[1:2]


def test_spec_lora_decodes_with_the_loaded_adapter(saved, tiny_config, tiny_params):
    """The adapter of `load_for_inference(adapter=)` reaches the drafter; greedy Ψ-Spec is lossless, so the
    tokens are AR's."""
    ckpt, adapter = saved
    gc = GenerationConfig(mode="spec-lora", max_new_tokens=8)
    with pytest.raises(ValueError, match=r"adapter=DIR"):
        Sampler(load_for_inference(ckpt), gc)
    model = load_for_inference(ckpt, adapter=adapter)
    out = Sampler(model, gc).sample(TEXTS)
    ar = Sampler(model, GenerationConfig(mode="ar", max_new_tokens=8)).sample(TEXTS)
    assert out.tokens == ar.tokens and out.stats["mode"] == "spec-lora"
    ref = generate(tiny_params, tiny_config, [rendered(t) for t in TEXTS], gc, jax.random.PRNGKey(0),
                   lora_params=model.adapter, lora=model.lora)
    np.testing.assert_equal(out.stats, ref.stats)


@pytest.mark.parametrize("texts, message", [
    ([], r"texts: expected at least one prompt, got an empty list"),
    (["ok", 3], r"texts\[1\]=3: expected a prompt string, got a int"),
    ([b"bytes"], r"texts\[0\]=b'bytes': expected a prompt string"),
    ({"prompt": "a"}, r"texts: expected a list of prompt strings \(or one string\), got a dict"),
    (["ok", ""], r"texts\[1\] is empty"),
])
def test_bad_texts_are_refused(model, texts, message):
    with pytest.raises(ValueError, match=message):
        Sampler(model, GenerationConfig(max_new_tokens=4)).sample(texts)


def test_bad_sampler_arguments_are_refused(model, tiny_params):
    with pytest.raises(ValueError, match=r"model is a dict: expected an Inference"):
        Sampler(tiny_params, GenerationConfig())
    with pytest.raises(ValueError, match=r"config is a str: expected a zarya_jax.sampling.GenerationConfig"):
        Sampler(model, "slotted")
    with pytest.raises(ValueError, match=r"seed=-1: expected an integer"):
        Sampler(model, GenerationConfig(max_new_tokens=4)).sample(TEXTS, seed=-1)
