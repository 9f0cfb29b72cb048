"""Attention backends (`ModelConfig.attention`, `zarya_jax.nn.attention`) against the dense fp32 path, the
reference: on causal, padded and packed (segment) batches, forward and gradient, within 1e-5; through the
whole Zarya training loss; splash per shard on a mesh; and `auto`'s choice per platform.

`dot_product` runs XLA's implementation of `jax.nn.dot_product_attention` here (cuDNN needs a GPU) with
the arguments the cuDNN path gets; `splash` runs the TPU Pallas kernel in interpret mode (sequence 128)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from experiments import train as train_cli
from zarya_jax.config import ConfigError, ZaryaConfig
from zarya_jax.data.batch import make_batch
from zarya_jax.nn import attention, masks
from zarya_jax.objectives.losses import transform, zarya_loss
from zarya_jax.testing import TINY

T, H, KV, D = 128, 4, 2, 16
FUSED = ("dot_product", "splash")


def _segments() -> np.ndarray:
    """Rows: one example padded after 90 tokens; three packed examples then padding; one full example."""
    seg = np.zeros((3, T), np.int32)
    seg[0, :90] = 1
    seg[1, :30], seg[1, 30:75], seg[1, 75:120] = 1, 2, 3
    seg[2] = 1
    return seg


@pytest.fixture(scope="module")
def packed_batch():
    rng = np.random.default_rng(0)
    examples = [(rng.integers(97, 123, rng.integers(3, 10)).tolist(), rng.integers(97, 123, rng.integers(5, 30)).tolist())
                for _ in range(7)]
    return make_batch(examples, length=T, pad_id=256, pack=True)


def _training_segments(batch) -> list[np.ndarray]:
    """The physical-order segment ids the slotted and the noise transforms give the model (3 rows each: the
    batch's 2 packed rows and a full one; the noise transform's first sequential, diffusion, sequential rows)."""
    key = jax.random.PRNGKey(5)
    slotted = transform(key, batch, ZaryaConfig(slot_size_set=(4,), slot_step_borders=(1.0,)), 4, 259)
    noise = transform(key, batch, ZaryaConfig(slotted_training=False, noise_sorting=True), 4, 259)
    full = np.ones((1, T), np.int32)
    return [np.concatenate([np.asarray(out["segment_ids"]), full])[:3] for out in (slotted, noise)]


def _qkv(key, b=3):
    k1, k2, k3 = jax.random.split(key, 3)
    return (jax.random.normal(k1, (b, T, H, D)), jax.random.normal(k2, (b, T, KV, D)),
            jax.random.normal(k3, (b, T, KV, D)))


@functools.partial(jax.jit, static_argnums=5)
@functools.partial(jax.value_and_grad, argnums=(0, 1, 2), has_aux=True)
def _loss(q, k, v, w, seg, backend):
    """A weighted sum of the outputs of the non-padding rows (padding rows' outputs are unspecified)."""
    out = attention.causal(q, k, v, seg, backend)
    valid = jnp.ones(q.shape[:2], bool) if seg is None else seg > 0
    return jnp.sum(jnp.where(valid[:, :, None, None], out * w, 0.0)) / T, out


@pytest.mark.parametrize("backend", FUSED)
def test_fused_backends_equal_dense(backend, packed_batch):
    q, k, v = _qkv(jax.random.PRNGKey(0))
    w = jax.random.normal(jax.random.PRNGKey(1), q.shape)
    for seg in (None, _segments(), *_training_segments(packed_batch)):
        seg = None if seg is None else jnp.asarray(seg)
        valid = jnp.ones((3, T), bool) if seg is None else seg > 0
        (_, ref), ref_grads = _loss(q, k, v, w, seg, "dense")
        (_, out), grads = _loss(q, k, v, w, seg, backend)
        np.testing.assert_allclose(np.where(valid[:, :, None, None], out, 0), np.where(valid[:, :, None, None], ref, 0),
                                   atol=1e-5)
        for g, r in zip(grads, ref_grads):
            np.testing.assert_allclose(g, r, atol=1e-5)
    # the dense reference itself is the boolean-mask attention of the training transforms
    seg = jnp.asarray(_segments())
    np.testing.assert_array_equal(attention.dense(q, k, v, masks.segment_causal(seg)),
                                  attention.causal(q, k, v, seg, "dense"))


def test_training_loss_and_gradients_match_dense(tiny_params, packed_batch):
    """Zarya's slotted loss, transform to logits, with the GPU-path kernel (the splash kernel sees the same
    segment ids in `test_fused_backends_equal_dense`; compiling it inside the model is slow in interpret mode)."""
    zc = ZaryaConfig(slot_size_set=(4,), slot_step_borders=(1.0,))
    grad = jax.jit(jax.value_and_grad(zarya_loss, has_aux=True), static_argnums=(1, 2, 5))
    key = jax.random.PRNGKey(3)
    (ref, _), ref_grads = grad(tiny_params, TINY.replace(attention="dense"), zc, packed_batch, key, 4)
    for backend in ("dot_product",):
        (loss, _), grads = grad(tiny_params, TINY.replace(attention=backend), zc, packed_batch, key, 4)
        np.testing.assert_allclose(loss, ref, rtol=1e-6)
        for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
            np.testing.assert_allclose(g, r, atol=1e-5)


def test_splash_runs_per_shard_on_a_mesh():
    mesh = Mesh(np.asarray(jax.devices()[:4]).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
    q, k, v = _qkv(jax.random.PRNGKey(2), b=4)
    seg = jnp.asarray(np.concatenate([_segments(), _segments()[:1]]))
    heads = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))

    @jax.jit
    def sharded(q, k, v, seg):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return attention.causal(q, k, v, seg, "splash")

    put = lambda x: jax.device_put(x, heads)
    out = sharded(put(q), put(k), put(v), jax.device_put(seg, NamedSharding(mesh, P(("data", "fsdp"), None))))
    ref = attention.causal(q, k, v, seg, "dense")
    valid = (seg > 0)[:, :, None, None]
    np.testing.assert_allclose(np.where(valid, out, 0), np.where(valid, ref, 0), atol=1e-5)


def test_auto_picks_by_platform_and_mask():
    assert attention.resolve("auto", "cpu", jnp.bfloat16, 2048, 128) == "dense"
    assert attention.resolve("auto", "tpu", jnp.float32, 2048, 128) == "splash"
    assert attention.resolve("auto", "tpu", jnp.bfloat16, 100, 128) == "dense"  # splash tiles by 128
    assert attention.resolve("auto", "gpu", jnp.bfloat16, 100, 128) == "dot_product"
    assert attention.resolve("auto", "gpu", jnp.float32, 2048, 128) == "dense"  # cuDNN takes bf16/fp16
    assert attention.resolve("dense", "tpu", jnp.bfloat16, 2048, 128) == "dense"  # an explicit choice stands
    with pytest.raises(ConfigError, match="splash.*multiple of 128"):
        attention.causal(jnp.zeros((1, 100, H, D)), jnp.zeros((1, 100, KV, D)), jnp.zeros((1, 100, KV, D)), None,
                         "splash")


def test_bad_backend_is_one_clean_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match="attention='flash'.*dot_product"):
        TINY.replace(attention="flash")
    code = train_cli.main(["--config", "tiny", "--set", "model.attention=flash", "--set", "data.train=x.jsonl",
                           "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "flash" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()
