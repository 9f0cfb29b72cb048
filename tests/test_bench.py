"""`zarya_jax.bench.forward|generate` (and their command line, `python -m experiments.bench forward|generate`):
each side timed in a process of its own, the HF baseline at its best (generate and its own cached forward loop),
provenance in the results. Behaviour only, never a timing threshold."""
import json

import jax
import numpy as np
import pytest

from experiments.bench.__main__ import main as bench
from zarya_jax.bench import baseline, forward
from zarya_jax.bench import generate as gen_bench
from zarya_jax.bench.results import write_results
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.testing import random_hf_model

TINY = ["--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--repeats", "1", "--rounds", "1"]


def _read(out, name):
    with open(out / f"{name}.json") as f:
        return json.load(f)


def _provenance_ok(r):
    p = r["provenance"]
    assert set(p) >= {"commit", "dirty", "packages", "python", "platform", "devices"}
    assert p["packages"]["jax"] == jax.__version__


def test_generate_sides_in_their_own_processes_with_both_baselines(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "generate", *TINY, "--vocab", "64", "--batch-sizes", "2", "--max-new-tokens", "4",
            "--prompt-len", "4", "--modes", "ar", "--no-uncached", "--hf-threads", "1"]
    assert bench(argv) == 0, capsys.readouterr().err
    r = _read(tmp_path, "generate")
    _provenance_ok(r)
    assert r["timing"]["separate_processes"] and r["timing"]["rounds"] == 1
    (row,) = r["rows"]
    configs = row["hf_configs_s"]
    assert set(configs) == {f"{way}, {a}, 1 thread" for way in ("generate", "forward loop") for a in ("eager", "sdpa")}
    assert row["hf_baseline"] == min(configs, key=configs.get)  # the fastest configuration is the baseline
    n = row["new_tokens"]
    np.testing.assert_allclose(row["hf_tokens_per_s"], n / configs[row["hf_baseline"]])
    np.testing.assert_allclose(row["hf_generate_tokens_per_s"],
                               n / min(v for k, v in configs.items() if k.startswith("generate")))
    np.testing.assert_allclose(row["hf_loop_tokens_per_s"],
                               n / min(v for k, v in configs.items() if k.startswith("forward loop")))
    np.testing.assert_allclose(row["speedup_vs_hf"], row["hf_wall_s"] / row["wall_s"])
    assert row["greedy_match_hf"] == 1.0  # same weights, greedy: the JAX and HF processes agree token for token
    assert "forward loop" in capsys.readouterr().out


def test_hf_forward_loop_matches_generate_and_the_jax_sampler():
    """The baseline's own loop (prefill + one cached forward per token) decodes what HF `generate` and our AR
    sampler decode on the same weights."""
    import torch

    config = gen_bench.random_config(1, 32, 2, 1, 64)
    model, params = random_hf_model(config, 0, **gen_bench.INIT)
    (prompts,) = gen_bench.prompts(0, 64, 5, [3])
    ids = torch.tensor(prompts)
    loop = gen_bench.hf_loop(model, ids, 6, config).numpy()
    np.testing.assert_array_equal(loop, gen_bench.hf_generate(model, ids, 6, config).numpy())
    gc = GenerationConfig(mode="ar", max_new_tokens=6, temperature=0.0, stop_at_eos=False)
    out = generate(params, config, prompts, gc, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), loop)


def _hf_row(batch, times):
    return {"batch": batch, "runs": {k: {"tokens": [[1, 2]], "times": t} for k, t in times.items()}}


def test_baseline_is_the_fastest_and_a_slow_generate_is_named():
    jax_row = {"batch": 1, "tokens": [[1, 2]]}
    notes = []
    rounds = [_hf_row(1, {"generate, eager, 1 thread": [3.0, 5.0], "forward loop, eager, 1 thread": [1.0, 1.2]}),
              _hf_row(1, {"generate, eager, 1 thread": [4.0], "forward loop, eager, 1 thread": [0.8]})]
    out = gen_bench.baseline(jax_row, rounds, 0.5, notes)
    assert out["hf_baseline"] == "forward loop, eager, 1 thread"
    assert out["hf_wall_s"] == 1.0 and out["hf_min_s"] == 0.8  # median and min over every call of every round
    assert out["speedup_vs_hf"] == 2.0 and out["speedup_vs_hf_generate"] == 8.0
    assert len(notes) == 1 and "4× its own forward loop" in notes[0].replace(".0×", "×")
    notes = []
    rounds = [_hf_row(1, {"generate, sdpa, 2 threads": [1.0], "forward loop, sdpa, 2 threads": [0.9]})]
    assert gen_bench.baseline(jax_row, rounds, 0.5, notes)["hf_baseline"] == "forward loop, sdpa, 2 threads"
    assert notes == []  # generate within FAR of its parts: nothing to say


def test_alternate_runs_the_sides_in_turn():
    calls = []
    run_side = lambda module, side, kwargs: calls.append((module, side, kwargs)) or {"side": side}  # noqa: E731
    runs = baseline.alternate("m", {"jax": {}, "hf": {"x": 1}}, rounds=2, run_side=run_side)
    assert [side for _, side, _ in calls] == ["jax", "hf", "jax", "hf"] and calls[1] == ("m", "hf", {"x": 1})
    assert runs == {"jax": [{"side": "jax"}] * 2, "hf": [{"side": "hf"}] * 2}


def _in_process(sides):
    """A side runner calling the measuring function here instead of in a child process (the kwargs and the
    result through JSON, as a child's are)."""
    return lambda module, side, kwargs: json.loads(json.dumps(sides[side](**json.loads(json.dumps(kwargs)))))


def _no_child(module, side, kwargs):
    raise AssertionError(f"a child process for {module} --side {side}: none expected")


SMALL = dict(layers=1, hidden=32, heads=2, kv_heads=1, repeats=1, rounds=1, vocab=128, seq=8)


def test_forward_both_sides(tmp_path):
    s = forward.ForwardSettings(**SMALL, batch_sizes=(1,), hf_attention=("sdpa",), hf_threads=(1,))
    results, md = forward.run(s, run_side=_in_process(forward.SIDES))  # the real child is covered above
    write_results(str(tmp_path), "forward", results, md)
    r = _read(tmp_path, "forward")
    _provenance_ok(r)
    (row,) = r["rows"]
    assert row["hf_baseline"] == "forward, sdpa, 1 thread" and set(row["hf_configs_s"]) == {"sdpa, 1 thread"}
    assert r["timing"]["separate_processes"] and "| 1 | 8 |" in md
    assert row["max_abs_logit_diff"] < 1e-4
    np.testing.assert_allclose(row["speedup_vs_hf"], row["hf_s"] / row["jax_s"])


def test_forward_without_hf_runs_in_process():
    r = forward.measure(forward.ForwardSettings(**SMALL, batch_sizes=(1, 2), hf=False), run_side=_no_child)
    assert [row["batch"] for row in r["rows"]] == [1, 2] and "hf_s" not in r["rows"][0]
    assert not r["timing"]["separate_processes"] and r["config"]["hf_attention"] == []


def test_forward_without_hf_from_the_command_line(tmp_path):
    assert bench(["--out", str(tmp_path), "forward", *TINY, "--vocab", "128", "--seq", "8", "--batch-sizes", "1",
                  "--no-hf"]) == 0
    r = _read(tmp_path, "forward")
    _provenance_ok(r)
    assert [row["batch"] for row in r["rows"]] == [1] and not r["timing"]["separate_processes"]


@pytest.mark.parametrize("argv, message", [
    (["forward", "--hf-attention", "flash"], "--hf-attention='flash'"),
    (["forward", "--rounds", "0"], "--rounds=0"),
    (["generate", "--hf-attention", ""], "--hf-attention=''"),
])
def test_bad_baseline_options(tmp_path, capsys, argv, message):
    assert bench(["--out", str(tmp_path / "b"), *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("argv, message", [
    (["spec", "--modes", "ar"], "--modes='ar': expected a comma-separated subset of spec-lora,spec-self (ar: a "
                                "decoding mode bench spec does not time)"),
    (["spec", "--modes", "spec-typo"], "--modes='spec-typo': expected a comma-separated subset of spec-lora,spec-self"),
    (["spec", "--modes", ""], "--modes='': expected"),
    (["spec", "--ckpt", "{ckpt}", "--modes", "spec-self,spec-lora"],
     "with --ckpt, mode spec-lora (the LoRA drafter) needs --adapter"),
])
def test_spec_takes_the_mode_names(tmp_path, capsys, argv, message):
    (tmp_path / "ckpt").mkdir()
    argv = [a.replace("{ckpt}", str(tmp_path / "ckpt")) for a in argv]
    assert bench(["--out", str(tmp_path / "b"), *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
    assert not (tmp_path / "b").exists()


def test_spec_self_on_a_tiny_synthetic_model(tmp_path, capsys):
    """`bench spec --modes spec-self`: one row per (F, batch) with the mode's drafter, greedy output equal to AR's."""
    assert bench(["--out", str(tmp_path), "spec", "--modes", "spec-self", "--size", "tiny", "--pretrain-steps", "3",
                  "--train-length", "16", "--draft-lengths", "2", "--batch-sizes", "2", "--max-new-tokens", "4",
                  "--prompt-length", "4", "--repeats", "1"]) == 0, capsys.readouterr().err
    r = _read(tmp_path, "spec")
    _provenance_ok(r)
    (row,) = r["results"]
    assert (row["drafter"], row["draft_length"], row["draft_passes"], row["batch"]) == ("self", 2, 1, 2)
    assert row["identical_to_ar"] and "adapter" not in r["setup"]
    assert "| self | 2 | 1 | 2 |" in (tmp_path / "spec.md").read_text()
