"""Attention kernels behind one choice, `ModelConfig.attention` (docs/algorithms.md §0: attention reads the physical order).

Two kinds of mask reach attention:

- **causal within segments** (`causal`): query i sees keys j ≤ i of the same segment id, over the
  physical order. This is the training mask — Zarya's slotted and noise transforms both lay every
  example out in its own contiguous range and attend with `masks.segment_causal(segment_ids)` — and the
  plain causal mask (no segment ids) of `forward` and of a prefill. The fused kernels serve it.
- **any boolean mask** `[b, t, s]` (`dense`): mode B's slot-local infill, the drafter's block mask, a
  window against an explicitly masked cache (`cached`). Always the dense path.
- **a window against the live rows of a KV cache** (`live`): decoding. Each query sees the cache rows
  below its row's length (but at most one hidden row per query, mode A's AR-row convention) and the
  window under its own boolean mask. The cache is read `ModelConfig.cache_block` rows at a time, only
  the blocks below the batch's longest live row, so a pass costs what its live rows require whatever
  the static allocation (docs/decoding.md#the-live-cache); `cache_block=0` reads the whole allocation
  densely (`cached`), the accounting the target's compiler can count (a while_loop's body is counted once).

Backends (`ModelConfig.attention`):

| name | what runs |
|---|---|
| `dense` | fp32-softmax einsum against a dense `[b, t, s]` boolean mask (materialises `[b, k, g, t, s]` scores) |
| `dot_product` | `jax.nn.dot_product_attention(is_causal=True)`: cuDNN flash attention on a GPU for bf16/fp16, XLA's implementation elsewhere; segments as a boolean `[b, 1, t, s]` mask (cuDNN adds it as a bias) |
| `splash` | TPU splash attention (Pallas): causal block-sparse mask + segment ids, no mask array at all; run per shard under `shard_map` on the context mesh; sequence a multiple of 128; Pallas interpret mode off TPU (slow, for tests) |
| `auto` | TPU → `splash` (sequence a multiple of 128), GPU → `dot_product` (bf16/fp16, head_dim ≤ 128), otherwise `dense` |

The platform is the one the program is compiled for (`platform()`): the context mesh's devices when a
mesh is set (the train and eval steps, and `generate()` given sharded params or a mesh, set one), else
`jax.default_backend()`. So a program compiled on a CPU host for a TPU mesh gets splash, not dense.

Every backend gives the same result on every row that belongs to a segment (segment id > 0); rows of
padding (id 0) get finite, backend-dependent values that nothing reads (losses weight them 0, caches
never commit them).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..config import ConfigError
from . import masks
from .partitioning import spec_for

Array = jax.Array
NEG_INF = -1e30  # finite, so a fully masked (padding) query row yields a uniform, not NaN, softmax
SPLASH_BLOCK = 128  # the splash kernels tile the sequence in multiples of 128 (TPU lanes)
_HALF = (jnp.bfloat16, jnp.float16)


def _scores(q: Array, k: Array, mask: Array, k_order: str = "bskq") -> Array:
    """Masked fp32 scores [b, k, g, t, s] of q [b,t,h,q] (grouped by kv head) against k, whose axes are
    `k_order` ("bskq": a window's [b,s,k,q]; "bksq": a KV cache's [b,k,s,q])."""
    b, t, h, d = q.shape
    kv = k.shape[k_order.index("k")]
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum(f"btkgq,{k_order}->bkgts", q, k.astype(q.dtype), preferred_element_type=jnp.float32)
    return jnp.where(mask[:, None, None, :, :], scores * (d ** -0.5), NEG_INF)


def _combine(probs: Array, v: Array, out_dtype, v_order: str = "bskq") -> Array:
    """probs [b, k, g, t, s] (fp32) times v (axes `v_order`, as `_scores`) -> [b, t, h, q]."""
    b, kv, g, t, _ = probs.shape
    out = jnp.einsum(f"bkgts,{v_order}->btkgq", probs.astype(out_dtype), v.astype(out_dtype))
    return out.reshape(b, t, kv * g, v.shape[-1])


def dense(q: Array, k: Array, v: Array, mask: Array) -> Array:
    """GQA attention with fp32 scores and softmax. q [b,t,h,q], k/v [b,s,k,q], mask bool [b,t,s] -> [b,t,h,q]."""
    return _combine(jax.nn.softmax(_scores(q, k, mask), axis=-1), v, q.dtype)


def cached(q: Array, k: Array, v: Array, k_cache: Array, v_cache: Array, cache_mask: Array,
           window_mask: Array) -> Array:
    """A window attending to a KV cache and to itself, dense: `dense` over [cache ; window] without
    concatenating K/V, so the cache ([b, k, s, q], `kv_cache`'s head-major layout, any dtype, read in q's
    dtype) is never copied. Reads every allocated cache row, masked or not. q [b,t,h,q], k/v [b,t,k,q];
    cache_mask bool [b,t,s], window_mask bool [b,t,t] -> [b,t,h,q]."""
    s = k_cache.shape[2]
    scores = [_scores(q, k_cache, cache_mask, "bksq"), _scores(q, k, window_mask)]
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
    return _combine(probs[..., :s], v_cache, q.dtype, "bksq") + _combine(probs[..., s:], v, q.dtype)


def cache_mask(length: Array, hide: Array | None, t: int, s: int) -> Array:
    """The boolean [b, t, s] mask `live` applies block by block, whole: cache rows below each row's `length`
    [b], but row `hide[b, t]` for query t (None, or a negative index: none hidden)."""
    rows = jnp.arange(s)
    mask = jnp.broadcast_to((rows[None, :] < length[:, None])[:, None, :], (length.shape[0], t, s))
    return mask if hide is None else mask & (rows[None, None, :] != hide[:, :, None])


def live(q: Array, k: Array, v: Array, k_all: Array, v_all: Array, layer, length: Array, hide: Array | None,
         window_mask: Array, block: int) -> Array:
    """`cached` with the mask `cache_mask(length, hide, …)`, reading only the cache blocks below the batch's
    longest live row: the cache's rows are taken `block` at a time (the last block ends at the cache's end,
    its rows already seen masked), as many blocks as `max(length)` needs, with an online softmax (fp32 running
    max, sum and weighted V) across blocks, then the window's own keys. A cache of one block is read as one, without a loop. Its cost follows the live rows, not
    the allocation, and nothing recompiles as they grow: the block count is a traced bound of a while_loop.

    k_all/v_all: the whole stacked cache [layers, b, k, s, q] and `layer` its layer index (an int or a traced
    scalar): blocks are sliced from the stack itself, so no layer's whole cache is ever copied out (a scan's
    slice of it, fed to a loop, would be). length int [b]; hide int [b, t] or None. Not differentiable (a
    while_loop): the training side's cached windows pass an explicit mask to `cached`."""
    b, t, h, d = q.shape
    _, _, kvh, s, _ = k_all.shape
    g = h // kvh
    size = min(block, s)
    qg, scale = q.reshape(b, t, kvh, g, d), d ** -0.5  # scores scaled in fp32, as `_scores` does
    rows = jnp.arange(size)

    def step(j, carry):
        m, l, acc = carry
        start = jnp.minimum(j * size, s - size)
        at = (layer, 0, 0, start, 0)
        kb, vb = (jax.lax.dynamic_slice(x, at, (1, b, kvh, size, d))[0].astype(q.dtype) for x in (k_all, v_all))
        row = start + rows
        mask = ((row >= j * size)[None, :] & (row[None, :] < length[:, None]))[:, None, :]  # [b, 1, size]
        if hide is not None:
            mask = mask & (row[None, None, :] != hide[:, :, None])
        mask = mask[:, None, None]  # [b, 1, 1, t | 1, size]
        sc = jnp.einsum("btkgq,bksq->bkgts", qg, kb, preferred_element_type=jnp.float32) * scale
        m_new = jnp.maximum(m, jnp.max(jnp.where(mask, sc, NEG_INF), axis=-1))
        p = jnp.where(mask, jnp.exp(sc - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum("bkgts,bksq->bkgtq", p.astype(q.dtype), vb, preferred_element_type=jnp.float32)
        return m_new, l * corr + p.sum(-1), acc * corr[..., None] + pv

    init = (jnp.full((b, kvh, g, t), NEG_INF, jnp.float32), jnp.zeros((b, kvh, g, t), jnp.float32),
            jnp.zeros((b, kvh, g, t, d), jnp.float32))
    if size == s:  # one block is the whole cache: read it without a loop (the compile stays as small as dense)
        m, l, acc = step(0, init)
    else:
        m, l, acc = jax.lax.fori_loop(0, (jnp.max(length) + size - 1) // size, step, init)
    # The window's own keys close the softmax; every query sees at least itself there.
    sw = jnp.einsum("btkgq,bskq->bkgts", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * scale
    wmask = window_mask[:, None, None]
    m_f = jnp.maximum(m, jnp.max(jnp.where(wmask, sw, NEG_INF), axis=-1))
    pw = jnp.where(wmask, jnp.exp(sw - m_f[..., None]), 0.0)
    corr = jnp.exp(m - m_f)
    total = l * corr + pw.sum(-1)
    out = acc * corr[..., None] + jnp.einsum("bkgts,bskq->bkgtq", pw.astype(q.dtype), v.astype(q.dtype),
                                             preferred_element_type=jnp.float32)
    out = out / jnp.where(total > 0, total, 1.0)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def resolve(backend: str, platform: str, dtype, seq_len: int, head_dim: int) -> str:
    """The backend `auto` stands for on `platform` ('cpu' | 'gpu' | 'tpu') for a causal-within-segments
    mask over `seq_len` rows; any other name is returned as given."""
    if backend != "auto":
        return backend
    if platform == "tpu" and seq_len % SPLASH_BLOCK == 0:
        return "splash"
    if platform == "gpu" and jnp.dtype(dtype) in _HALF and head_dim <= 128:
        return "dot_product"
    return "dense"


def platform() -> str:
    """'cpu' | 'gpu' | 'tpu': the platform of the context mesh's devices (the program's target), else the
    default backend's. An abstract mesh made from real or topology devices records their platform."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    name = getattr(device, "platform", None) or jax.default_backend()
    return "gpu" if name in ("cuda", "rocm") else name


def causal(q: Array, k: Array, v: Array, segment_ids: Array | None, backend: str) -> Array:
    """Self-attention, causal over the physical order within equal segment ids ([b, t] int, 0 = padding;
    None = one segment). q [b,t,h,q], k/v [b,t,k,q] -> [b,t,h,q], with the `backend` of the module doc."""
    b, t, _, d = q.shape
    name = resolve(backend, platform(), q.dtype, t, d)
    if name == "dense":
        mask = masks.causal(b, t) if segment_ids is None else masks.segment_causal(segment_ids)
        return dense(q, k, v, mask)
    if name == "dot_product":
        return _dot_product(q, k, v, segment_ids)
    if name == "splash":
        return _splash_sharded(q, k, v, segment_ids)
    raise ConfigError(f"attention backend {backend!r}: expected one of auto, dense, dot_product, splash")


def _dot_product(q: Array, k: Array, v: Array, segment_ids: Array | None) -> Array:
    # cuDNN's flash kernel takes bf16/fp16 only; any other dtype (or platform) runs XLA's implementation.
    half = platform() == "gpu" and q.dtype in _HALF
    mask = None if segment_ids is None else (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True,
                                        implementation="cudnn" if half else None)


def _splash_fn(num_heads: int, seq_len: int, interpret: bool):
    """(the splash kernel for one example: causal over `seq_len`, `num_heads` query heads (GQA native),
    its SegmentIds type).
    Built per trace (once per scanned layer stack), not cached: it holds arrays of the trace it was made in."""
    # Imported here: Pallas' TPU stack adds ~0.6 s to every import of the model, and only this backend needs it.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_kernel
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask
    block = next(b for b in (512, 256, 128) if seq_len % b == 0)
    sizes = splash_kernel.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                                     block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
                                     block_kv_dq=block)
    mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((seq_len, seq_len))] * num_heads)
    kernel = splash_kernel.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                           interpret=interpret)
    return kernel, splash_kernel.SegmentIds


def _splash(q: Array, k: Array, v: Array, segment_ids: Array | None) -> Array:
    b, t, h, d = q.shape
    if t % SPLASH_BLOCK:
        raise ConfigError(f"model.attention='splash' needs a sequence length that is a multiple of "
                          f"{SPLASH_BLOCK}, got {t} (use 'auto', which falls back to 'dense')")
    kernel, segment_ids_of = _splash_fn(h, t, platform() != "tpu")
    seg = jnp.ones((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    heads_first = lambda x: x.transpose(0, 2, 1, 3)  # [b, t, n, q] -> [b, n, t, q]
    one = lambda qq, kk, vv, s: kernel(qq, kk, vv, segment_ids=segment_ids_of(q=s, kv=s))
    # splash does not scale the scores: scale q, as the dense path scales q·k.
    out = jax.vmap(one)(heads_first(q * jnp.asarray(d ** -0.5, q.dtype)), heads_first(k), heads_first(v), seg)
    return heads_first(out).astype(q.dtype)


def _splash_sharded(q: Array, k: Array, v: Array, segment_ids: Array | None) -> Array:
    """`_splash` per shard of the context mesh (batch over the data axes, heads over `tensor`): a Pallas
    kernel is opaque to XLA's partitioner, so it runs under `shard_map`, where every shard holds whole
    sequences. Without a context mesh (one device, or the caller set none) it runs as is."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return _splash(q, k, v, segment_ids)
    b, t, h, d = q.shape
    tp = mesh.shape.get("tensor", 1)
    heads = "heads" if h % tp == 0 and k.shape[2] % tp == 0 else None  # q and k/v heads split alike, or not at all
    spec_q = spec_for(q.shape, ("batch", None, heads, None), mesh)
    spec_kv = spec_for(k.shape, ("batch", None, heads, None), mesh)
    spec_seg = P(spec_q[0], None)
    seg = jnp.ones((b, t), jnp.int32) if segment_ids is None else segment_ids
    return jax.shard_map(_splash, mesh=mesh, in_specs=(spec_q, spec_kv, spec_kv, spec_seg), out_specs=spec_q,
                         check_vma=False)(q, k, v, seg)
