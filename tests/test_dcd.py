"""Discrete consistency distillation of the LoRA drafter (docs/algorithms.md §7.7): the loss against an explicit
per-block loop over the inference draft window, the teacher refresh schedule, and exact resume."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, PromptFormat
from zarya_jax.nn import kv_cache
from zarya_jax.objectives import dcd as dcd_lib
from zarya_jax.objectives import drafter as drafter_lib
from zarya_jax.testing import UNO_CONFIG as CFG, UNO_LORA as LORA
from zarya_jax.testing import uno_random_params as random_model
from zarya_jax.train.hooks import Hook


def _adapter(seed: int):
    ad = lora_lib.init_lora(CFG, LORA, jax.random.PRNGKey(seed))
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 100), 2 * len(lora_lib.PROJECTIONS)))
    return jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), ad)


def _softmax(x):
    x = np.asarray(x, np.float64).copy()
    x[..., CFG.mask_token_id] = -np.inf
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _kl(q, t):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nansum(np.where(q > 0, q * (np.log(q) - np.log(t)), 0.0), -1)


@pytest.mark.parametrize("divergence,passes", [("rkl", 3), ("tv", 2)])
def test_dcd_loss_matches_an_explicit_loop_over_draft_windows(divergence, passes):
    """Each block's teacher, rebuilt as the inference draft window against a cache of the clean prefix
    (`[seed, z…]`, then `[seed, argmax of the previous pass's rows 0 … S−2]`), one block and pass at a
    time; the loss and metrics from NumPy over those logits."""
    params, student, teacher = random_model(), _adapter(1), _adapter(2)
    s, n = 4, 12
    tokens = jnp.asarray(97 + (np.arange(n) * 3) % 26, jnp.int32)[None]
    batch = {"tokens": tokens, "segment_ids": jnp.ones((1, n), jnp.int32),
             "positions": jnp.arange(n, dtype=jnp.int32)[None], "answer_mask": jnp.ones((1, n), bool)}
    dcfg = drafter_lib.DrafterConfig(tv_weight=1.0, ce_weight=0.5)
    dcd = dcd_lib.DcdConfig(passes=passes, divergence=divergence, ar_weight=0.7)
    pair = drafter_lib.make_pair_batch(jax.random.PRNGKey(3), batch, s, CFG, LORA)
    loss, metrics = jax.jit(lambda a, t: dcd_lib.dcd_loss(a, t, params, CFG, LORA, pair, dcfg, dcd))(student, teacher)

    window = jax.jit(lambda ad, toks, start, cache: model_lib.apply(
        params, CFG, toks, start + jnp.arange(s)[None], cache=cache, gate=jnp.arange(s)[None] > 0,
        lora_params=ad, lora=LORA)[0])
    noise = np.asarray(pair["tokens"][0, :n])
    q_student, q_teacher = np.zeros((n, CFG.vocab_size)), np.zeros((n, CFG.vocab_size))
    for b in range(n // s):
        start = b * s
        cache = kv_cache.init(CFG, 1, 16)
        if start:
            _, kv = model_lib.apply(params, CFG, tokens[:, :start])
            cache = kv_cache.commit(cache, kv, jnp.ones((1, start), bool))
        first = [int(tokens[0, start])] + [int(z) for z in noise[start + 1:start + s]]
        q_student[start:start + s] = _softmax(window(student, jnp.asarray([first]), start, cache)[0])
        toks = first
        for _ in range(passes):
            logits = np.asarray(window(teacher, jnp.asarray([toks]), start, cache)[0], np.float64)
            logits[:, CFG.mask_token_id] = -np.inf
            toks = [first[0]] + [int(np.argmax(logits[j])) for j in range(s - 1)]
        q_teacher[start:start + s] = _softmax(logits)
    p = _softmax(model_lib.forward(params, CFG, tokens)[0])
    rows = (np.arange(n) % s != 0) & (np.arange(n) < n - 1)
    assert rows.sum() == 8 and np.array_equal(np.asarray(pair["rows"][0]), rows)
    div = (_kl(q_student, q_teacher) if divergence == "rkl" else np.abs(q_student - q_teacher).sum(-1))[rows].mean()
    tv = np.abs(q_student - p).sum(-1)[rows].mean()
    ce = -np.log(q_student[np.arange(n - 1), np.asarray(tokens[0, 1:])])[rows[:-1]].mean()
    teacher_accept = 1 - 0.5 * np.abs(q_teacher - p).sum(-1)[rows].mean()
    np.testing.assert_allclose([metrics["dcd"], metrics["tv"], metrics["ce"], metrics["teacher_accept_proxy"]],
                               [div, tv, ce, teacher_accept], rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(loss, div + 0.7 * (tv + 0.5 * ce), rtol=2e-4)
    # the teacher is a constant: no gradient reaches it
    g = jax.grad(lambda t: dcd_lib.dcd_loss(student, t, params, CFG, LORA, pair, dcfg, dcd)[0])(teacher)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g)) == 0.0


def test_bad_dcd_knobs_are_config_errors_naming_the_value():
    for kwargs, match in [({"passes": 1}, "dcd.passes=1"), ({"refresh_every": 0}, "dcd.refresh_every=0"),
                          ({"divergence": "fkl"}, "dcd.divergence='fkl'"), ({"ar_weight": -1.0}, "dcd.ar_weight=-1"),
                          ({"start": 1.0}, "dcd.start=1.0")]:
        with pytest.raises(ConfigError, match=match):
            dcd_lib.DcdConfig(**kwargs)
    with pytest.raises(ConfigError, match="objective='ddc'"):
        drafter_lib.DrafterConfig(objective="ddc")


# ------------------------------------------------------------------ the teacher in the train state
STEPS = 6


@pytest.fixture(scope="module")
def base_and_data(tmp_path_factory):
    from zarya_jax import checkpoint as ckpt_lib
    d = tmp_path_factory.mktemp("dcd")
    ckpt_lib.save(d / "base", random_model(), CFG)
    rng = np.random.default_rng(0)
    with open(d / "train.jsonl", "w") as f:
        for _ in range(16):
            k, a = int(rng.integers(1, 4)), int(rng.integers(0, 26))
            text = "".join(chr(97 + (a + k * i) % 26) for i in range(20))
            f.write(json.dumps({"prompt": text[:4], "answer": text[4:]}) + "\n")
    return d


def _config(data, start: float, *more: str):
    from zarya_jax.train import drafter as drafter_run
    return drafter_run.load_config("tiny", [
        "drafter.lora.rank=8", "drafter.lora.alpha=64", "drafter.objective.block_sizes=4",
        "drafter.objective.objective=dcd", "drafter.dcd.passes=2", "drafter.dcd.refresh_every=2",
        f"drafter.dcd.start={start}", f"data.train={data}", "data.max_length=24", "drafter.batch_size=4",
        "data.chat_template=false", f"drafter.steps={STEPS}", "train.save_every=3", "train.eval_every=0",
        "train.progress_bar=false", "train.async_checkpointing=false", "drafter.optim.warmup_steps=0",
        "drafter.optim.lr=0.01", "mesh.num_devices=2", *more])


class Record(Hook):
    """A hook that keeps (params, teacher) after every step and can stop the run after `stop_at`."""
    every, last = 1, True

    def __init__(self, stop_at: int | None = None):
        self.seen, self.stop_at = {}, stop_at

    def on_step(self, event):
        self.seen[event.step] = jax.device_get((event.state["params"], event.state["carry"]))
        if event.step == self.stop_at:
            raise KeyboardInterrupt("stopped by the test")


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_teacher_refreshes_every_round_and_survives_a_resume(base_and_data, tmp_path):
    from zarya_jax.train import drafter as drafter_run
    d = base_and_data
    # start=0.3 of 6 steps: DCD from step 2 on (steps 1-2 train with TV alone), teacher set at 2, 4, 6
    rec = Record()
    drafter_run.train_drafter(_config(d / "train.jsonl", 0.3), str(d / "base"), str(tmp_path / "a"), hooks=[rec])
    params, teacher = zip(*(rec.seen[k] for k in range(1, STEPS + 1)))
    owner = {1: None, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6}  # the step whose params the teacher holds
    for step, src in owner.items():
        if src is None:  # still the initial adapter (b = 0), not the updated params
            assert not any(np.asarray(v["b"]).any() for v in teacher[0]["layers"].values())
            assert not _equal(teacher[0], params[0])
        else:
            assert _equal(teacher[step - 1], params[src - 1]), step
    assert not _equal(params[2], params[1])  # training moves on between refreshes
    settings = json.loads((tmp_path / "a" / "drafter.json").read_text())
    assert settings["drafter"]["objective"] == "dcd" and settings["dcd"]["passes"] == 2

    # interrupted after step 3 (checkpoint 3 holds a teacher from step 2), then resumed: the same run
    with pytest.raises(KeyboardInterrupt):
        drafter_run.train_drafter(_config(d / "train.jsonl", 0.3), str(d / "base"), str(tmp_path / "b"),
                                  hooks=[Record(stop_at=3)])
    again = Record()
    summary = drafter_run.train_drafter(_config(d / "train.jsonl", 0.3), str(d / "base"), str(tmp_path / "b"),
                                        hooks=[again])
    assert summary["status"] == "completed" and min(again.seen) == 4
    for step in (4, 5, 6):
        assert _equal(again.seen[step], rec.seen[step]), step
    a, _ = lora_lib.load(tmp_path / "a" / "adapter")
    b, _ = lora_lib.load(tmp_path / "b" / "adapter")
    assert _equal(a, b)


def test_a_tv_run_continues_with_dcd_teacher_from_its_last_params(base_and_data, tmp_path):
    """A checkpoint without a teacher (objective=tv), resumed with --force as DCD: the teacher starts from the
    restored params, i.e. the TV run's adapter."""
    from zarya_jax.train import drafter as drafter_run
    d = base_and_data
    tv = _config(d / "train.jsonl", 0.5, "train.eval_every=3")  # the held-out loss, with and without a carry
    tv = dataclasses.replace(tv, drafter=dataclasses.replace(
        tv.drafter, objective=dataclasses.replace(tv.drafter.objective, objective="tv"), steps=3))
    drafter_run.train_drafter(tv, str(d / "base"), str(tmp_path / "run"))
    first, _ = lora_lib.load(tmp_path / "run" / "adapter")
    rec = Record()
    dcd = _config(d / "train.jsonl", 0.5, "train.eval_every=3")
    with pytest.raises(ConfigError, match="force"):
        drafter_run.train_drafter(dcd, str(d / "base"), str(tmp_path / "run"))
    summary = drafter_run.train_drafter(dcd, str(d / "base"), str(tmp_path / "run"), force=True, hooks=[rec])
    assert summary["eval_loss"] is not None and np.isfinite(summary["eval_loss"])
    assert summary["status"] == "completed" and min(rec.seen) == 4
    assert _equal(rec.seen[4][1], first)  # steps 4: teacher = the TV run's last params (refreshed at 5)
    assert _equal(rec.seen[5][1], rec.seen[5][0]) and not _equal(rec.seen[6][1], rec.seen[6][0])


def test_experiment_drafter_section_reaches_the_drafter_run():
    """`drafter.objective.objective`, `drafter.dcd.*` and `drafter.lora.layers` of an experiment config (a
    sweep's "with and without DCD", "LoRA on the top half") become the drafter run's sections."""
    import types

    from zarya_jax import overrides as ov
    from zarya_jax.experiment import config as exp_config
    from zarya_jax.experiment import stages
    cfg = exp_config.default_config()
    cfg = dataclasses.replace(cfg, drafter=ov.build(exp_config.TaskDrafterRun, {
        "objective": {"objective": "dcd"}, "dcd": {"passes": 3, "refresh_every": 7, "divergence": "tv"},
        "lora": {"layers": "top"}}, "drafter."))
    base = types.SimpleNamespace(tokenizer_spec="byte", prompt_format=PromptFormat())
    run = stages.drafter_config(cfg.drafter, cfg.trainer, base, "train.jsonl")
    assert run.drafter.objective.objective == "dcd" and run.drafter.lora.layers == "top"
    assert (run.drafter.dcd.passes, run.drafter.dcd.refresh_every, run.drafter.dcd.divergence) == (3, 7, "tv")
    with pytest.raises(ConfigError, match="drafter.dcd.passes=1|dcd.passes=1"):
        ov.build(exp_config.TaskDrafterRun, {"dcd": {"passes": 1}}, "drafter.")
