"""The lm-evaluation-harness model `zarya` (`zarya_jax.eval.harness`): loglikelihoods against a direct NumPy
computation over the model's logits, generate_until against `generate()` in the same mode, and lm-eval's own
command line (`python -m experiments.lm_eval`) on a generation and a multiple-choice task over local JSONL
files, its accuracy checked against the direct loglikelihoods."""
import glob
import json
import os

import jax
import numpy as np
import pytest
from lm_eval.api.instance import Instance

from experiments import lm_eval as lm_eval_cli
from zarya_jax import checkpoint
from zarya_jax.config import PromptFormat
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.eval.harness import ZaryaLM
from zarya_jax.model import forward, init_params
from zarya_jax.sampling import GenerationConfig, generate, modes
from zarya_jax.testing import TINY

TEMPLATE = "Q: {prompt}\nA:"
TOK = ByteTokenizer()
GEN = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(5)]
MC = [{"question": f"Is {i} even?", "choices": [" yes", " no"], "label": i % 2} for i in range(6)]
TASKS = {"zarya_gen": ("gen", "output_type: generate_until\ndoc_to_target: '{{answer}}'\n"
                              "generation_kwargs: {until: ['\\n'], max_gen_toks: 8, do_sample: false}\n"
                              "metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]\n"),
         "zarya_mc": ("mc", "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
                            "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random tiny checkpoint (byte tokenizer, a prompt template recorded) and two task YAMLs over JSONL."""
    d = tmp_path_factory.mktemp("lm_eval")
    params = init_params(TINY, jax.random.PRNGKey(0))
    checkpoint.save(d / "ckpt", params, TINY, tokenizer=TOK, prompt_format=PromptFormat(prompt_template=TEMPLATE))
    (d / "tasks").mkdir()
    for task, (name, spec) in TASKS.items():
        rows = GEN if name == "gen" else MC
        (d / "tasks" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "tasks" / f"{name}.yaml").write_text(
            f"task: {task}\ndataset_path: json\ndataset_kwargs: {{data_files: {{test: {d / 'tasks' / name}.jsonl}}}}\n"
            f"test_split: test\ndoc_to_text: '{{{{question}}}}'\n" + spec)
    return {"dir": d, "ckpt": str(d / "ckpt"), "params": params}


def direct(params, context_ids: list[int], continuation_ids: list[int]) -> tuple[float, bool]:
    """log p(continuation | context) and greedy-ness from one forward, in float64 NumPy, mask token excluded
    (the row padded to 64 on the right, which a causal model does not see: one compile for every call)."""
    ids = np.asarray(context_ids + continuation_ids)
    padded = np.zeros(64, np.int32)
    padded[:len(ids) - 1] = ids[:-1]
    logits = np.asarray(forward(params, TINY, padded[None]))[0, :len(ids) - 1].astype(np.float64)
    logits[:, TINY.mask_token_id] = -np.inf
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    rows = np.arange(len(context_ids) - 1, len(ids) - 1)
    targets = ids[rows + 1]
    return float(logp[rows, targets].sum()), bool((logits[rows].argmax(-1) == targets).all())


def prompt(question: str) -> list[int]:
    return TOK.encode(TEMPLATE.format(prompt=question))


def test_loglikelihoods_match_a_direct_computation(setup):
    lm = ZaryaLM(ckpt=setup["ckpt"], batch_size=2)  # the command line test's shapes: compiled once
    pairs = [("Is 4 even?", " yes"), ("Is 4 even?", " no"), ("What is 12+30?", " 42, of course"), ("x", "y"),
             ("", " anything at all")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)])
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        want, want_greedy = direct(setup["params"], prompt(context), TOK.encode(continuation))
        assert logprob == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    with pytest.raises(ValueError, match="pass render=false"):  # lm-eval's chat template on top of ours: refused
        lm.apply_chat_template([{"role": "user", "content": "hi"}])
    text = "The rolling loglikelihood of a short text."  # one window: the text predicted from EOS
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolling == pytest.approx(direct(setup["params"], [TOK.eos_id], TOK.encode(text))[0], abs=1e-4)


@pytest.mark.parametrize("mode,knobs", [("slotted", {"slot_size": 4})])  # AR: the command line test's MC path
def test_generate_until_is_generate_in_the_mode(setup, mode, knobs):
    lm = ZaryaLM(ckpt=setup["ckpt"], mode=mode, batch_size=2, **knobs)
    kwargs = {"until": ["\n"], "max_gen_toks": 8, "do_sample": False}
    got = lm.generate_until([Instance("generate_until", {}, (r["question"], dict(kwargs)), i)
                             for i, r in enumerate(GEN[:3])])
    gc = GenerationConfig(mode=modes.mode(mode, **knobs), max_new_tokens=8, temperature=0.0)
    for r, text in zip(GEN[:3], got):
        assert text == decode(setup["params"], r["question"], gc).split("\n")[0]


def decode(params, question: str, gc) -> str:
    """The text `generate()` decodes for one question (in a batch of two copies, as the harness pads)."""
    out = generate(params, TINY, [prompt(question)] * 2, gc, jax.random.PRNGKey(0))
    return TOK.decode(np.asarray(out.tokens)[0, :int(out.lengths[0])].tolist())


def test_lm_eval_command_line_on_local_tasks(setup, tmp_path, capsys):
    out = tmp_path / "out"
    assert lm_eval_cli.main(["--model", "zarya", "--model_args", f"ckpt={setup['ckpt']},mode=slotted,slot_size=4",
                             "--tasks", "zarya_gen,zarya_mc", "--include_path", str(setup["dir"] / "tasks"),
                             "--batch_size", "2", "--output_path", str(out), "--log_samples"]) == 0
    (results_file,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    results = json.loads(open(results_file).read())["results"]
    want = np.mean([int(np.argmax([direct(setup["params"], prompt(r["question"]), TOK.encode(c))[0]
                                   for c in r["choices"]]) == r["label"]) for r in MC])
    assert results["zarya_mc"]["acc,none"] == pytest.approx(want)
    # generate_until: each logged response is `generate()` in mode B with the model_args knob, cut at the
    # task's `until`, and exact_match is their agreement with the targets
    (samples,) = glob.glob(os.path.join(os.path.dirname(results_file), "samples_zarya_gen_*.jsonl"))
    samples = [json.loads(line) for line in open(samples).read().splitlines()]
    assert sorted(s["doc"]["question"] for s in samples) == sorted(r["question"] for r in GEN)
    gc = GenerationConfig(mode=modes.mode("slotted", slot_size=4), max_new_tokens=8, temperature=0.0)
    texts = {s["doc"]["question"]: decode(setup["params"], s["doc"]["question"], gc).split("\n")[0] for s in samples}
    assert {s["doc"]["question"]: s["filtered_resps"][0] for s in samples} == texts
    assert results["zarya_gen"]["exact_match,none"] == pytest.approx(
        np.mean([texts[r["question"]] == r["answer"] for r in GEN]))

    capsys.readouterr()
    assert lm_eval_cli.main(["--model", "zarya", "--model_args", f"ckpt={setup['ckpt']},slot_sise=4",
                             "--tasks", "zarya_mc", "--include_path", str(setup["dir"] / "tasks")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: knob ar.slot_sise: mode 'ar' has no field 'slot_sise'")  # the default mode
