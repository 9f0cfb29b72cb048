"""Mesh, logical-axis rules and sharded training on 8 virtual CPU devices.

The equivalence test trains the same run on one device and on a (data=2, fsdp=2, tensor=2) mesh with
gradient accumulation; losses and params must agree within float tolerance."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from zarya_jax.config import ConfigError
from zarya_jax.model import init_params
from zarya_jax.train import config as rc
from zarya_jax.train import sharding as S
from zarya_jax.testing import write_sum_records


def _norm(spec):
    """PartitionSpec as a tuple without trailing Nones (P(None, None) == P())."""
    t = tuple(spec)
    while t and t[-1] is None:
        t = t[:-1]
    return t


# Hand-written expectation for the tiny model (heads 4, kv heads 2, d 64, f 128, vocab 264).
EXPECTED_222 = {
    "embed": ("tensor", "fsdp"),
    "final_norm/scale": (),
    "layers/input_norm/scale": (),
    "layers/q_norm/scale": (),
    "layers/q_proj/kernel": (None, "fsdp", "tensor"),
    "layers/k_proj/kernel": (None, "fsdp", "tensor"),
    "layers/v_proj/kernel": (None, "fsdp", "tensor"),
    "layers/o_proj/kernel": (None, "tensor", None, "fsdp"),
    "layers/gate_proj/kernel": (None, "fsdp", "tensor"),
    "layers/up_proj/kernel": (None, "fsdp", "tensor"),
    "layers/down_proj/kernel": (None, "tensor", "fsdp"),
}


def test_param_specs_on_222_mesh(tiny_params):
    assert jax.device_count() == 8
    mesh = S.make_mesh(S.MeshConfig(data=2, fsdp=2, tensor=2))
    shardings = S.tree_shardings(tiny_params, mesh)
    flat = {S.path_str(p): s.spec for p, s in jax.tree_util.tree_flatten_with_path(shardings)[0]}
    for path, want in EXPECTED_222.items():
        assert _norm(flat[path]) == want, path


def test_indivisible_param_dim_is_an_error_naming_param_axis_and_remedy(tiny_params):
    # tensor=4: 2 kv heads cannot be split 4 ways. Replicating them instead would hold 4× the memory.
    mesh = S.make_mesh(S.MeshConfig(data=1, fsdp=2, tensor=4))
    with pytest.raises(ConfigError, match=r"param 'layers/(k|v)_proj/kernel' dim 2 \(kv_heads, 2\) does not divide "
                                          r"mesh axis tensor=4: use a number of KV heads divisible by 4 or use mesh.tensor=1"):
        S.tree_shardings(tiny_params, mesh)
    # A vocabulary grown by one row (Qwen3's 151936 + 1 is prime) names the padding remedy.
    grown = {"embed": jax.ShapeDtypeStruct((265, 64), jnp.float32)}
    with pytest.raises(ConfigError, match=r"param 'embed' dim 0 \(vocab, 265\) does not divide mesh axis tensor=4: "
                                          r"pad the vocabulary to a multiple of 4 .* or use mesh.tensor=1"):
        S.tree_shardings(grown, mesh)
    # Axes of several mesh axes name all of them.
    lora_b = {"layers": {"k_proj": {"b": jax.ShapeDtypeStruct((2, 8, 36), jnp.float32)}}}
    with pytest.raises(ConfigError, match=r"dim 2 \(lora_out, 36\) does not divide mesh axis tensor=4 × fsdp=2"):
        S.tree_shardings(lora_b, mesh)


def test_activations_and_batches_stay_lenient():
    """One prompt decoded on an 8-device mesh: the batch dim of 1 is replicated, not an error."""
    from zarya_jax.nn.partitioning import spec_for

    mesh = S.make_mesh(S.MeshConfig(data=2, fsdp=4))
    assert _norm(spec_for((1, 7), ("batch", None), mesh)) == ()
    assert _norm(spec_for((16, 7), ("batch", None), mesh)) == (("data", "fsdp"),)
    with pytest.raises(ConfigError, match="does not divide"):
        spec_for((1, 7), ("batch", None), mesh, strict=True)


def test_lora_paths_and_batch_spec():
    mesh = S.make_mesh(S.MeshConfig(data=2, fsdp=4, tensor=1))
    lora = {"layers": {"q_proj": {"a": np.zeros((2, 64, 8)), "b": np.zeros((2, 8, 64))}}}
    sh = S.tree_shardings(lora, mesh)
    assert _norm(sh["layers"]["q_proj"]["a"].spec) == (None, "fsdp")
    assert _norm(sh["layers"]["q_proj"]["b"].spec) == (None, None, "fsdp")
    assert S.batch_sharding(mesh).spec == P(("data", "fsdp"), None)
    assert S.data_parallel_size(mesh) == 8


def test_lora_adapter_and_adam_moments_are_sharded_per_device():
    """Qwen3-4B's drafter adapter at rank 128 (abstract; 141.6M `b` values, 1.6 GiB with its two Adam moments
    in f32 when replicated): on a (data=1, fsdp=4, tensor=2) mesh every `b` and its moments hold 1/8 of
    their values per device, every `a` and its moments 1/4 (its rank dim stays whole)."""
    import optax

    from zarya_jax.config import LoraConfig, preset
    from zarya_jax.lora import init_lora

    cfg = preset("qwen3-4b")
    adapter = jax.eval_shape(lambda k: init_lora(cfg, LoraConfig(rank=128), k), jax.random.PRNGKey(0))
    mesh = S.make_mesh(S.MeshConfig(data=1, fsdp=4, tensor=2))
    sh = S.tree_shardings(adapter, mesh)
    optimizer = optax.adamw(1e-4)
    opt_sh = S.opt_state_shardings(optimizer, jax.eval_shape(optimizer.init, adapter), sh, mesh)
    moments = [s for s in jax.tree.leaves(opt_sh, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu")][0]
    per_device = {"a": 0, "b": 0}
    whole = {"a": 0, "b": 0}
    for (path, leaf), s, mu, nu in zip(jax.tree_util.tree_flatten_with_path(adapter)[0], jax.tree.leaves(sh),
                                       jax.tree.leaves(moments.mu), jax.tree.leaves(moments.nu)):
        kind = S.path_str(path).rsplit("/", 1)[-1]
        parts = 8 if kind == "b" else 4
        for sharding in (s, mu, nu):
            shard = sharding.shard_shape(leaf.shape)
            assert int(np.prod(shard)) * parts == int(np.prod(leaf.shape)), (S.path_str(path), shard)
            per_device[kind] += int(np.prod(shard)) * 4
            whole[kind] += int(np.prod(leaf.shape)) * 4
    assert whole["b"] / 2**30 > 1.5 and per_device["b"] * 8 == whole["b"]


def test_params_are_bare_arrays_and_every_one_is_declared(tiny_config):
    """init_params strips the declarations (checkpoints and conversion see plain arrays); the declared
    table covers exactly the params and adapter init creates, each name with a rule."""
    from zarya_jax.config import LoraConfig
    untied = tiny_config.replace(tie_word_embeddings=False)
    params, adapter = init_params(untied, jax.random.PRNGKey(0), LoraConfig(rank=2))
    paths = set()
    for tree in (params, adapter):
        for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            assert isinstance(leaf, jax.Array), S.path_str(p)
            paths.add(S.path_str(p))
    declared = S.declared_axes()
    assert set(declared) == paths
    assert {a for axes in declared.values() for a in axes} <= set(S.RULES)


def test_undeclared_parameter_raises_naming_its_path(tiny_params):
    import flax.linen as nn
    from zarya_jax.nn import partitioning

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", partitioning.declare(nn.initializers.ones, ("embed",)), (x.shape[-1],))
            new = nn.Dense(3, use_bias=False, name="new_proj")(x)  # a kernel created without axes
            return x * w, new

    boxed = jax.eval_shape(Net().init, jax.random.PRNGKey(0), jnp.ones((2, 4)))["params"]
    with pytest.raises(ConfigError, match="'new_proj/kernel' was created without logical axes"):
        partitioning.declared(boxed)
    mesh = S.make_mesh(S.MeshConfig(data=1, fsdp=8))
    with pytest.raises(ConfigError, match="'new_proj/kernel' has no declared logical axes"):
        S.tree_shardings({**tiny_params, "new_proj": {"kernel": np.zeros((64, 3))}}, mesh)
    with pytest.raises(ConfigError, match="'layers/q_proj/kernel' has 2 dims"):
        S.tree_shardings({"layers": {"q_proj": {"kernel": np.zeros((64, 3))}}}, mesh)
    no_mlp = {k: v for k, v in S.RULES.items() if k != "mlp"}
    with pytest.raises(ConfigError, match="param 'layers/(down|gate|up)_proj/kernel': logical axis 'mlp'"):
        S.tree_shardings(tiny_params, mesh, no_mlp)


def test_mesh_errors():
    with pytest.raises(ConfigError, match="at most one axis"):
        S.MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ConfigError, match="needs 12 devices"):
        S.make_mesh(S.MeshConfig(data=3, fsdp=2, tensor=2))
    with pytest.raises(ConfigError, match="do not divide"):
        S.make_mesh(S.MeshConfig(data=-1, fsdp=3))
    assert dict(S.make_mesh(S.MeshConfig(data=-1, tensor=2)).shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert dict(S.make_mesh(S.MeshConfig(num_devices=1)).shape) == {"data": 1, "fsdp": 1, "tensor": 1}


def test_global_batch_from_host_data():
    mesh = S.make_mesh(S.MeshConfig(data=2, fsdp=2, tensor=2))
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    g = S.global_batch({"tokens": x}, mesh)["tokens"]
    assert g.shape == (8, 3) and g.sharding.spec == P(("data", "fsdp"), None)
    np.testing.assert_array_equal(np.asarray(g), x)


# Shared with test_train.py's resume test (same compiled step through the session's compile cache).
# Adam's eps is large so that the update is a smooth function of the gradient: with eps=1e-8, leaves
# whose gradient is near zero turn reduction-order noise into lr-sized differences.
COMMON = {"data.max_length": 24, "data.batch_size": 8, "optim.grad_accum_steps": 2, "optim.lr": 1e-2,
          "optim.eps": 1e-3, "optim.warmup_steps": 2, "optim.weight_decay": 0.1, "train.steps": 6,
          "train.log_every": 1, "train.keep_best": 0, "train.export_final": False, "train.progress_bar": False,
          "zarya.slot_size_set": [2], "zarya.slot_step_borders": [1.0]}


def test_sharded_training_matches_one_device(tmp_path, compile_cache):
    write_sum_records(tmp_path / "d.jsonl", 32)
    base = {**COMMON, "data.train": str(tmp_path / "d.jsonl"), "train.save_every": 0}
    from zarya_jax.train.loop import train

    runs = {}
    for name, mesh in {"one": {"mesh.num_devices": 1}, "dft": {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}}.items():
        cfg = rc.build({"model": "tiny"}, {**base, **mesh})
        out = train(cfg, str(tmp_path / name), return_state=True)
        losses = [r["loss"] for r in map(json.loads, open(tmp_path / name / "metrics.jsonl"))]
        runs[name] = (losses, jax.device_get(out["state"]["params"]), out["state"])
    (l1, p1, _), (l8, p8, s8) = runs["one"], runs["dft"]
    assert len(l1) == 6
    np.testing.assert_allclose(l8, l1, rtol=2e-5)
    init = init_params(rc.build({"model": "tiny"}, base).model, jax.random.split(jax.random.PRNGKey(0))[0])
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(init)))
    diffs = [float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8))]
    assert moved > 1e-2 and max(diffs) < 2e-5, (moved, diffs)
    # The trained state really lives on the mesh as the rules say.
    q = s8["params"]["layers"]["q_proj"]["kernel"]
    assert _norm(q.sharding.spec) == (None, "fsdp", "tensor") and len(q.sharding.device_set) == 8
    adam = [s for s in jax.tree.leaves(s8["opt_state"], is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu")]
    assert _norm(adam[0].mu["layers"]["q_proj"]["kernel"].sharding.spec) == (None, "fsdp", "tensor")
    assert _norm(adam[0].nu["embed"].sharding.spec) == ("tensor", "fsdp")
