"""Attention backends (`ModelConfig.attention`, `zarya_jax.nn.attention`) against the dense fp32 path, the
reference: on causal, padded and packed (segment) batches, forward and gradient, within 1e-5; through the
whole Zarya training loss; splash per shard on a mesh; and `auto`'s choice per platform.

`dot_product` runs XLA's implementation of `jax.nn.dot_product_attention` here (cuDNN needs a GPU) with
the arguments the cuDNN path gets; `splash` runs the TPU Pallas kernel in interpret mode (sequence 128)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from experiments import train as train_cli
from zarya_jax.config import ConfigError, ZaryaConfig
from zarya_jax.data.batch import make_batch
from zarya_jax.nn import attention, masks
from zarya_jax.objectives.losses import zarya_loss
from zarya_jax.testing import tiny_config

T, H, KV, D = 128, 4, 2, 16
FUSED = ("dot_product", "splash")


def _segments() -> np.ndarray:
    """Rows: one example padded after 90 tokens; three packed examples then padding; one full example."""
    seg = np.zeros((3, T), np.int32)
    seg[0, :90] = 1
    seg[1, :30], seg[1, 30:75], seg[1, 75:120] = 1, 2, 3
    seg[2] = 1
    return seg


def _qkv(key, b=3):
    k1, k2, k3 = jax.random.split(key, 3)
    return (jax.random.normal(k1, (b, T, H, D)), jax.random.normal(k2, (b, T, KV, D)),
            jax.random.normal(k3, (b, T, KV, D)))


@pytest.mark.parametrize("backend", FUSED)
def test_fused_backends_equal_dense(backend):
    q, k, v = _qkv(jax.random.PRNGKey(0))
    w = jax.random.normal(jax.random.PRNGKey(1), q.shape)
    for seg in (None, jnp.asarray(_segments())):
        valid = jnp.ones((3, T), bool) if seg is None else seg > 0  # padding rows' outputs are unspecified

        def loss(q, k, v, name):
            out = attention.causal(q, k, v, seg, name)
            return jnp.sum(jnp.where(valid[:, :, None, None], out * w, 0.0)) / T, out

        grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)
        (_, ref), ref_grads = grad(q, k, v, "dense")
        (_, out), grads = grad(q, k, v, backend)
        np.testing.assert_allclose(np.where(valid[:, :, None, None], out, 0), np.where(valid[:, :, None, None], ref, 0),
                                   atol=1e-5)
        for g, r in zip(grads, ref_grads):
            np.testing.assert_allclose(g, r, atol=1e-5)
    # the dense reference itself is the boolean-mask attention of the training transforms
    seg = jnp.asarray(_segments())
    np.testing.assert_array_equal(attention.dense(q, k, v, masks.segment_causal(seg)),
                                  attention.causal(q, k, v, seg, "dense"))


@pytest.fixture(scope="module")
def packed_batch():
    rng = np.random.default_rng(0)
    examples = [(rng.integers(97, 123, rng.integers(3, 10)).tolist(), rng.integers(97, 123, rng.integers(5, 30)).tolist())
                for _ in range(7)]
    return make_batch(examples, length=T, pad_id=256, pack=True)


def test_training_loss_and_gradients_match_dense(tiny_params, packed_batch):
    """The slotted transform's physical-order segments through the whole loss (Zarya's training step)."""
    zc = ZaryaConfig(slot_size_set=(4,), slot_step_borders=(1.0,))
    grad = jax.jit(jax.value_and_grad(zarya_loss, has_aux=True), static_argnums=(1, 2, 5))
    key = jax.random.PRNGKey(3)
    (ref, _), ref_grads = grad(tiny_params, tiny_config(attention="dense"), zc, packed_batch, key, 4)
    for backend in FUSED:
        (loss, _), grads = grad(tiny_params, tiny_config(attention=backend), zc, packed_batch, key, 4)
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
        tiny_config(attention="flash")
    code = train_cli.main(["--config", "tiny", "--set", "model.attention=flash", "--set", "data.train=x.jsonl",
                           "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "flash" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()
