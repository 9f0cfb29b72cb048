"""The mesh and the gradient layout as a pod run gets them, checked on TPU topology devices (libtpu, no TPU:
`zarya_jax.target`): one device order whatever the process count, and the tied embedding's gradient
reduce-scattered to its FSDP shard in the compiled TPU program."""
import re

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils

from zarya_jax.train import sharding as S



def _tpu(topology):
    from zarya_jax import target

    return target.devices(f"tpu:{topology}")


def _ids(grid) -> np.ndarray:
    return np.vectorize(lambda d: d.id)(np.asarray(grid))


@pytest.mark.parametrize("topology,mesh", [("v5e:4x4", (1, -1, 4)), ("v5e:4x4", (1, -1, 1)), ("v5e:4x4", (1, 2, 8)),
                                           ("v5p:2x2x2", (1, -1, 2)), ("v5p:2x2x2", (2, 2, 2))])
def test_mesh_order_is_the_multi_process_runs(topology, mesh, monkeypatch):
    """make_mesh on a topology's devices = the torus-aware order `mesh_utils` gives the same devices, the
    same when the devices come in another order (another host's enumeration) and when the process count
    is that of the pod (v5e:4x4 spans 4 hosts, v5p:2x2x2 2): a compile from one process lays out the
    program as the real multi-host run will."""
    devices = list(_tpu(topology))
    assert len({d.process_index for d in devices}) > 1  # the topology spans several hosts
    config = S.MeshConfig(*mesh)
    shape = S.resolve_mesh_shape(config, len(devices))
    one = S.make_mesh(config, devices)
    assert one.axis_names == ("data", "fsdp", "tensor") and one.devices.shape == shape
    try:
        reference = mesh_utils.create_device_mesh(shape, devices)
    except (ValueError, NotImplementedError):  # e.g. 2 × 8 on a 4 × 4 slice splits a physical axis
        reference = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    np.testing.assert_array_equal(_ids(one.devices), _ids(reference))
    np.testing.assert_array_equal(_ids(S.make_mesh(config, devices[::-1]).devices), _ids(reference))
    hosts = len({d.process_index for d in devices})
    monkeypatch.setattr(jax, "process_count", lambda: hosts)
    np.testing.assert_array_equal(_ids(S.make_mesh(config, devices).devices), _ids(reference))
    # The tensor axis (fastest) stays on neighbouring chips: a 4-wide tensor group is one 2x2 or 1x4 block.
    if shape[2] == 4 and topology == "v5e:4x4":
        coords = np.array([d.coords for d in one.devices[0, 0]])
        assert np.ptp(coords[:, 0]) + np.ptp(coords[:, 1]) <= 3


def test_cpu_mesh_keeps_the_device_order():
    devices = jax.devices()
    mesh = S.make_mesh(S.MeshConfig(data=2, fsdp=2, tensor=2), devices)
    np.testing.assert_array_equal(_ids(mesh.devices).ravel(), [d.id for d in devices])


def _computations(hlo: str) -> dict[str, list[str]]:
    """HLO text → {computation name: its instruction lines}."""
    out, name = {}, None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(.*\{$", line)
        if header:
            name = header.group(1)
            out[name] = []
        elif name is not None and line.strip() and line.strip() != "}":
            out[name].append(line.strip())
    return out


def test_tied_embedding_gradient_is_reduce_scattered_on_tpu():
    """The train step of a tiny tied model with a large vocabulary, compiled by the TPU compiler for v5e:2x2
    with 4-way FSDP: the embedding's f32 [V, d] gradient is summed over the batch shards by a reduce-scatter
    to its [V, d/4] shard — no all-reduce leaves the whole gradient on every chip — and each chip's
    params + Adam moments are a quarter of the model's."""
    from zarya_jax.bench.train import model_config, step_setup

    devices = _tpu("v5e:2x2")
    mesh = S.make_mesh(S.MeshConfig(data=1, fsdp=-1, tensor=1), devices)
    cfg = model_config("tiny", dtype="bfloat16", attention="dense").replace(vocab_size=4096, mask_token_id=4095,
                                                                          num_layers=1)
    assert cfg.tie_word_embeddings
    setup = step_setup(cfg, mesh, slot_size=8)
    compiled = setup.step.lower(setup.abstract_state, None, setup.abstract_batch(8, 128)).compile()
    v, d = cfg.vocab_size, cfg.hidden_size
    full = re.compile(rf"= (f32|bf16)\[({v},{d}|{d},{v})\]\S* all-reduce(-start)?\(")
    to_shard = re.compile(rf"= (f32|bf16)\[({v},{d // 4}|{d // 4},{v})\]\S* reduce-scatter(-start)?\(")
    scattered = 0
    for name, lines in _computations(compiled.as_text()).items():
        for line in lines:
            if full.search(line):  # the whole gradient summed: only as the inside of a reduce-scatter fusion
                assert name.startswith("all-reduce-scatter"), (name, line[:160])
        scattered += sum(bool(to_shard.search(x)) for x in lines)
        scattered += name.startswith("all-reduce-scatter") and any(full.search(x) for x in lines)
    assert scattered >= 1
    m = compiled.memory_analysis()
    state_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(setup.abstract_state))
    assert m.argument_size_in_bytes < state_bytes / 4 * 1.1 + (1 << 20)
