"""The tunix rollout engine over `generate()`, duck-typed (tunix is not installed with the project):
the interface of tunix 0.1.7's `BaseRollout` method by method, rollouts whose log-probabilities equal
the engine's own teacher-forced `get_per_token_logps`, greedy rollouts equal to `generate()`, and
`update_params` taking effect."""
import inspect
import types

import jax
import numpy as np
import pytest

from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.rl.tunix_rollout import RolloutOutput, ZaryaRollout
from zarya_jax.sampling import GenerationConfig, generate, modes
from zarya_jax.testing import UNO_CONFIG as CFG, uno_trained_params

# tunix 0.1.7, tunix/rl/rollout/base_rollout.py: BaseRollout's abstract methods and their parameters
BASE_ROLLOUT = {"generate": ["self", "prompts", "rollout_config", "kwargs"],
                "get_per_token_logps": ["self", "prompt_tokens", "completion_tokens"],
                "update_params": ["self", "params", "filter_types"],
                "pad_id": ["self"], "eos_id": ["self"], "model": ["self"]}
OUTPUT_FIELDS = ["text", "logits", "tokens", "left_padded_prompt_tokens", "logprobs"]


def rollout_config(**changes):
    """A tunix `RolloutConfig`'s fields that the engine reads."""
    base = dict(max_tokens_to_generate=12, temperature=1.0, top_p=1.0, top_k=None, seed=None,
                max_prompt_length=16, eos_tokens=None)
    return types.SimpleNamespace(**{**base, **changes})


def test_interface_is_tunix_base_rollout():
    for name, params in BASE_ROLLOUT.items():
        got = list(inspect.signature(getattr(ZaryaRollout, name)).parameters)
        assert got[:len(params)] == params, (name, got)
    assert list(RolloutOutput.__dataclass_fields__) == OUTPUT_FIELDS


@pytest.mark.parametrize("gc", [GenerationConfig(mode="ar"),
                                GenerationConfig(mode=modes.mode("spec-self", draft_length=3))])
def test_rollouts_and_their_logprobs(gc):
    params, tok = uno_trained_params(), ByteTokenizer()
    engine = ZaryaRollout(params, CFG, tok, gc)
    prompts = ["abcdef", "xyz", "hello there friend"]
    out = engine.generate(prompts, rollout_config(seed=3, top_k=-1, eos_tokens=[CFG.eos_token_id]))
    assert out.left_padded_prompt_tokens.shape == (3, 16)
    assert [tok.decode(list(map(int, t))) for t in out.tokens] == out.text
    # the sampler's log-probabilities = the engine's teacher-forced ones on the same tokens
    g = max(len(t) for t in out.tokens)
    comp = np.full((3, g), engine.pad_id(), np.int32)
    for i, t in enumerate(out.tokens):
        comp[i, :len(t)] = t
    lp = np.asarray(engine.get_per_token_logps(out.left_padded_prompt_tokens, comp))
    for i, t in enumerate(out.tokens):
        np.testing.assert_allclose(lp[i, :len(t)], out.logprobs[i], atol=1e-4)
        assert (lp[i, len(t):] == 0).all()
    # greedy: the tokens of generate() on the same (cut, unpadded) prompts
    greedy = engine.generate(prompts, rollout_config(temperature=0.0, max_prompt_length=4))
    ref = generate(params, CFG, [tok.encode(p)[-4:] for p in prompts],
                   GenerationConfig(mode="ar", max_new_tokens=12), jax.random.PRNGKey(0))
    for t, r, n in zip(greedy.tokens, ref.tokens, ref.lengths):
        np.testing.assert_array_equal(t, r[:n])


def test_update_params_and_ids():
    params, tok = uno_trained_params(), ByteTokenizer()
    engine = ZaryaRollout(params, CFG, tok)
    assert engine.pad_id() == CFG.pad_token_id and engine.eos_id() == CFG.eos_token_id and engine.model() is params
    before = engine.generate(["abc"], rollout_config(temperature=0.0)).tokens[0]
    other = jax.tree.map(lambda x: x * 0.5, params)
    engine.update_params(other)
    after = engine.generate(["abc"], rollout_config(temperature=0.0)).tokens[0]
    ref = generate(other, CFG, [tok.encode("abc")], GenerationConfig(mode="ar", max_new_tokens=12),
                   jax.random.PRNGKey(0))
    np.testing.assert_array_equal(after, ref.tokens[0][:ref.lengths[0]])
    assert engine.model() is other and not np.array_equal(before, after)


def test_refuses_off_policy_modes_and_several_eos():
    for off in ("mdm", "slotted"):
        with pytest.raises(ValueError, match=f"mode='{off}'.*not on-policy"):
            ZaryaRollout({}, CFG, ByteTokenizer(), GenerationConfig(mode=off))
    engine = ZaryaRollout(uno_trained_params(), CFG, ByteTokenizer())
    with pytest.raises(ValueError, match="eos_tokens"):
        engine.generate(["a"], rollout_config(eos_tokens=[1, 2]))
