"""Uno drafter training (docs/algorithms.md §7): curriculum, paired layout and block mask, TV loss, training."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, LoraConfig
from zarya_jax.nn import kv_cache, masks
from zarya_jax.objectives import drafter as drafter_lib
from zarya_jax.sampling import spec
from zarya_jax.testing import UNO_CONFIG as CFG, UNO_DRAFTER as DCFG, UNO_LORA as LORA, batch_of, synthetic_tokens
from zarya_jax.testing import uno_adapters as adapters, uno_trained_params as trained_model


def test_curriculum_grows_and_traced_matches():
    cfg = drafter_lib.DrafterConfig()
    sizes = [drafter_lib.block_size_at(s, 600, cfg) for s in range(601)]
    assert sorted(set(sizes)) == [2, 4, 6, 8, 12, 16] and sizes == sorted(sizes)
    assert sizes[0] == 2 and sizes[-1] == 16 and sizes.count(2) == 101  # equal shares of 100 steps
    traced = jax.jit(jax.vmap(lambda s: drafter_lib.block_size_traced(s, 600, cfg)))(jnp.arange(601))
    np.testing.assert_array_equal(np.asarray(traced), sizes)
    custom = drafter_lib.DrafterConfig(block_sizes=(2, 8), block_borders=(0.1, 1.0))
    assert [drafter_lib.block_size_at(s, 10, custom) for s in (0, 1, 2, 10)] == [2, 2, 8, 8]
    with pytest.raises(ConfigError, match="block_sizes"):
        drafter_lib.DrafterConfig(block_sizes=(1, 4))
    with pytest.raises(ConfigError, match="noise"):
        LoraConfig(noise="gauss")  # the noise convention belongs to the adapter


def _reference_mask(seg, pos, s):
    """Slow NumPy statement of docs/algorithms.md §7's attention, one query/key pair at a time."""
    b, n = seg.shape
    m = np.zeros((b, 2 * n, 2 * n), bool)
    for r in range(b):
        for i in range(2 * n):
            for k in range(2 * n):
                qi, ki = i % n, k % n
                same = seg[r, qi] == seg[r, ki] and seg[r, ki] > 0
                if i < n and k < n:  # noisy → noisy: same block, causal
                    ok = same and ki <= qi and pos[r, qi] // s == pos[r, ki] // s
                elif i < n:  # noisy → clean: clean tokens of earlier blocks
                    ok = same and pos[r, ki] < (pos[r, qi] // s) * s
                elif k >= n:  # clean → clean: causal
                    ok = same and ki <= qi
                else:  # clean never sees noisy
                    ok = False
                m[r, i, k] = ok or i == k
    return m


def test_pair_batch_layout_and_mask():
    # row 0: two packed examples (lengths 7 and 4) then padding; row 1: one example of 11
    seg = np.array([[1] * 7 + [2] * 4 + [0], [1] * 11 + [0]], np.int32)
    pos = np.array([list(range(7)) + list(range(4)) + [0], list(range(11)) + [0]], np.int32)
    tokens = np.where(seg > 0, 97 + np.arange(12)[None, :], 256).astype(np.int32)
    answer = (seg > 0) & (pos >= 2)
    batch = {"tokens": jnp.asarray(tokens), "segment_ids": jnp.asarray(seg), "positions": jnp.asarray(pos),
             "answer_mask": jnp.asarray(answer)}
    for s in (2, 3):
        pair = drafter_lib.make_pair_batch(jax.random.PRNGKey(0), batch, s, CFG, LORA)
        np.testing.assert_array_equal(np.asarray(pair["mask"]), _reference_mask(seg, pos, s))
        toks, gate = np.asarray(pair["tokens"]), np.asarray(pair["gate"])
        seed = pos % s == 0
        np.testing.assert_array_equal(toks[:, 12:], tokens)  # the clean copy
        np.testing.assert_array_equal(toks[:, :12][seed], tokens[seed])  # seeds keep their clean token
        assert not np.any(toks[:, :12] == CFG.mask_token_id)  # uniform noise never uses the mask id
        np.testing.assert_array_equal(gate[:, :12], ~seed & (seg > 0))
        assert not gate[:, 12:].any()
        np.testing.assert_array_equal(np.asarray(pair["positions"]), np.concatenate([pos, pos], 1))
        # supervised: non-seed rows whose next token is an answer token of the same example
        nxt_same = np.concatenate([seg[:, 1:] == seg[:, :-1], np.zeros((2, 1), bool)], 1) & (seg > 0)
        nxt_ans = np.concatenate([answer[:, 1:], np.zeros((2, 1), bool)], 1)
        np.testing.assert_array_equal(np.asarray(pair["rows"]), ~seed & nxt_same & nxt_ans)
    masked = drafter_lib.make_pair_batch(jax.random.PRNGKey(0), batch, 4, CFG, dataclasses.replace(LORA, noise="mask"))
    noisy = np.asarray(masked["tokens"])[:, :12]
    assert (noisy[~(pos % 4 == 0)] == CFG.mask_token_id).all()


def test_paired_rows_match_inference_and_loss_matches_numpy():
    """In one paired forward: clean rows = the AR model, seed rows = the AR model, each noisy block =
    the Ψ-Spec draft pass over the same seed and noise against a cache of the clean prefix; the TV/CE/KL
    terms equal a NumPy computation from those logits."""
    params = trained_model()
    _, lora_params, _ = adapters()
    s, n = 4, 12
    tokens = jnp.asarray(97 + (np.arange(n) * 2) % 26, jnp.int32)[None]
    batch = {"tokens": tokens, "segment_ids": jnp.ones((1, n), jnp.int32),
             "positions": jnp.arange(n, dtype=jnp.int32)[None], "answer_mask": jnp.ones((1, n), bool)}
    dcfg = drafter_lib.DrafterConfig(tv_weight=1.0, ce_weight=0.5, kl_weight=0.25)

    @jax.jit
    def run(lp):
        # block 1's noise replays what the Ψ-Spec draft pass below draws from its key
        z = spec.noise_tokens(jax.random.PRNGKey(0), (1, s), CFG.vocab_size, CFG.mask_token_id, LORA.noise)
        noise = jnp.zeros((1, n), jnp.int32).at[:, s:2 * s].set(z)
        pair = drafter_lib.make_pair_batch(jax.random.PRNGKey(3), batch, s, CFG, LORA, noise=noise)
        logits, _ = model_lib.apply(params, CFG, pair["tokens"], pair["positions"], window_mask=pair["mask"],
                                    gate=pair["gate"], lora_params=lp, lora=LORA)
        loss, metrics = drafter_lib.drafter_loss(lp, params, CFG, LORA, pair, dcfg)
        ar = model_lib.forward(params, CFG, tokens)
        # the draft pass of block 1 (seed at position 4) against a cache holding positions 0..3
        _, kv = model_lib.apply(params, CFG, tokens[:, :s])
        cache = kv_cache.commit(kv_cache.init(CFG, 1, 16), kv, jnp.ones((1, s), bool))
        draft, _ = spec.draft_pass(params, lp, cache, tokens[:, s], jnp.full((1,), s + 1), jax.random.PRNGKey(0),
                                   config=CFG, draft_length=s, drafter="lora", lora=LORA)
        return logits, loss, metrics, ar, draft, pair

    logits, loss, metrics, ar, draft, pair = jax.device_get(run(lora_params))
    np.testing.assert_allclose(logits[0, n:], ar[0], atol=2e-5)
    seed = np.arange(n) % s == 0
    np.testing.assert_allclose(logits[0, :n][seed], ar[0][seed], atol=2e-5)
    # the training block is the inference draft window: same tokens in, same logits out, every row
    np.testing.assert_allclose(logits[0, s:2 * s], draft[0], atol=2e-5)
    np.testing.assert_allclose(draft[0, 0], ar[0, s], atol=2e-5)

    def softmax(x):
        x = np.asarray(x, np.float64).copy()
        x[..., CFG.mask_token_id] = -np.inf
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    q, p = softmax(logits[0, :n]), softmax(logits[0, n:])
    rows = np.asarray(pair["rows"][0])
    assert rows.sum() == 8  # 12 tokens, 3 seeds, the last row has no next token
    tv = np.abs(q - p).sum(-1)[rows].mean()
    targets = np.asarray(tokens[0, 1:])
    ce = -np.log(q[np.arange(n - 1), targets])[rows[:-1]].mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.nansum(np.where(q > 0, q * (np.log(q) - np.log(p)), 0.0), -1)[rows].mean()
    np.testing.assert_allclose([metrics["tv"], metrics["ce"], metrics["kl"]], [tv, ce, kl], rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(loss, tv + 0.5 * ce + 0.25 * kl, rtol=2e-4)


def test_pair_logits_equal_one_forward_over_both_halves():
    """`pair_logits` runs the clean half once outside the gradient and the noisy half against its K/V: the
    same logits as one forward over the 2L rows under the pair mask, and the same gradient of the
    drafter loss (packed examples, padding, every block size of a curriculum)."""
    params = trained_model()
    _, lora_params, _ = adapters()
    seg = np.array([[1] * 7 + [2] * 4 + [0], [1] * 11 + [0]], np.int32)
    pos = np.array([list(range(7)) + list(range(4)) + [0], list(range(11)) + [0]], np.int32)
    tokens = np.where(seg > 0, 97 + (np.arange(12)[None, :] * 5) % 26, 256).astype(np.int32)
    batch = {"tokens": jnp.asarray(tokens), "segment_ids": jnp.asarray(seg), "positions": jnp.asarray(pos),
             "answer_mask": jnp.asarray((seg > 0) & (pos >= 2))}
    dcfg = drafter_lib.DrafterConfig(tv_weight=1.0, ce_weight=0.5, kl_weight=0.25)

    def one_forward(lp, pair):
        logits, _ = model_lib.apply(params, CFG, pair["tokens"], pair["positions"], window_mask=pair["mask"],
                                    gate=pair["gate"], lora_params=lp, lora=LORA)
        return logits

    @jax.jit
    def both(lp, s):
        pair = drafter_lib.make_pair_batch(jax.random.PRNGKey(s), batch, s, CFG, LORA)
        loss = lambda f: lambda p: drafter_lib.drafter_terms(f(p), pair, dcfg, CFG.mask_token_id)[0]
        split = lambda p: drafter_lib.pair_logits(p, params, CFG, LORA, pair)
        ref = lambda p: one_forward(p, pair)
        return split(lp), ref(lp), jax.grad(loss(split))(lp), jax.grad(loss(ref))(lp)

    valid = np.concatenate([seg, seg], 1) > 0  # padding rows: finite values nothing reads
    for s in (2, 3, 4):
        split, ref, g_split, g_ref = jax.device_get(both(lora_params, s))
        np.testing.assert_allclose(split[valid], ref[valid], atol=2e-5)
        for a, b in zip(jax.tree.leaves(g_split), jax.tree.leaves(g_ref)):
            np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4)


def test_agreement_counts_match_draft_passes():
    """Teacher-forced agreement by draft position (every block alignment) = a Ψ-Spec draft pass from
    every seed position against a cache of the text before it, compared with the AR argmax. Mask
    noise makes the drafts deterministic, so both sides see the same tokens."""
    params = trained_model()
    _, lora_params, _ = adapters()
    lora = dataclasses.replace(LORA, noise="mask")
    s, n = 4, 12
    tokens = jnp.asarray(97 + (np.arange(n) * 3) % 26, jnp.int32)[None]
    answer = np.arange(n) >= 3
    batch = {"tokens": tokens, "segment_ids": jnp.ones((1, n), jnp.int32),
             "positions": jnp.arange(n, dtype=jnp.int32)[None], "answer_mask": jnp.asarray(answer)[None]}
    agree, count = drafter_lib.agreement_counts(params, lora_params, batch, jax.random.PRNGKey(1), config=CFG,
                                                lora=lora, block_size=s)

    def best(x):
        return int(np.argmax(np.where(np.arange(x.shape[-1]) == CFG.mask_token_id, -np.inf, x)))

    ar = np.asarray(model_lib.forward(params, CFG, tokens))[0]
    ref_agree, ref_count = np.zeros(s, int), np.zeros(s, int)
    for t in range(n):  # seed at position t, committed text tokens[:t]
        cache = kv_cache.init(CFG, 1, 32)
        if t:
            _, kv = model_lib.apply(params, CFG, tokens[:, :t])
            cache = kv_cache.commit(cache, kv, jnp.ones((1, t), bool))
        draft, _ = spec.draft_pass(params, lora_params, cache, tokens[:, t], jnp.full((1,), t + 1),
                                   jax.random.PRNGKey(0), config=CFG, draft_length=s, drafter="lora", lora=lora)
        draft = np.asarray(draft)[0]
        for j in range(1, s):  # draft c_j predicts token t+j+1 from row t+j
            if t + j + 1 < n and answer[t + j + 1]:
                ref_count[j] += 1
                ref_agree[j] += best(draft[j]) == best(ar[t + j])
    np.testing.assert_array_equal(np.asarray(count), ref_count)
    np.testing.assert_array_equal(np.asarray(agree), ref_agree)
    assert ref_count[1:].min() > 0  # every draft position was compared


def test_training_lowers_heldout_tv():
    """TV on held-out synthetic text (fixed block size 4, fixed noise) drops after a little training."""
    params = trained_model()
    untrained, trained, losses = adapters()
    assert np.isfinite(losses).all()
    heldout = batch_of(synthetic_tokens(np.random.default_rng(123), 32, 24))

    @jax.jit
    def tv(lp):
        pair = drafter_lib.make_pair_batch(jax.random.PRNGKey(5), heldout, 4, CFG, LORA)
        return drafter_lib.drafter_loss(lp, params, CFG, LORA, pair, DCFG)[1]["tv"]

    before, after = float(tv(untrained)), float(tv(trained))
    assert after < 0.85 * before, (before, after)


def test_trainer_updates_only_the_adapter(tmp_path):
    """Through the shared training loop (`python -m experiments.train_drafter`): the base checkpoint is frozen, the
    trained state holds only the adapter, and it moves; the adapter is saved and reloads."""
    from experiments import train_drafter
    from zarya_jax import checkpoint as ckpt_lib
    from zarya_jax import lora as lora_lib

    params = trained_model()
    base = tmp_path / "base"
    ckpt_lib.save(base, params, CFG)
    data = tmp_path / "train.jsonl"
    rng = np.random.default_rng(0)
    with open(data, "w") as f:
        for _ in range(32):
            k, a = int(rng.integers(1, 4)), int(rng.integers(0, 26))
            text = "".join(chr(97 + (a + k * i) % 26) for i in range(24))
            f.write(json.dumps({"prompt": text[:4], "answer": text[4:]}) + "\n")
    work = tmp_path / "run"
    # the experiment's keys (`drafter.*`: the same section as the quickstart's and the sweeps')
    argv = ["--base", str(base), "--workdir", str(work), "--set", "drafter.lora.rank=4",
            "--set", "drafter.lora.alpha=8", "--set", "drafter.objective.block_sizes=2,4", "--set", f"data.train={data}", "--set", "data.max_length=32",
            "--set", "drafter.batch_size=8", "--set", "data.chat_template=false", "--set", "drafter.steps=4",
            "--set", "train.save_every=2", "--set", "train.eval_every=0", "--set", "train.progress_bar=false",
            "--set", "drafter.optim.warmup_steps=0", "--set", "drafter.optim.lr=0.01", "--set", "mesh.num_devices=2"]
    assert train_drafter.main(argv) == 0
    adapter, cfg = lora_lib.load(work / "adapter")
    assert cfg.rank == 4 and cfg.alpha == 8 and lora_lib.metadata(work / "adapter")["noise"] == "uniform"
    run = json.loads((work / "run_config.json").read_text())  # the section's steps, batch and optimizer ran
    assert (run["train"]["steps"], run["data"]["batch_size"], run["optim"]["lr"]) == (4, 8, 0.01)
    assert json.loads((work / "drafter.json").read_text())["drafter"]["block_sizes"] == [2, 4]
    moved = max(float(np.abs(np.asarray(v["b"])).max()) for v in adapter["layers"].values())
    assert moved > 0  # b starts at zero
    reloaded, _ = ckpt_lib.load(base)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), reloaded, params)
    # bad input: a clear error and status 2, nothing written
    assert train_drafter.main(["--base", str(tmp_path / "nope"), "--workdir", str(tmp_path / "w2")]) == 2
    assert not (tmp_path / "w2").exists()


@pytest.mark.parametrize("old,new", [("lora.rank=4", "drafter.lora.rank"), ("drafter.block_sizes=2,4",
                                                                         "drafter.objective.block_sizes"),
                                     ("drafter.objective=dcd", "drafter.objective.objective"),
                                     ("dcd.passes=3", "drafter.dcd.passes"), ("optim.lr=0.1", "drafter.optim.lr"),
                                     ("train.steps=2", "drafter.steps"), ("data.batch_size=2", "drafter.batch_size")])
def test_former_drafter_keys_name_their_new_place(tmp_path, capsys, tiny_config, tiny_params, old, new):
    """A key of the command line's former layout is refused (status 2, nothing written) naming the key it is now."""
    from experiments import train_drafter
    from zarya_jax import checkpoint as ckpt_lib

    base = tmp_path / "base"
    ckpt_lib.save(base, tiny_params, tiny_config)
    assert train_drafter.main(["--base", str(base), "--workdir", str(tmp_path / "w"), "--set", old]) == 2
    assert f"config key {old.split('=')[0]!r} has moved: it is now {new!r}" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_drafter_config_is_the_experiments_section_and_hashable():
    """The command line's `drafter` section is the experiment's (`DrafterRun`; the experiment's adds the task
    shift), both configs hash, and equal configs hash equal."""
    from zarya_jax import overrides as ov
    from zarya_jax.experiment.config import ExperimentConfig, default_config
    from zarya_jax.train import drafter as drafter_run

    sets = {"drafter.lora.rank": 4, "drafter.optim.lr": 0.01, "drafter.objective.ce_weight": 0.5}
    cfg = drafter_run.load_config("tiny", sets)
    exp = ov.apply(default_config(), sets)
    assert isinstance(exp.drafter, drafter_run.DrafterRun)
    assert ov.field_types(ExperimentConfig)["drafter"].__mro__[1] is drafter_run.DrafterRun
    assert (cfg.drafter.lora.rank, cfg.drafter.optim.lr, cfg.drafter.objective.ce_weight) == (4, 0.01, 0.5)
    assert (exp.drafter.lora.rank, exp.drafter.optim.lr, exp.drafter.objective.ce_weight) == (4, 0.01, 0.5)
    assert hash(cfg) == hash(drafter_run.load_config("tiny", sets))
    assert hash(exp) == hash(ov.apply(default_config(), sets))
    assert cfg != drafter_run.load_config("tiny", {**sets, "drafter.lora.rank": 8})
