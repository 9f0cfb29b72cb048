"""The train-step losses project hidden states onto the vocabulary a block of positions at a time
(`objectives.losses.map_sequence_blocks`): the same loss and gradients as today's full-logits formula (kept
here as the reference), no [B, L, V] array in any train step's program, and Uno's drafter step's per-chip
memory independent of the global batch (the TPU compiler's buffer assignment)."""
import functools
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from test_slots import random_batch
from zarya_jax import model as model_lib
from zarya_jax.config import LoraConfig, ZaryaConfig
from zarya_jax import lora as lora_lib
from zarya_jax.objectives import ar as ar_lib
from zarya_jax.objectives import distill as distill_lib
from zarya_jax.objectives import drafter as drafter_lib
from zarya_jax.objectives import losses
from zarya_jax.objectives.reconstruction import reconstruction_rows
from zarya_jax.rl import grpo
from zarya_jax.sampling import primitives
from zarya_jax.testing import batch_of, synthetic_tokens

CHUNK = 5  # positions per block in these tests: several blocks per row, the last one padded
LORA = LoraConfig(rank=4, alpha=8.0)
DCFG = drafter_lib.DrafterConfig(tv_weight=1.0, ce_weight=0.5, kl_weight=0.25)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(losses, "SEQ_CHUNK", CHUNK)


def assert_trees_close(got, want, rtol=2e-4, atol=1e-6):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(1.0, float(np.abs(b).max())),
                                   err_msg=jax.tree_util.keystr(path))


def _avals(jaxpr):
    """Every intermediate of a jaxpr and of the jaxprs inside it (loops, remat, custom rules)."""
    for eqn in jaxpr.eqns:
        yield from (v.aval for v in eqn.outvars)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from _avals(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _avals(sub)


def assert_no_full_logits(fn, *args, vocab: int):
    """No array in fn's program (forward and backward) has more than a block of positions by the vocabulary."""
    big = [a.shape for a in _avals(jax.make_jaxpr(fn)(*args).jaxpr)
           if getattr(a, "ndim", 0) >= 3 and a.shape[-1] == vocab and a.shape[-2] > CHUNK]
    assert not big, big


def random_adapter(cfg, key):
    """An adapter whose `b` is not zero (a fresh one is the identity and would hide its gradient path)."""
    adapter = lora_lib.init_lora(cfg, LORA, key)
    leaves, tree = jax.tree.flatten(adapter)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(leaves))
    return jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


# ----------------------------------------------------------------------------- the reference: full logits
def reference_zarya_loss(params, cfg, zc, batch, key, slot_size):
    """`losses.zarya_loss` as it was: every part's [R, L, V] logits, then `token_cross_entropy`."""
    inputs = losses.transform(key, batch, zc, slot_size, losses.mask_id_of(cfg))
    logits = lambda rows, **att: model_lib.apply(params, cfg, rows["tokens"], rows["positions"], **att)[0]
    if zc.slotted_training or zc.sequential_convention == "ar":
        return losses.loss_from_logits(logits(inputs, segment_ids=inputs["segment_ids"]), inputs, zc, slot_size)
    dif = {k: v[1::2] for k, v in inputs.items() if k != "window_mask"}
    seq = {k: v[0::2] for k, v in inputs.items() if k != "window_mask"}
    rec = reconstruction_rows(seq, losses.mask_id_of(cfg))
    parts = [(dif, logits(dif, segment_ids=dif["segment_ids"])), (rec, logits(rec, window_mask=rec["window_mask"]))]
    if zc.sequential_convention == "both":
        parts.append((seq, logits(seq, segment_ids=seq["segment_ids"])))
    return losses.loss_from_flat([(rows, *losses.token_cross_entropy(z, rows["targets"])) for rows, z in parts], zc)


# ----------------------------------------------------------------------------- the tests
def test_head_token_cross_entropy_equals_full_logits(tiny_config, tiny_params):
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(3, 13, tiny_config.hidden_size)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, tiny_config.vocab_size, (3, 13)), jnp.int32)
    weights = jnp.asarray(rng.random((3, 13)), jnp.float32)

    def loss(params, h, blockwise):
        ce, hit = (losses.head_token_cross_entropy(params, tiny_config, h, targets) if blockwise
                   else losses.token_cross_entropy(model_lib.lm_head(params, tiny_config, h), targets))
        return jnp.sum(weights * ce), (ce, hit)

    (got, (ce, hit)), g = jax.value_and_grad(loss, (0, 1), has_aux=True)(tiny_params, hidden, True)
    (want, (ce_ref, hit_ref)), g_ref = jax.value_and_grad(loss, (0, 1), has_aux=True)(tiny_params, hidden, False)
    np.testing.assert_allclose(ce, ce_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(hit, hit_ref)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert_trees_close(g, g_ref)
    assert_no_full_logits(lambda p, h: jax.grad(loss, (0, 1), has_aux=True)(p, h, True), tiny_params, hidden,
                          vocab=tiny_config.vocab_size)


@pytest.mark.parametrize("zc", [ZaryaConfig(), ZaryaConfig(slotted_training=False, sequential_convention="both")],
                         ids=["slotted", "eso-both"])  # "both": the diffusion, reconstruction and AR parts
def test_zarya_loss_and_gradients_equal_full_logits(tiny_config, tiny_params, zc):
    batch = random_batch(3, rows=2, length=16)
    key = jax.random.PRNGKey(1)
    fns = [functools.partial(f, model_config=tiny_config, zarya_config=zc, batch=batch, key=key, slot_size=2)
           for f in (lambda params, **kw: losses.zarya_loss(params, kw["model_config"], kw["zarya_config"],
                                                            kw["batch"], kw["key"], kw["slot_size"]),
                     lambda params, **kw: reference_zarya_loss(params, kw["model_config"], kw["zarya_config"],
                                                               kw["batch"], kw["key"], kw["slot_size"]))]
    (loss, m), g = jax.jit(jax.value_and_grad(fns[0], has_aux=True))(tiny_params)
    (ref, m_ref), g_ref = jax.jit(jax.value_and_grad(fns[1], has_aux=True))(tiny_params)
    np.testing.assert_allclose(loss, ref, rtol=1e-5)
    assert_trees_close(m, m_ref, rtol=1e-5)
    assert_trees_close(g, g_ref)  # every param, the tied embedding included
    assert_no_full_logits(jax.grad(fns[0], has_aux=True), tiny_params, vocab=tiny_config.vocab_size)


@pytest.mark.parametrize("loss", ["zarya", "distill"])
def test_head_gradient_reduced_once_under_a_mesh(tiny_config, tiny_params, loss):
    """On a data × FSDP mesh the blockwise loss runs per device: the tied embedding is gathered once and its
    gradient reduce-scattered once after the block loop (never all-reduced inside it), with the loss and
    gradients of the unsharded computation — the Zarya loss, and the draft model's distillation loss,
    whose student head trains while its teacher's (gathered too) is a constant."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from zarya_jax.train import sharding as shd

    batch = random_batch(5, rows=8, length=16)
    if loss == "zarya":
        key = jax.random.PRNGKey(2)
        fn = jax.value_and_grad(lambda p, b: losses.zarya_loss(p, tiny_config, ZaryaConfig(), b, key, 2), has_aux=True)
        trained, gathers = tiny_params, 1
    else:
        student_cfg = tiny_config.replace(num_layers=1)
        cfg = distill_lib.DistillConfig(tv_weight=1.0, ce_weight=0.5, kl_weight=0.25)
        teacher = tiny_params
        fn = jax.value_and_grad(lambda s, b, t: distill_lib.distill_loss(s, t, student_cfg, tiny_config, b, cfg),
                                has_aux=True)
        trained, gathers = model_lib.init_params(student_cfg, jax.random.PRNGKey(4)), 2
    extra = () if loss == "zarya" else (teacher,)
    want = jax.jit(fn)(trained, batch, *extra)
    mesh = shd.make_mesh(shd.MeshConfig(data=2, fsdp=4, tensor=1), jax.devices()[:8])
    on_mesh = lambda tree: jax.device_put(tree, shd.tree_shardings(tree, mesh))
    args = (on_mesh(trained), jax.device_put(batch, NamedSharding(mesh, P(("data", "fsdp")))),
            *map(on_mesh, extra))

    def sharded(*a):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*a)

    lowered = jax.jit(sharded).lower(*args)
    assert_trees_close(lowered.compile()(*args), want)
    d, v = tiny_config.hidden_size, tiny_config.vocab_size
    ops = collectives(lowered.as_text())
    assert ops["all_gather"] == [f"{d // 4}x{v}"] * gathers and ops["reduce_scatter"] == [f"{d}x{v}"], ops
    assert not {f"{d}x{v}", f"{v}x{d}"} & set(ops["all_reduce"]), ops  # only the data axis' sum of a shard


def collectives(stablehlo: str) -> dict[str, list[str]]:
    """The operand shape ('64x264') of every all-reduce, reduce-scatter and all-gather of a lowered program."""
    return {kind: [re.search(r": \(tensor<([\dx]+)x\w+>\) ->", chunk).group(1)
                   for chunk in stablehlo.split(f'"stablehlo.{kind}"')[1:]]
            for kind in ("all_reduce", "reduce_scatter", "all_gather")}


def test_ar_objective_equals_full_logits(tiny_config, tiny_params):
    batch = batch_of(synthetic_tokens(np.random.default_rng(0), 2, 16))
    loss_fn = ar_lib.ar_objective(tiny_config).loss_fn

    def reference(params):
        targets, has = ar_lib.next_token_targets(batch)
        logits, _ = model_lib.apply(params, tiny_config, batch["tokens"], batch["positions"],
                                    segment_ids=batch["segment_ids"])
        ce, _ = losses.token_cross_entropy(logits, targets)
        return jnp.sum(jnp.where(has, ce, 0.0)) / jnp.maximum(jnp.sum(has), 1)

    new = lambda params: loss_fn(params, None, batch, None, None)[0]
    assert_trees_close(jax.value_and_grad(new)(tiny_params), jax.value_and_grad(reference)(tiny_params))
    assert_no_full_logits(jax.grad(new), tiny_params, vocab=tiny_config.vocab_size)


def test_drafter_loss_equals_full_logits(tiny_config, tiny_params):
    """Uno's drafter terms from hidden states = `drafter_terms` of the paired logits; gradients in the adapter and
    (through q's head) in the base params, the tied embedding included."""
    batch = batch_of(synthetic_tokens(np.random.default_rng(1), 2, 16))
    adapter = random_adapter(tiny_config, jax.random.PRNGKey(2))
    pair = drafter_lib.make_pair_batch(jax.random.PRNGKey(3), batch, 4, tiny_config, LORA)

    def new(lp, params):
        return drafter_lib.drafter_loss(lp, params, tiny_config, LORA, pair, DCFG)

    def reference(lp, params):
        logits = drafter_lib.pair_logits(lp, params, tiny_config, LORA, pair)
        return drafter_lib.drafter_terms(logits, pair, DCFG, tiny_config.mask_token_id)

    got = jax.jit(jax.value_and_grad(new, (0, 1), has_aux=True))(adapter, tiny_params)
    want = jax.jit(jax.value_and_grad(reference, (0, 1), has_aux=True))(adapter, tiny_params)
    assert_trees_close(got, want)
    assert_no_full_logits(jax.grad(new, (0, 1), has_aux=True), adapter, tiny_params, vocab=tiny_config.vocab_size)


def test_distill_loss_equals_full_logits(tiny_config, tiny_params):
    student_cfg = tiny_config.replace(num_layers=1)
    student = model_lib.init_params(student_cfg, jax.random.PRNGKey(4))
    batch = batch_of(synthetic_tokens(np.random.default_rng(2), 2, 16))
    cfg = distill_lib.DistillConfig(tv_weight=1.0, ce_weight=0.5, kl_weight=0.25)

    def reference(s):
        targets, rows = ar_lib.next_token_targets(batch)
        logits = lambda p, c: model_lib.apply(p, c, batch["tokens"], batch["positions"],
                                              segment_ids=batch["segment_ids"])[0]
        z = jnp.concatenate([logits(s, student_cfg), jax.lax.stop_gradient(logits(tiny_params, tiny_config))], 1)
        tv, ce, kl = losses.draft_row_losses(z, targets, student_cfg.mask_token_id)
        w = rows.astype(jnp.float32)
        return (cfg.tv_weight * tv + cfg.ce_weight * ce + cfg.kl_weight * kl).__mul__(w).sum() / w.sum()

    new = lambda s: distill_lib.distill_loss(s, tiny_params, student_cfg, tiny_config, batch, cfg)[0]
    assert_trees_close(jax.value_and_grad(new)(student), jax.value_and_grad(reference)(student))
    assert_no_full_logits(jax.grad(new), student, vocab=tiny_config.vocab_size)


def test_grpo_logprobs_equal_full_logits(tiny_config, tiny_params):
    rng = np.random.default_rng(5)
    n, w, g = 3, 20, 12
    lengths = np.asarray([4, 7, 6], np.int32)
    completions = rng.integers(0, 256, (n, g)).astype(np.int32)
    mask = np.arange(g)[None, :] < np.asarray([12, 9, 5])[:, None]
    tokens = rng.integers(0, 256, (n, w)).astype(np.int32)
    for i in range(n):
        tokens[i, lengths[i]:lengths[i] + g] = completions[i]
    batch = {"tokens": tokens, "prompt_lengths": lengths, "completions": completions, "mask": mask}

    def reference(params):
        valid = jnp.arange(w)[None, :] < (lengths + mask.sum(1))[:, None]
        logits, _ = model_lib.apply(params, tiny_config, jnp.asarray(tokens), segment_ids=valid.astype(jnp.int32))
        rows = jnp.minimum(lengths[:, None] - 1 + jnp.arange(g)[None, :], w - 1)
        picked = jnp.take_along_axis(logits, rows[..., None], axis=1)
        lp = primitives.token_logprob(picked, jnp.asarray(completions), 0.7, tiny_config.mask_token_id)
        return jnp.where(mask, lp, 0.0)

    new = lambda params: grpo.completion_logprobs(params, tiny_config, batch, temperature=0.7)
    np.testing.assert_allclose(new(tiny_params), reference(tiny_params), rtol=1e-5, atol=1e-5)
    total = lambda f: lambda params: jnp.sum(f(params) * jnp.linspace(0.5, 1.5, g))
    assert_trees_close(jax.grad(total(new))(tiny_params), jax.grad(total(reference))(tiny_params))
    assert_no_full_logits(jax.grad(total(new)), tiny_params, vocab=tiny_config.vocab_size)


def test_drafter_step_memory_per_chip_does_not_grow_with_the_global_batch():
    """Uno's drafter train step (`bench aot`'s construction: trainable = the adapter, frozen = the base, state
    donated) at one row per chip, compiled by the TPU compiler for 4 and for 16 v5e chips (FSDP over all):
    the per-chip total stays within 1.1× (each chip projects only its own rows onto the vocabulary), and
    the clean half's causal pass runs the fused kernel (splash) as the model step does."""
    from zarya_jax import target as target_lib
    from zarya_jax.train import sharding as shd
    from zarya_jax.bench.aot import kernel, train_lowered
    from zarya_jax.bench.train import model_config

    cfg = model_config("tiny", remat=True).replace(vocab_size=8192, mask_token_id=8191)  # logits dominate
    totals = []
    for topology in ("v5e:2x2", "v5e:4x4"):
        devices = target_lib.devices(f"tpu:{topology}")
        mesh = shd.make_mesh(shd.MeshConfig(data=1, fsdp=-1, tensor=1), devices)
        lowered = train_lowered("drafter", cfg, mesh, len(devices), 128, 0)
        assert kernel(lowered.as_text()) == "splash"
        totals.append(target_lib.memory(lowered.compile())["total"])
    # today's row loop held every row's [2L, V] logits on every chip: 4× the rows, ~4× the total
    assert totals[1] <= 1.1 * totals[0], totals
