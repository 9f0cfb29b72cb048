"""The GRPO trainer: one optimizer step on a fixed batch against a NumPy loss with log-probabilities from
independent full forwards, exact resume after an interruption mid-step (the refreshed drafter's
state included), and each arm as a seconds-long run of `python -m experiments.rl` in process."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import rl as rl_cli
from test_rl_grpo import numpy_loss
from zarya_jax import checkpoint
from zarya_jax.config import LoraConfig
from zarya_jax.data.tokenizer import ByteTokenizer
from zarya_jax.eval import answers, tasks
from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.rl import config as rl_config
from zarya_jax.experiment import rl_demo as demo
from zarya_jax.rl import grpo, rollout, trainer
from zarya_jax.rl.plots import rl_plot
from zarya_jax.train import sharding as shd
from zarya_jax.train.optim import OptimConfig
from zarya_jax.train.step import build_optimizer, init_state, make_train_step


def digit_reward(record: dict, completion: str) -> float:
    """A reward a random model earns sometimes (so the advantages, and the updates, are not zero)."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, tiny_config, tiny_params):
    root = tmp_path_factory.mktemp("rl")
    lora = LoraConfig(rank=4, alpha=8.0)
    paths = {"root": str(root),
             "ckpt": checkpoint.save(root / "ckpt", tiny_params, tiny_config, tokenizer=ByteTokenizer()),
             "adapter": str(lora_lib.save(root / "adapter", lora_lib.init_lora(tiny_config, lora,
                                                                                jax.random.PRNGKey(1)), lora).parent),
             "train": str(root / "train.jsonl"), "eval": str(root / "eval.jsonl")}
    tasks.write_jsonl(paths["train"], tasks.generate(8, seed=0, difficulty=1))
    tasks.write_jsonl(paths["eval"], tasks.generate(4, seed=1, difficulty=1))
    return paths


def small(s, *extra):
    return ["--set", f"data.train={s['train']}", "--set", "rl.max_new_tokens=8", "--set", "rl.prompts_per_step=2",
            "--set", "rl.num_generations=2", "--set", "train.progress_bar=false", "--set", "optim.lr=1e-3",
            "--set", "rl.reward=test_rl_trainer.digit_reward", "--set", "mesh.num_devices=2", *extra]


# --------------------------------------------------------------------------- one step vs NumPy
def test_one_grpo_step_matches_numpy(tiny_config, tiny_params):
    """The trainer's sharded step on a fixed batch: its loss equals the NumPy loss of log-probabilities
    from one full forward per row, its gradient (norm and AdamW's first update, −lr·g/(|g| + eps)) the
    chain rule of NumPy's d loss / d log π through those forwards."""
    cfg, params = tiny_config, tiny_params
    rng = np.random.default_rng(0)
    n, g, lengths = 4, 5, [3, 6, 4, 2]
    comp = rng.integers(0, 250, (n, g)).astype(np.int32)
    counts = np.array([5, 2, 4, 3])
    mask = np.arange(g)[None] < counts[:, None]
    width = max(lengths) + g
    tokens = np.full((n, width), cfg.pad_token_id, np.int32)
    for i in range(n):
        tokens[i, :lengths[i]] = rng.integers(0, 250, lengths[i])
        tokens[i, lengths[i]:lengths[i] + counts[i]] = comp[i, :counts[i]]

    def independent_logprobs(p):  # one causal forward per row over prompt + completion, mask token banned
        rows = []
        for i in range(n):
            seq = jnp.asarray(tokens[i, :lengths[i] + counts[i]])[None]
            logits = model_lib.forward(p, cfg, seq)[0].at[:, cfg.mask_token_id].set(-jnp.inf)
            lp = jax.nn.log_softmax(logits, -1)
            picked = [lp[lengths[i] - 1 + t, comp[i, t]] if t < counts[i] else 0.0 for t in range(g)]
            rows.append(jnp.stack([jnp.asarray(x, jnp.float32) for x in picked]))
        return jnp.stack(rows)

    lp = np.asarray(independent_logprobs(params), np.float64)
    old = np.where(mask, lp + rng.normal(0, 0.3, (n, g)), 0)
    ref = np.where(mask, lp + rng.normal(0, 0.3, (n, g)), 0)
    adv = rng.normal(0, 1, n)
    eps, beta, lr, mode = 0.2, 0.1, 1e-3, "sequence-mean-token-mean"
    want_loss, dlp = numpy_loss(lp, old, ref, adv, mask, eps, beta, mode)
    want_grad = jax.grad(lambda p: jnp.sum(independent_logprobs(p) * jnp.asarray(dlp, jnp.float32)))(params)

    gcfg = grpo.GRPOConfig(num_generations=2, beta=beta, epsilon=eps, loss_agg_mode=mode)
    optim = OptimConfig(lr=lr, warmup_steps=0, schedule="constant", weight_decay=0.0, clip_norm=0.0)
    optimizer, _ = build_optimizer(optim, 1, params)
    mesh = shd.make_mesh(shd.MeshConfig(num_devices=1))
    step = jax.jit(lambda st, b: make_train_step(trainer.grpo_objective(cfg, gcfg, 1.0), optimizer, optim, 1,
                                                 mesh)(st, None, b, None))
    batch = {"tokens": tokens, "prompt_lengths": np.asarray(lengths, np.int32)[:, None],
             "completions": comp, "mask": mask, "old_logprobs": old.astype(np.float32),
             "advantages": adv.astype(np.float32)[:, None], "ref_logprobs": ref.astype(np.float32)}
    state = init_state(params, optimizer, jax.random.PRNGKey(0))
    new, metrics = step(state, {k: jnp.asarray(v) for k, v in batch.items()})
    assert int(metrics["bad_step"]) == -1 and int(new["step"]) == 1
    np.testing.assert_allclose(float(metrics["loss"]), want_loss, rtol=1e-4, atol=1e-6)
    flat_g = np.concatenate([np.ravel(x) for x in jax.tree.leaves(want_grad)])
    np.testing.assert_allclose(float(metrics["grad_norm"]), np.linalg.norm(flat_g), rtol=1e-3)
    for p0, p1, gr in zip(jax.tree.leaves(params), jax.tree.leaves(new["params"]), jax.tree.leaves(want_grad)):
        gr = np.asarray(gr, np.float64)
        big = np.abs(gr) > 1e-5  # away from 0, where AdamW's first step is −lr·sign(g)
        moved = (np.asarray(p1, np.float64) - np.asarray(p0, np.float64))
        np.testing.assert_allclose(moved[big], -lr * gr[big] / (np.abs(gr[big]) + optim.eps), rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("mode", grpo.LOSS_AGG_MODES)
def test_gradient_accumulation_does_not_change_the_loss_or_the_gradient(tiny_config, tiny_params, mode):
    """One step of the trainer's objective on six rollouts of 1–6 completion tokens, in one batch and in
    three micro-batches (rows 0,3 | 1,4 | 2,5): the same loss (the float64 reference's), gradient, KL, ratio
    and clip fraction. The gradient is read from AdamW's first update with eps ≫ |g| (−lr·g/(|g| + eps))."""
    cfg, params = tiny_config, tiny_params
    rng = np.random.default_rng(1)
    n, g = 6, 6
    lengths, counts = rng.integers(2, 6, n), np.array([6, 1, 3, 5, 2, 4])
    mask = np.arange(g)[None] < counts[:, None]
    comp = rng.integers(0, 250, (n, g)).astype(np.int32)
    tokens = np.full((n, lengths.max() + g), cfg.pad_token_id, np.int32)
    for i in range(n):
        tokens[i, :lengths[i]] = rng.integers(0, 250, lengths[i])
        tokens[i, lengths[i]:lengths[i] + counts[i]] = comp[i, :counts[i]]
    rows = {"tokens": tokens, "prompt_lengths": lengths.astype(np.int32), "completions": comp, "mask": mask}
    lp = np.asarray(grpo.completion_logprobs(params, cfg, rows), np.float64)
    old = np.where(mask, lp + rng.normal(0, 0.3, (n, g)), 0)
    ref = np.where(mask, lp + rng.normal(0, 0.3, (n, g)), 0)
    adv = rng.normal(0, 1, n)
    batch = {**rows, "prompt_lengths": rows["prompt_lengths"][:, None], "old_logprobs": old.astype(np.float32),
             "ref_logprobs": ref.astype(np.float32), "advantages": adv.astype(np.float32)[:, None],
             "mean_tokens": np.full((n, 1), mask.sum() / n, np.float32)}
    gcfg = grpo.GRPOConfig(num_generations=2, beta=0.1, epsilon=0.2, loss_agg_mode=mode)
    mesh = shd.make_mesh(shd.MeshConfig(num_devices=1))
    out = {}
    for accum in (1, 3):
        optim = OptimConfig(lr=1.0, warmup_steps=0, schedule="constant", weight_decay=0.0, clip_norm=0.0, eps=1e3,
                            grad_accum_steps=accum)
        optimizer, _ = build_optimizer(optim, 1, params)
        step = jax.jit(lambda st, b: make_train_step(trainer.grpo_objective(cfg, gcfg, 1.0), optimizer, optim, 1,
                                                     mesh)(st, None, b, None))
        new, metrics = step(init_state(params, optimizer, jax.random.PRNGKey(0)),
                            {k: jnp.asarray(v) for k, v in batch.items()})
        moved = [np.asarray(b, np.float64) - np.asarray(a, np.float64)
                 for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new["params"]))]
        out[accum] = ({k: float(v) for k, v in metrics.items()}, moved)
    (m1, u1), (m3, u3) = out[1], out[3]
    want = numpy_loss(lp, old, ref, adv, mask, 0.2, 0.1, mode)[0]
    for m in (m1, m3):
        np.testing.assert_allclose(m["loss"], want, rtol=1e-4, atol=1e-6)
    for key in ("loss", "grad_norm", "kl", "ratio", "clip_fraction"):
        np.testing.assert_allclose(m3[key], m1[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert m1["grad_norm"] > 1e-3 and m1["clip_fraction"] > 0
    for a, b, p0 in zip(u1, u3, jax.tree.leaves(params)):  # to the rounding of the float32 params they moved
        ulp = np.spacing(np.abs(np.asarray(p0, np.float32)) + np.abs(a).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(b - a) <= 1e-4 * np.abs(a) + 4 * ulp)


def test_num_iterations_updates_in_one_step(tiny_config, tiny_params):
    """`rl.num_iterations` = 2 is one step of the loop holding two optimizer updates on the same rollouts:
    the params, Adam moments and metrics of two single-update steps, with the step counted once."""
    cfg, params = tiny_config, tiny_params
    rng = np.random.default_rng(2)
    n, g, width = 4, 4, 10
    mask = np.arange(g)[None] < np.array([4, 2, 3, 1])[:, None]
    tokens = rng.integers(0, 250, (n, width)).astype(np.int32)
    batch = {"tokens": tokens, "prompt_lengths": np.full((n, 1), 5, np.int32), "completions": tokens[:, 5:9],
             "mask": mask, "old_logprobs": np.where(mask, -5.5, 0).astype(np.float32),
             "ref_logprobs": np.where(mask, -5.4, 0).astype(np.float32),
             "advantages": rng.normal(0, 1, (n, 1)).astype(np.float32)}
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    objective = trainer.grpo_objective(cfg, grpo.GRPOConfig(num_generations=2), 1.0)
    optim = OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.0)
    mesh = shd.make_mesh(shd.MeshConfig(num_devices=1))
    results = {}
    for updates, calls in ((1, 2), (2, 1)):
        optimizer, _ = build_optimizer(optim, 2, params)
        step = jax.jit(lambda st, b: make_train_step(objective, optimizer, optim, 2 // updates, mesh,
                                                     updates=updates)(st, None, b, None))
        state = init_state(params, optimizer, jax.random.PRNGKey(0))
        for _ in range(calls):
            state, metrics = step(state, batch)
        results[updates] = (state, {k: float(v) for k, v in metrics.items()})
    (one, m1), (two, m2) = results[1], results[2]
    assert int(one["step"]) == 2 and int(two["step"]) == 1 and m2["bad_step"] == -1
    for a, b in zip(jax.tree.leaves((one["params"], one["opt_state"])), jax.tree.leaves((two["params"],
                                                                                          two["opt_state"]))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
    for key in ("loss", "grad_norm", "ratio", "kl"):
        np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, err_msg=key)


# --------------------------------------------------------------------------- resume
TIMING = ("rollout_s", "update_s", "tokens_per_s", "mfu", "step_time_s")


def _rows(workdir, timing=TIMING):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in f]


def test_resume_after_interruption_is_bit_exact(scratch, monkeypatch):
    """Killed mid-step (after its rollouts, before its update) and rerun: the same params, drafter and
    metrics as one uninterrupted run, bit for bit."""
    argv = ["--base", scratch["ckpt"], "--arm", "refreshed", "--adapter", scratch["adapter"],
            *small(scratch, "--set", "train.steps=4", "--set", "train.save_every=2", "--set", "rl.refresh_every=1",
                   "--set", "rl.refresh_steps=1", "--set", f"data.eval={scratch['eval']}", "--set",
                   "data.eval_size=2", "--set", "train.eval_every=2")]
    whole, parts = os.path.join(scratch["root"], "whole"), os.path.join(scratch["root"], "parts")
    assert rl_cli.main(["--workdir", whole, *argv]) == 0

    real, calls = rollout.sample, []

    def dies_at_the_third_step(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return out

    monkeypatch.setattr(rollout, "sample", dies_at_the_third_step)
    assert rl_cli.main(["--workdir", parts, *argv]) == 130
    monkeypatch.setattr(rollout, "sample", real)
    assert not os.path.exists(os.path.join(parts, "final"))
    assert rl_cli.main(["--workdir", parts, *argv]) == 0
    for name in ("final", "adapter"):
        a = {k: v for k, v in checkpoint.load(os.path.join(whole, "final"))[0].items()} if name == "final" else \
            lora_lib.load(os.path.join(whole, name))[0]
        b = {k: v for k, v in checkpoint.load(os.path.join(parts, "final"))[0].items()} if name == "final" else \
            lora_lib.load(os.path.join(parts, name))[0]
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert _rows(whole) == _rows(parts)
    rows = _rows(whole)
    assert any(r.get("grad_norm", 0) > 0 for r in rows) and any("drafter_tv" in r for r in rows)
    assert [r["step"] for r in rows if "eval_exact_match" in r] == [0, 2, 4]
    # the demo's report of that arm: its row, table and plot
    summary = json.load(open(os.path.join(whole, "summary.json")))
    row = demo.arm_result("refreshed", whole, summary)
    assert row["curves"]["exact_match"] == [(r["step"], r["eval_exact_match"]) for r in rows if "eval_exact_match" in r]
    assert row["accepted_start"] == rows[1]["accepted_per_cycle"] and len(row["curves"]["accepted_per_cycle"]) == 4
    assert "| refreshed |" in demo.report_markdown({"arms": [row]})
    rl_plot([row], os.path.join(scratch["root"], "report.png"))
    assert os.path.getsize(os.path.join(scratch["root"], "report.png")) > 0
    base = checkpoint.load(scratch["ckpt"])[0]
    assert any(not np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(base), jax.tree.leaves(checkpoint.load(os.path.join(whole, "final"))[0])))


# --------------------------------------------------------------------------- each arm
@pytest.mark.parametrize("arm", ["ar", "self", "frozen"])
def test_each_arm_smoke(scratch, arm, capsys):
    workdir = os.path.join(scratch["root"], f"arm-{arm}")
    adapter = ["--adapter", scratch["adapter"]] if arm == "frozen" else []
    argv = ["--base", scratch["ckpt"], "--workdir", workdir, "--arm", arm, *adapter,
            *small(scratch, "--set", "train.steps=2", "--set",
                   f"rl.draft_when_active_below={0.75 if arm == 'frozen' else 1.0}")]
    assert rl_cli.main(argv) == 0
    rows = _rows(workdir, timing=())
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout_s"] > 0 and 0 < r["active_rows"] <= 1 and np.isfinite(r["loss"])
        assert abs(r["ratio"] - 1.0) < 1e-3  # π_old = the sampler's log-probabilities = the policy's
        if arm == "ar":
            assert r["tokens_per_forward"] <= 1.0 and "accepted_per_cycle" not in r
        elif r["draft_cycles"] or arm == "self":  # the self arm drafts every cycle
            assert r["accepted_per_cycle"] >= 1.0 and r["acceptance_pos0"] == 1.0
        else:  # every row ran to the budget: all cycles were AR passes
            assert "accepted_per_cycle" not in r and r["tokens_per_forward"] <= 1.0
    summary = json.loads(open(os.path.join(workdir, "summary.json")).read())
    assert summary["status"] == "completed" and summary["step"] == 2 and os.path.isdir(summary["final_params"])
    # a rerun of a finished run does nothing and keeps its outputs; another run there is refused
    assert rl_cli.main(argv) == 0 and len(_rows(workdir)) == 2
    capsys.readouterr()
    assert rl_cli.main(argv + ["--set", "rl.beta=0.5"]) == 2
    assert "rl.beta" in capsys.readouterr().err


def test_refresh_accumulation_that_does_not_split_the_rollouts_is_refused_up_front(scratch, capsys):
    """4 rollout rows on 2 data-parallel devices cannot be split 3 ways by the drafter's refresh either:
    refused before any compute, naming the refresh's own key."""
    workdir = os.path.join(scratch["root"], "bad-refresh-accum")
    argv = ["--base", scratch["ckpt"], "--workdir", workdir, "--arm", "refreshed", "--adapter", scratch["adapter"],
            *small(scratch, "--set", "rl.refresh_optim.grad_accum_steps=3")]
    assert rl_cli.main(argv) == 2
    assert "rl.refresh_optim.grad_accum_steps=3" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(workdir, "metrics.jsonl"))


def test_config_refuses_off_policy_modes_and_tiny_groups():
    with pytest.raises(ValueError, match="not on-policy"):
        rl_config.build(["rl.arm=slotted"])
    with pytest.raises(ValueError, match="num_generations=1"):
        rl_config.build(["rl.num_generations=1"])
    with pytest.raises(ValueError, match="does not import"):
        rl_config.load_reward("no_such_module.reward")
    with pytest.raises(ValueError, match="rl.top_k=3: GRPO scores every rollout token under the full softmax"):
        rl_config.build(["rl.top_k=3"])  # the loss would score another distribution than the rollouts sample
    with pytest.raises(ValueError, match="train.init_from='x': not read by RL"):
        rl_config.build(["train.init_from=x"])
    with pytest.raises(ValueError, match="proposal"):
        rl_config.build(["rl.arm=self", "rl.proposal=beam"])
    mode = rl_config.build(["rl.arm=frozen", "rl.proposal=argmax"]).rl.generation_config().mode
    assert (mode.name, mode.proposal) == ("spec-lora", "argmax")  # the drafts' proposal reaches the sampler
    cfg = rl_config.build(["rl.refresh_optim.lr=3e-4", "optim.lr=2e-5", "train.divergence.zero_grad_steps=3"])
    assert (cfg.rl.refresh_optim.lr, cfg.optim.lr, cfg.train.divergence.zero_grad_steps) == (3e-4, 2e-5, 3)
    # what a resumed run may change: the shared loop's list (one definition) and data.eval_size
    resumed = ["train.save_every=1", "train.divergence.zero_grad_steps=0", "mesh.num_devices=1", "data.eval_size=3"]
    assert rl_config.diff(cfg, rl_config.build(["rl.refresh_optim.lr=3e-4", "optim.lr=2e-5", *resumed])) == []
    assert rl_config.diff(cfg, rl_config.build(["rl.refresh_optim.lr=1e-4", "optim.lr=2e-5"]))[0].startswith(
        "rl.refresh_optim:")


def test_unmark_restates_a_fraction_of_the_final_answers():
    records = tasks.generate(400, seed=3)
    out = demo.unmark(records, 0.5, seed=0)
    assert out == demo.unmark(records, 0.5, seed=0) and [r["prompt"] for r in out] == [r["prompt"] for r in records]
    unmarked = [o for o, r in zip(out, records) if o != r]
    assert 150 < len(unmarked) < 250
    for o, r in zip(out, records):
        value = r["answer"].rsplit("#### ", 1)[1]
        if o != r:  # the worked lines kept, the value stated without the marker the extraction reads
            assert o["answer"] == r["answer"].rsplit("#### ", 1)[0] + f"so {value}"
            assert answers.extract(o["answer"]) is None and answers.extract(r["answer"]) == value
    assert demo.unmark(records, 0.0) == records
    assert all("####" not in r["answer"] for r in demo.unmark(records, 1.0))
    with pytest.raises(ValueError, match="1.5"):
        demo.unmark(records, 1.5)


def test_demo_smoke_trains_its_base_on_the_unmarked_split(tmp_path, capsys):
    """`--demo --smoke` end to end for one arm: the SFT file is the training split unmarked, the RL prompts
    and references are the marked split, the report records the fraction."""
    workdir = str(tmp_path / "demo")
    assert rl_cli.main(["--demo", "--smoke", "--arms", "ar", "--workdir", workdir, "--unmarked", "1.0"]) == 0
    train = tasks.read_jsonl(os.path.join(workdir, "data", "train.jsonl"))
    sft = tasks.read_jsonl(os.path.join(workdir, "data", "sft_train.jsonl"))
    assert [r["prompt"] for r in sft] == [r["prompt"] for r in train]
    assert all("####" in r["answer"] for r in train) and not any("####" in r["answer"] for r in sft)
    with open(os.path.join(workdir, "train", "run_config.json")) as f:
        assert "sft_train.jsonl" in json.dumps(json.load(f))
    with open(os.path.join(workdir, "arms", "ar", "rl_run.json")) as f:
        assert os.path.join("data", "train.jsonl") in json.dumps(json.load(f))
    with open(os.path.join(workdir, "report.json")) as f:
        assert json.load(f)["config"]["unmarked"] == 1.0
    assert "| ar |" in capsys.readouterr().out
