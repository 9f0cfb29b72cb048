"""zarya_jax.checkpoint: Orbax round trips (jax and numpy leaves), configs, atomic saves, shardings."""
import json
import os
import shutil
import types

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from zarya_jax import checkpoint, testing
from zarya_jax.config import ZaryaConfig
from zarya_jax.data.tokenizer import ByteTokenizer, load_tokenizer
from zarya_jax.nn import hf_params
from zarya_jax.nn.integrity import CheckpointError


def flat(params) -> dict:
    return {"/".join(p): np.asarray(v) for p, v in hf_params.leaves(params)}


def assert_same(a, b) -> None:
    a, b = flat(a), flat(b)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module")
def normal_params(tiny_config):
    return testing.normal_params(tiny_config)


@pytest.fixture(scope="module")
def saved(tiny_config, normal_params, tmp_path_factory):
    zarya = ZaryaConfig(alpha0=0.5, noise_sorting=True)
    path = checkpoint.save(tmp_path_factory.mktemp("ck") / "model", normal_params, tiny_config, zarya,
                           tokenizer=ByteTokenizer())
    return path, zarya


def test_round_trip(saved, tiny_config, normal_params):
    path, zarya = saved
    params, config = checkpoint.load(path)
    assert config == tiny_config
    assert_same(params, normal_params)
    assert all(isinstance(x, jax.Array) for _, x in hf_params.leaves(params))
    assert checkpoint.load_zarya_config(path) == zarya
    assert checkpoint.load_config(path) == tiny_config
    assert isinstance(load_tokenizer(checkpoint.tokenizer_dir(path)), ByteTokenizer)
    assert sorted(os.listdir(os.path.dirname(path))) == ["model"]  # no temp dirs left


def test_numpy_bf16_tree_without_zarya(tiny_config, normal_params, tmp_path):
    config = tiny_config.replace(param_dtype="bfloat16")
    params = jax.tree.map(lambda x: np.asarray(x).astype(jax.numpy.bfloat16), normal_params)
    path = checkpoint.save(tmp_path / "bf16", params, config)
    restored, restored_config = checkpoint.load(path)
    assert restored_config == config and restored["embed"].dtype == jax.numpy.bfloat16
    assert_same(restored, params)
    assert checkpoint.load_zarya_config(path) is None and checkpoint.tokenizer_dir(path) is None


def test_refuses_overwrite_unless_asked(saved, tiny_config, normal_params):
    path, _ = saved
    with pytest.raises(FileExistsError, match="already exists"):
        checkpoint.save(path, normal_params, tiny_config)
    assert checkpoint.load_zarya_config(path) is not None  # untouched
    other = jax.tree.map(lambda x: np.asarray(x) + 1, normal_params)
    checkpoint.save(path, other, tiny_config, overwrite=True)
    assert_same(checkpoint.load(path)[0], other)
    assert checkpoint.load_zarya_config(path) is None
    assert sorted(os.listdir(os.path.dirname(path))) == ["model"]
    checkpoint.save(path, normal_params, tiny_config, overwrite=True)  # restore for the other tests


def test_failed_save_leaves_nothing(tiny_config, normal_params, tmp_path):
    # A leaf with the right shape but a type Orbax cannot write fails inside the Orbax save.
    broken = jax.tree.map(lambda x: x, normal_params)
    broken["final_norm"]["scale"] = types.SimpleNamespace(shape=normal_params["final_norm"]["scale"].shape)
    with pytest.raises(Exception):
        checkpoint.save(tmp_path / "broken", broken, tiny_config)
    assert os.listdir(tmp_path) == []


def test_wrong_shapes_and_missing_files(saved, tiny_config, normal_params, tmp_path):
    with pytest.raises(hf_params.ShapeError, match="embed"):
        checkpoint.save(tmp_path / "x", normal_params, tiny_config.replace(vocab_size=300))
    with pytest.raises(FileNotFoundError, match="not a zarya_jax checkpoint"):
        checkpoint.load(tmp_path / "missing")
    # A config that disagrees with the stored arrays is caught on load.
    path, _ = saved
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    meta = json.loads((copy / "config.json").read_text())
    meta["model"]["intermediate_size"] = 96
    (copy / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="config.json differs from the checksum"):
        checkpoint.load(copy)
    with pytest.raises(hf_params.ShapeError, match="gate_proj"):
        checkpoint.load(copy, verify=False)


def test_restore_into_shardings(saved, normal_params):
    path, _ = saved
    mesh = jax.make_mesh((8,), ("x",))

    def spec(x):  # shard the last axis where it divides, replicate the rest
        return PartitionSpec(*([None] * (x.ndim - 1)), "x") if x.shape[-1] % 8 == 0 else PartitionSpec()

    shardings = jax.tree.map(lambda x: NamedSharding(mesh, spec(x)), normal_params)
    params, _ = checkpoint.load(path, shardings)
    for (p, x), (_, s) in zip(hf_params.leaves(params), hf_params.leaves(shardings)):
        assert x.sharding == s, p
    assert_same(params, normal_params)
    replicated = NamedSharding(mesh, PartitionSpec())
    params, _ = checkpoint.load(path, replicated)
    assert all(x.sharding == replicated for _, x in hf_params.leaves(params))
    assert_same(params, normal_params)


def test_load_straight_onto_a_mesh(saved, normal_params):
    """`load(mesh=)` reads every param into the NamedSharding the trainer's rules give it (no device holds
    the model whole first): the same shardings as `train.sharding.tree_shardings`, the same values as the
    single-device load."""
    from zarya_jax.train import sharding as shd

    path, _ = saved
    mesh = shd.make_mesh(shd.MeshConfig(data=1, fsdp=4, tensor=2))
    assert mesh.size == 8
    want = shd.tree_shardings(normal_params, mesh)
    params, _ = checkpoint.load(path, mesh=mesh)
    for (p, x), (_, s) in zip(hf_params.leaves(params), hf_params.leaves(want)):
        assert isinstance(x.sharding, NamedSharding) and x.sharding == s, p
    assert any(x.sharding.spec != PartitionSpec() for _, x in hf_params.leaves(params))  # sharded, not replicated
    single, _ = checkpoint.load(path)
    assert all(len(x.devices()) == 1 for _, x in hf_params.leaves(single))
    assert_same(params, single)
    with pytest.raises(ValueError, match="not both"):
        checkpoint.load(path, NamedSharding(mesh, PartitionSpec()), mesh=mesh)
    # the same placement through the inference loader and the trainer's frozen tree (a drafter's base)
    from zarya_jax.inference import load_for_inference
    from zarya_jax.train.loop import _frozen_on_mesh

    frozen, _ = _frozen_on_mesh(lambda m: checkpoint.load(path, mesh=m)[0], mesh)
    for tree in (load_for_inference(path, mesh=mesh).params, frozen):
        for (p, x), (_, s) in zip(hf_params.leaves(tree), hf_params.leaves(want)):
            assert x.sharding == s, p
        assert_same(tree, single)
