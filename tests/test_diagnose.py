"""Diagnostics: teacher-forced accuracy of each head against plain causal recomputes; first errors."""
import jax
import jax.numpy as jnp
import numpy as np

from zarya_jax.eval import diagnose
from zarya_jax import model as model_lib


def _causal_argmax(params, config, seqs):
    """Greedy predictions (mask token excluded) of one plain causal forward per sequence, batched with
    right padding (which a causal row never sees)."""
    width = max(len(s) for s in seqs)
    toks = np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        toks[i, :len(s)] = s
    logits = np.array(jax.jit(model_lib.forward, static_argnums=1)(params, config, jnp.asarray(toks)))
    logits[..., config.mask_token_id] = -np.inf
    return logits.argmax(-1)


def test_teacher_forced_matches_plain_forwards(tiny_config, tiny_params):
    """AR head: one causal forward over prompt + answer; MDM head: one causal forward over prompt +
    the answer before the slot + the slot as masks — the layouts mode B's passes see."""
    params = {**tiny_params, "embed": tiny_params["embed"] * 50.0}  # peaked predictions
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 250, size=n).tolist() for n in (5, 3, 8)]
    # answers: the model's own greedy continuation with a few tokens changed, so both hits and misses occur
    examples = []
    for p, n in zip(prompts, (7, 9, 4)):
        seq = list(p)
        for _ in range(n):
            padded = seq + [0] * (17 - len(seq))  # one width, one compile; causal rows ignore the padding
            seq.append(int(_causal_argmax(params, tiny_config, [padded])[0, len(seq) - 1]))
        answer = seq[len(p):]
        answer[n // 2] = (answer[n // 2] + 1) % 250
        examples.append((p, answer))
    for slot in (1, 3, 4):
        scores = diagnose.teacher_forced(params, tiny_config, examples, slot, batch_size=2)
        seqs, where = [], []
        for k, (prompt, answer) in enumerate(examples):
            seqs.append(prompt + answer)
            for a in range(len(answer)):
                start = a // slot * slot
                seqs.append(prompt + answer[:start] + [tiny_config.mask_token_id] * min(slot, len(answer) - start))
                where.append((k, a, len(seqs) - 1, len(prompt) + a))
        pred = _causal_argmax(params, tiny_config, seqs)
        row = 0
        for k, ((prompt, answer), s) in enumerate(zip(examples, scores)):
            ar = pred[row, len(prompt) - 1:len(prompt) + len(answer) - 1] == np.asarray(answer)
            np.testing.assert_array_equal(s["ar"], ar)
            row += 1 + len(answer)
        for k, a, r, col in where:
            assert scores[k]["mdm"][a] == (pred[r, col] == examples[k][1][a])
        assert any(s["ar"].any() for s in scores) and not all(s["ar"].all() for s in scores)
        rows = diagnose.by_offset(scores, slot)
        assert [r["offset"] for r in rows] == list(range(slot))
        assert sum(r["n"] for r in rows) == sum(len(a) for _, a in examples)


def test_first_errors():
    eos = 9
    refs = [[1, 2, 3, eos], [1, 2, 3, eos], [4, 5, eos], [4, 5, 6, 7, eos]]
    outs = [[1, 2, 3, eos], [1, 2, 0, eos], [4, eos], [4, 5, 6]]
    assert [diagnose.first_error(o, r) for o, r in zip(outs, refs)] == [None, 2, 1, 3]
    e = diagnose.first_errors(outs, refs, slot_size=2, eos_id=eos)
    assert e["wrong"] == 3 and e["cut_short"] == 1
    assert e["by_slot_offset"] == {0: 1, 1: 2}
    assert e["by_distance_from_end"] == {-1: 3}
    text = diagnose.explain("mode B", 0.25, 0.75, e, [{"offset": 1, "n": 4, "ar": 1.0, "mdm": 0.5}])
    assert "50.0 points lost" in text and "offset 1" in text and "cut short" in text


def test_mode_a_first_errors_by_phase():
    eos = 9
    refs = [[1, 2, 3, eos], [1, 2, 3, eos], [4, 5, eos], [4, 5, 6, eos]]
    outs = [[1, 2, 3, eos], [1, 0, 3, eos], [4, 5, 0], [4, 5]]
    dif = [[0, 3], [1], [0], [2]]  # first errors at 1 (a diffusion token), 2 (sequential), 2 (cut short)
    assert diagnose.split_first_errors(outs, refs, dif) == {"diffusion": 1, "sequential": 1, "cut_short": 1}
    e = diagnose.first_errors(outs, refs, slot_size=1, eos_id=eos)
    e["by_phase"] = diagnose.split_first_errors(outs, refs, dif)
    heads = {"1": {"overall": {"n": 4, "ar": 1.0, "mdm": 0.75}, "by_offset": [{"offset": 0, "n": 4, "ar": 1.0,
                                                                              "mdm": 0.75}]}}
    text = diagnose.markdown({"explanations": [], "heads": heads, "first_errors": {"mdm": e}})
    assert "| 1 | 1 | 1 |" in text and "slot size 1): MDM head 75.0%" in text
