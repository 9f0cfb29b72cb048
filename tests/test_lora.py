"""Gated-LoRA adapter params (docs/algorithms.md §7): structure, gate semantics (a poisoned adapter cannot touch gate-off
rows), save/load with the checks a checkpoint gets, merge."""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.config import ConfigError, LoraConfig
from zarya_jax.nn.integrity import array_checksums

LORA = LoraConfig(rank=4, alpha=32.0)


@pytest.fixture(scope="module")
def adapter(tiny_config):
    """A non-trivial adapter (b ≠ 0), so the gate visibly changes the output."""
    return perturbed(lora_lib.init_lora(tiny_config, LORA, jax.random.PRNGKey(1)), jax.random.PRNGKey(2))


@jax.jit
def perturbed(tree, key):
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def test_init_matches_model_collection(tiny_config):
    """init_lora builds exactly the tree the model's 'lora' collection declares; b starts at zero."""
    lp = lora_lib.init_lora(tiny_config, LORA, jax.random.PRNGKey(0))
    _, ref = jax.eval_shape(lambda k: model_lib.init_params(tiny_config, k, lora=LORA), jax.random.PRNGKey(0))
    shapes = jax.tree.map(lambda x: x.shape, lp)
    assert shapes == jax.tree.map(lambda x: x.shape, ref)
    assert all(float(jnp.abs(v["b"]).max()) == 0.0 for v in lp["layers"].values())
    lora_lib.check_lora(lp, tiny_config, LORA)
    per_layer = sum(int(np.prod(i)) * 4 + 4 * int(np.prod(o))
                    for i, o in lora_lib.projection_shapes(tiny_config).values())
    assert lora_lib.num_params(lp) == per_layer * tiny_config.num_layers


def test_gate_off_bit_identical_gate_on_differs(tiny_config, tiny_params, adapter):
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 10), 0, 256)
    gate = jax.random.bernoulli(jax.random.PRNGKey(4), 0.5, (2, 10))
    base, _ = jax.jit(lambda p, t: model_lib.apply(p, tiny_config, t))(tiny_params, tokens)
    mixed, _ = jax.jit(lambda p, a, t, g: model_lib.apply(p, tiny_config, t, gate=g, lora_params=a, lora=LORA))(
        tiny_params, adapter, tokens, gate)
    # rows with the gate off before the first gated row are the AR model exactly (later rows attend to
    # gated rows' K/V and legitimately differ)
    first_on = np.where(np.asarray(gate).any(1), np.argmax(np.asarray(gate), axis=1), 10)
    for b in range(2):
        np.testing.assert_array_equal(np.asarray(mixed[b, :first_on[b]]), np.asarray(base[b, :first_on[b]]))
    assert not np.allclose(np.asarray(mixed)[np.asarray(gate)], np.asarray(base)[np.asarray(gate)], atol=1e-4)


@functools.partial(jax.jit, static_argnames="config")
def _forward(params, tokens, *, config):
    return model_lib.forward(params, config, tokens)


@functools.partial(jax.jit, static_argnames=("config", "lora"))
def _gated(params, adapter, tokens, positions, gate, window_mask, *, config, lora):
    return model_lib.apply(params, config, tokens, positions, gate=gate, window_mask=window_mask,
                           lora_params=adapter, lora=lora)[0]


POISONS = [("nan", np.nan, 32.0), ("inf", np.inf, 32.0), ("huge", 1e30, 32.0), ("nan-alpha", 0.05, float("nan"))]


@pytest.mark.parametrize("name,value,alpha", POISONS)
def test_gate_off_rows_are_the_base_model_whatever_the_adapter_holds(tiny_config, tiny_params, name, value, alpha):
    """The gate selects the update, it does not multiply it (0 · NaN = NaN): with an adapter of NaN, inf or
    1e30 arrays, or alpha=nan, gate-off rows equal `model.forward` bit for bit — also when they share the
    window with gated rows they do not attend to (a drafter-training pair: gated noisy half, clean half)."""
    poisoned = jax.tree.map(lambda x: jnp.full_like(x, value), lora_lib.init_lora(tiny_config, LORA,
                                                                                  jax.random.PRNGKey(1)))
    lora = LoraConfig(rank=LORA.rank, alpha=alpha)
    n = 8
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, n), 0, 256)
    ref = np.asarray(_forward(tiny_params, tokens, config=tiny_config))
    off = _gated(tiny_params, poisoned, tokens, None, jnp.zeros((2, n), bool), None, config=tiny_config, lora=lora)
    np.testing.assert_array_equal(np.asarray(off), ref)

    # [noisy copy, gate on | clean copy, gate off], each half causal within itself only
    pair = jnp.concatenate([tokens, tokens], 1)
    pos = jnp.broadcast_to(jnp.concatenate([jnp.arange(n), jnp.arange(n)]), (2, 2 * n))
    half = jnp.arange(2 * n) // n
    mask = (half[:, None] == half[None, :]) & (jnp.arange(2 * n)[:, None] >= jnp.arange(2 * n)[None, :])
    mask = jnp.broadcast_to(mask, (2, 2 * n, 2 * n))
    gate = jnp.broadcast_to(half == 0, (2, 2 * n))
    clean = np.asarray(_gated(tiny_params, poisoned, pair, pos, gate, mask, config=tiny_config, lora=lora))[:, n:]
    harmless = np.asarray(_gated(tiny_params, jax.tree.map(jnp.zeros_like, poisoned), pair, pos, gate, mask,
                                 config=tiny_config, lora=LORA))[:, n:]
    np.testing.assert_array_equal(clean, harmless)
    np.testing.assert_allclose(clean, ref, atol=1e-5, rtol=1e-5)


def test_merge_equals_gate_on_everywhere(tiny_config, tiny_params, adapter):
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 9), 0, 256)
    gated, _ = jax.jit(lambda p, a, t: model_lib.apply(p, tiny_config, t, gate=jnp.ones((2, 9), bool),
                                                       lora_params=a, lora=LORA))(tiny_params, adapter, tokens)
    merged = jax.jit(lambda p, a, t: model_lib.forward(lora_lib.merge(p, a, LORA), tiny_config, t))(
        tiny_params, adapter, tokens)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(gated), atol=2e-4, rtol=1e-4)
    # merging leaves the non-projection params alone
    np.testing.assert_array_equal(np.asarray(lora_lib.merge(tiny_params, adapter, LORA)["embed"]),
                                  np.asarray(tiny_params["embed"]))


def test_save_load_roundtrip_and_errors(tmp_path, tiny_config, adapter):
    path = lora_lib.save(tmp_path / "adapter", adapter, LORA)
    assert path.name == lora_lib.ADAPTER_FILE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temp dir left behind
    loaded, cfg = lora_lib.load(tmp_path / "adapter")
    assert cfg == LORA
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded, adapter)
    with pytest.raises(FileNotFoundError, match="expected a directory"):
        lora_lib.load(tmp_path / "missing")
    with pytest.raises(ConfigError, match="rank 8"):
        lora_lib.check_lora(loaded, tiny_config, LoraConfig(rank=8, alpha=16.0))


def test_save_refuses_non_finite_adapters(tmp_path, adapter):
    """Nothing is written for an adapter no training produces; the error names the array or the field."""
    bad = {"layers": {**adapter["layers"], "v_proj": {**adapter["layers"]["v_proj"],
                                                      "b": adapter["layers"]["v_proj"]["b"].at[0, 1, 2].set(jnp.inf)}}}
    with pytest.raises(ConfigError, match=r"layers\.v_proj\.b holds 1 non-finite"):
        lora_lib.save(tmp_path / "a", bad, LORA)
    for alpha in (float("nan"), float("inf"), 0.0, -2.0):
        with pytest.raises(ConfigError, match=r"alpha=.*expected a finite number > 0"):
            lora_lib.save(tmp_path / "a", adapter, LoraConfig(rank=4, alpha=alpha))
    assert list(tmp_path.iterdir()) == []


def _write(path, flat, meta):
    path.mkdir()
    save_file(flat, str(path / lora_lib.ADAPTER_FILE), metadata=meta)
    return path


def test_load_checks_metadata_arrays_and_checksums_naming_file_and_field(tmp_path, adapter):
    """Every field of a crafted adapter file is checked like a checkpoint's: each bad value is one error
    naming the file and the field (a ValueError subclass), and a file without checksums loads only with
    verify=False."""
    good = lora_lib.save(tmp_path / "good", adapter, LORA)
    with safe_open(str(good), framework="numpy") as f:
        flat, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())

    def sums(tensors):
        return json.dumps(array_checksums(tensors))

    poisoned = {**flat, "layers.k_proj.a": np.full_like(flat["layers.k_proj.a"], np.nan)}
    no_b = {k: v for k, v in flat.items() if k != "layers.o_proj.b"}
    wide = {**flat, "layers.q_proj.a": np.zeros(flat["layers.q_proj.a"].shape[:2] + (5,), np.float32)}
    ints = {**flat, "layers.up_proj.b": flat["layers.up_proj.b"].astype(np.int32)}
    extra = {**flat, "layers.q_proj.c": flat["layers.q_proj.a"]}
    cases = {  # name: (tensors, metadata, expected message)
        "rank-abc": (flat, {**meta, "rank": "abc"}, "metadata field 'rank' is 'abc': expected a positive integer"),
        "rank-0": (flat, {**meta, "rank": "0"}, "'rank' is '0'"),
        "rank-float": (flat, {**meta, "rank": "4.0"}, "'rank' is '4.0'"),
        "rank-missing": (flat, {k: v for k, v in meta.items() if k != "rank"}, "no 'rank' field"),
        "alpha-nan": (flat, {**meta, "alpha": "nan"}, "'alpha' is 'nan': expected a finite number > 0"),
        "alpha-inf": (flat, {**meta, "alpha": "inf"}, "'alpha' is 'inf'"),
        "alpha-negative": (flat, {**meta, "alpha": "-1.0"}, "'alpha' is '-1.0'"),
        "alpha-text": (flat, {**meta, "alpha": "big"}, "'alpha' is 'big'"),
        "alpha-missing": (flat, {k: v for k, v in meta.items() if k != "alpha"}, "no 'alpha' field"),
        "noise": (flat, {**meta, "noise": "gaussian"}, "'noise' is 'gaussian': expected one of"),
        "format": (flat, {**meta, "format": "other/2"}, "'format' is 'other/2'"),
        "no-checksums": (flat, {k: v for k, v in meta.items() if k != "checksums"}, "no 'checksums' metadata"),
        "bad-checksums": (flat, {**meta, "checksums": "{not json"}, "'checksums' is unreadable"),
        "altered": ({**flat, "layers.q_proj.a": flat["layers.q_proj.a"] + 1}, meta, "differ from the checksums"),
        "nan-array": (poisoned, {**meta, "checksums": sums(poisoned)}, r"layers\.k_proj\.a holds \d+ non-finite"),
        "missing-tensor": (no_b, {**meta, "checksums": sums(no_b)}, r"tensor layers\.o_proj\.b is missing"),
        "wrong-rank": (wide, {**meta, "checksums": sums(wide)}, r"layers\.q_proj\.a has shape .* rank 4"),
        "int-array": (ints, {**meta, "checksums": sums(ints)}, r"layers\.up_proj\.b has dtype int32"),
        "extra-tensor": (extra, {**meta, "checksums": sums(extra)}, r"unexpected tensor 'layers\.q_proj\.c'"),
    }
    for name, (tensors, metadata, message) in cases.items():
        path = _write(tmp_path / name, tensors, metadata)
        with pytest.raises(ValueError, match=message) as e:
            lora_lib.load(path)
        assert str(path / lora_lib.ADAPTER_FILE) in str(e.value), (name, e.value)
    # verify=False skips the checksums only: the rest is checked all the same
    loaded, cfg = lora_lib.load(tmp_path / "no-checksums", verify=False)
    assert cfg == LORA and np.array_equal(np.asarray(loaded["layers"]["q_proj"]["a"]), flat["layers.q_proj.a"])
    for name in ("rank-abc", "nan-array", "missing-tensor"):
        with pytest.raises(ValueError, match=cases[name][2]):
            lora_lib.load(tmp_path / name, verify=False)
    # a file written before the noise convention was recorded: uniform
    old = _write(tmp_path / "old", flat, {k: v for k, v in meta.items() if k != "noise"})
    assert lora_lib.load(old)[1].noise == "uniform"


def test_save_from_sharded_arrays_and_load_onto_a_mesh(tmp_path, adapter):
    """An adapter sharded over 8 devices by the trainer's rules (as a drafter run holds it) saves to the
    same file as its host copy, and `load(mesh=)` places it back on those shardings."""
    from zarya_jax.train import sharding as shd

    mesh = shd.make_mesh(shd.MeshConfig(data=1, fsdp=4, tensor=2))
    shardings = shd.tree_shardings(adapter, mesh)
    sharded = jax.device_put(adapter, shardings)
    assert all(len(x.devices()) == 8 for x in jax.tree.leaves(sharded))
    lora_lib.save(tmp_path / "sharded", sharded, LORA)
    lora_lib.save(tmp_path / "host", jax.tree.map(np.asarray, adapter), LORA)
    assert lora_lib.metadata(tmp_path / "sharded") == lora_lib.metadata(tmp_path / "host")  # checksums included
    loaded, cfg = lora_lib.load(tmp_path / "sharded", mesh=mesh)
    assert cfg == LORA
    for x, s, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(shardings), jax.tree.leaves(adapter)):
        assert x.sharding == s
        np.testing.assert_array_equal(np.asarray(x), np.asarray(want))
