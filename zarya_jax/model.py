"""Qwen3 in Flax Linen (docs/algorithms.md §0–§1), pure: `Qwen3(config).apply({'params': p}, tokens, positions, ...)`.

Two orders (docs/algorithms.md §0): RoPE reads the *logical* `positions`; attention reads the *physical* order of the
input (and of the KV cache). The window's mask is either structured — causal within `segment_ids`
(the training mask; plainly causal without ids), served by the kernel `config.attention` picks
(`attention.py`: dense, `jax.nn.dot_product_attention`/cuDNN, TPU splash) — or any boolean
`window_mask`, always dense (decoding's windows and the drafter's block mask).

Remat (`config.remat`): each scanned layer is recomputed in the backward pass, keeping what
`config.remat_policy` names (`_REMAT_POLICIES`). Under a context mesh (the train and eval steps set
one) each layer's input is pinned to the mesh's batch axes (`batch_sharded`).

KV cache (see `kv_cache.py`): the model never mutates it. Given a cache it attends from the window to
the cache's valid rows plus the window itself and returns the window's own K/V,
`[layers, batch, window, kv_heads, head_dim]`, so the caller decides which rows to commit.

Gated LoRA (docs/algorithms.md §7): with `lora` set, each of the seven projections carries an adapter in the
separate variable collection `'lora'`, selected (`where`, not multiplied by the gate) only on rows where
`gate` is true: a gate-off row computes the base projection exactly, whatever the adapter holds (NaN,
inf, 1e30), and so does every row that attends only to gate-off rows (a gated row's non-finite V is
zeroed, since a masked key's weight 0 times NaN is still NaN). `LoraConfig.layers` restricts the adapter
to some layers: the others run gate-off on every row (a static per-layer switch, the arrays keep their
`[layers, …]` stack).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
from flax.core import meta
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from .config import LoraConfig, ModelConfig
from .nn import attention, hf_params, kv_cache
from .nn import partitioning
from .nn.partitioning import declare, spec_for

Array = jax.Array
_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "qkv": jax.checkpoint_policies.save_only_these_names("q", "k", "v", "attention"),
}


def rms_norm(x: Array, scale: Array, eps: float) -> Array:
    """RMSNorm in fp32, cast back before the scale, as Hugging Face's Qwen3RMSNorm."""
    dtype = x.dtype
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(dtype) * x32.astype(dtype)


def rope(x: Array, positions: Array, theta: float) -> Array:
    """Rotary embedding, half-split convention. x [b, t, n, q], positions [b, t] (logical)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / x.shape[-1]))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, t, half]
    cos = jnp.cos(angles)[:, :, None, :].astype(x.dtype)
    sin = jnp.sin(angles)[:, :, None, :].astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class RMSNorm(nn.Module):
    eps: float
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", declare(nn.initializers.ones, ("norm",)), (x.shape[-1],), self.param_dtype)
        return rms_norm(x, scale, self.eps)


class Proj(nn.Module):
    """A bias-free projection `x[..., in] -> [..., out]` with an optional gated LoRA adapter.

    The kernel is `[*in_shape, *out_shape]` with logical axes `axes` (one per dim); the adapter is
    `a [in, r]`, `b [r, out]` (flattened), with `b` zero-initialised so a fresh adapter is the identity.
    """

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    axes: tuple[str, ...]
    dtype: Any
    param_dtype: Any
    lora: LoraConfig | None = None

    @nn.compact
    def __call__(self, x: Array, gate: Array | None) -> Array:
        n_in = len(self.in_shape)
        kernel = self.param("kernel", declare(nn.initializers.normal(0.02), self.axes),
                            self.in_shape + self.out_shape, self.param_dtype)
        batch_letters = "abcde"[: x.ndim - n_in]
        in_letters = "ijkl"[:n_in]
        out_letters = "mnop"[: len(self.out_shape)]
        y = jnp.einsum(f"{batch_letters}{in_letters},{in_letters}{out_letters}->{batch_letters}{out_letters}",
                       x.astype(self.dtype), kernel.astype(self.dtype))
        if self.lora is None:
            return y
        fan_in = 1
        for s in self.in_shape:
            fan_in *= s
        fan_out = 1
        for s in self.out_shape:
            fan_out *= s
        a_init = declare(nn.initializers.normal(fan_in ** -0.5), ("lora_in", "lora_rank"))
        a = self.variable("lora", "a", lambda: a_init(self.make_rng("lora"), (fan_in, self.lora.rank),
                                                      self.param_dtype)).value
        b = self.variable("lora", "b", lambda: declare(nn.initializers.zeros, ("lora_rank", "lora_out"))(
            None, (self.lora.rank, fan_out), self.param_dtype)).value
        x_flat = x.reshape(x.shape[: x.ndim - n_in] + (fan_in,)).astype(self.dtype)
        delta = (x_flat @ a.astype(self.dtype)) @ b.astype(self.dtype) * self.lora.scale
        delta = delta.reshape(y.shape).astype(y.dtype)
        on = gate.reshape(gate.shape + (1,) * (y.ndim - gate.ndim))
        return jnp.where(on, y + delta, y)


def batch_sharded(x: Array) -> Array:
    """Pins activations [b, …] to the batch axes of the context mesh (none: unchanged). Without it, on a wide
    FSDP mesh XLA may shard a layer's activations along the (small) model dim instead of the batch and
    replicate the attention scores across devices (the plan measured 7× the temporaries at 64-way FSDP)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, spec_for(x.shape, ("batch",) + (None,) * (x.ndim - 1), mesh))


def after(tree, x: Array):
    """`tree` unchanged, whatever `x` holds, but computed from it: a data dependence that orders the caller's
    cache commit after every layer's read of the cache. Nothing else orders that scatter after the reads: V's
    window rows are ready before the last layer's attention has read the cache, and the compiler, free to
    write there, copies the whole cache first so the reads still see the old one (measured on XLA:CPU: K and
    V copied on every pass, whatever the live rows; an optimization barrier does not keep the order there).
    `x < -inf` is false for every float, NaN included, and no compiler folds it."""
    never = x.reshape(-1)[0] < -jnp.inf
    return jax.tree.map(lambda a: jnp.where(never, jnp.zeros_like(a), a), tree)


class Block(nn.Module):
    """One decoder layer: pre-norm GQA attention with q/k RMSNorm before RoPE, pre-norm SwiGLU MLP."""

    config: ModelConfig
    lora: LoraConfig | None = None

    @nn.compact
    def __call__(self, x, layer_cache, layer, lora_on, live_cache, positions, window_mask, segment_ids, cache_mask,
                 gate):
        """layer_cache: this layer's (K, V) of a cache read densely under `cache_mask`; live_cache: the whole
        stacked cache {k, v, length, hide} read live (`attention.live`) at index `layer`; at most one is set."""
        c = self.config
        gate = gate & lora_on  # lora_on: bool scalar, this layer carries the adapter (`LoraConfig.layers`)
        x = batch_sharded(x)
        dt, pdt = c.jnp_dtype, c.jnp_param_dtype
        d, h, kvh, hd, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size

        def proj(name, i, o, axes):
            return Proj(i, o, axes, dt, pdt, self.lora, name=name)

        y = RMSNorm(c.rms_norm_eps, pdt, name="input_norm")(x)
        q = proj("q_proj", (d,), (h, hd), ("embed", "heads", "head_dim"))(y, gate)
        k = proj("k_proj", (d,), (kvh, hd), ("embed", "kv_heads", "head_dim"))(y, gate)
        v = proj("v_proj", (d,), (kvh, hd), ("embed", "kv_heads", "head_dim"))(y, gate)
        if self.lora is not None:
            # A masked key weighs exactly 0 in attention, but 0 · NaN = NaN in the weighted sum: a gated
            # row's non-finite value (a NaN or overflowing adapter) would reach gate-off rows that never
            # attend to it. Zeroing it keeps those rows the base model's, bit for bit.
            v = jnp.where(gate[..., None, None] & ~jnp.isfinite(v), jnp.zeros_like(v), v)
        q = checkpoint_name(rope(RMSNorm(c.rms_norm_eps, pdt, name="q_norm")(q), positions, c.rope_theta), "q")
        k = checkpoint_name(rope(RMSNorm(c.rms_norm_eps, pdt, name="k_norm")(k), positions, c.rope_theta), "k")
        v = checkpoint_name(v, "v")
        if window_mask is None:  # causal within segments: the configured (possibly fused) kernel
            attn = attention.causal(q, k, v, segment_ids, c.attention)
        elif layer_cache is not None:
            attn = attention.cached(q, k, v, *layer_cache, cache_mask, window_mask)
        elif live_cache is not None:
            attn = attention.live(q, k, v, live_cache["k"], live_cache["v"], layer, live_cache["length"],
                                  live_cache["hide"], window_mask, c.cache_block)
        else:
            attn = attention.dense(q, k, v, window_mask)
        attn = checkpoint_name(attn, "attention")
        x = x + proj("o_proj", (h, hd), (d,), ("heads", "head_dim", "embed"))(attn, gate)
        y = RMSNorm(c.rms_norm_eps, pdt, name="post_attn_norm")(x)
        hidden = (nn.silu(proj("gate_proj", (d,), (f,), ("embed", "mlp"))(y, gate))
                  * proj("up_proj", (d,), (f,), ("embed", "mlp"))(y, gate))
        x = x + proj("down_proj", (f,), (d,), ("mlp", "embed"))(hidden, gate)
        return x, (k, v)


class Qwen3(nn.Module):
    """The full decoder. Call with tokens [b, t] int32 and positions [b, t] (logical).

    stacked: the layers' variables are one stack `layers` ([num_layers, …] leaves, run by a scan: the
    layout of training and of checkpoints); False: one tree per layer, `layers_0` … (`split_layers`), run
    one after the other. A scan slices each layer's weights out of the stack on every call, and XLA
    mostly copies the slice before the matmuls read it; per-layer trees are read where they lie (what a
    decode loop calling the model once per pass may want: `GenerationConfig.layer_loop`).
    """

    config: ModelConfig
    lora: LoraConfig | None = None
    stacked: bool = True

    @nn.compact
    def __call__(self, tokens: Array, positions: Array | None = None, *, window_mask: Array | None = None,
                 segment_ids: Array | None = None, cache: dict | None = None, cache_mask: Array | None = None,
                 cache_hide: Array | None = None, gate: Array | None = None, return_hidden: bool = False):
        """Returns (logits fp32 [b, t, v], window K/V ([layers, b, t, k, q] × 2) or None).

        The window's attention over its own physical order is one of:
        segment_ids: int [b, t]: causal within equal ids, 0 = padding (the training mask), served by
          `config.attention`; neither this nor `window_mask`: plainly causal, the same way;
        window_mask: bool [b, t, t], any mask (always the dense kernel).
        cache: {'k', 'v': [layers, b, k, s, q], 'length': [b]} (`kv_cache`). By default each query sees
        the first `length` rows of its cache row, but row `cache_hide[b, t]` (int; negative: none), read
        live (`config.cache_block` rows at a time, only the blocks below the longest row: `attention.live`)
        or, with `cache_block=0`, densely over the allocation. An explicit cache_mask bool [b, t, s] is
        read densely, differentiably (the drafter's training windows). With a cache the window is causal
        unless `window_mask` says otherwise (dense kernel).
        gate: bool [b, t], LoRA on where true (ignored without `lora`).
        """
        c = self.config
        b, t = tokens.shape
        if segment_ids is not None and (window_mask is not None or cache is not None):
            raise ValueError("segment_ids is for a window without a cache or window_mask (the training mask)")
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if cache is not None and window_mask is None:  # a window against a cache: dense causal
            window_mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        if gate is None:
            gate = jnp.zeros((b, t), bool)
        layer_caches = live_cache = None
        decoding = cache is not None and cache_mask is None  # the training side's cached windows pass a mask
        if cache is not None and (cache_mask is not None or c.cache_block == 0):
            layer_caches = (cache["k"], cache["v"])
            if cache_mask is None:
                cache_mask = attention.cache_mask(cache["length"], cache_hide, t, kv_cache.max_len(cache))
        elif cache is not None:
            live_cache = dict(k=cache["k"], v=cache["v"], length=cache["length"], hide=cache_hide)

        embed = self.param("embed", declare(nn.initializers.normal(0.02), ("vocab", "embed")),
                           (c.vocab_size, c.hidden_size), c.jnp_param_dtype)
        x = jnp.take(embed, tokens, axis=0).astype(c.jnp_dtype)

        block = Block
        if c.remat:
            block = nn.remat(Block, prevent_cse=False, policy=_REMAT_POLICIES[c.remat_policy])
        # Static per-layer switch: the adapter arrays stay stacked over all layers (one scan), and a layer
        # outside `LoraConfig.layers` treats every row as gate-off, i.e. computes the base projection.
        chosen = self.lora.layer_ids(c.num_layers) if self.lora is not None else ()
        lora_on = jnp.asarray([i in chosen for i in range(c.num_layers)], bool)
        rest = (live_cache, positions, window_mask, segment_ids, cache_mask, gate)
        layer_ids = jnp.arange(c.num_layers, dtype=jnp.int32)
        if self.stacked:
            # The live cache is broadcast whole, not scanned: `attention.live` slices its blocks from the stack,
            # where a scanned slice fed to its loop would be one copy of the layer's whole cache.
            scanned = nn.scan(block, variable_axes={"params": 0, "lora": 0},
                              split_rngs={"params": True, "lora": True},
                              metadata_params={nn.PARTITION_NAME: "layers"},
                              in_axes=(0, 0, 0) + (nn.broadcast,) * 6, length=c.num_layers, unroll=c.scan_unroll)
            x, window_kv = scanned(c, self.lora, name="layers")(x, layer_caches, layer_ids, lora_on, *rest)
        else:
            kvs = []
            for i in range(c.num_layers):
                layer_cache = None if layer_caches is None else tuple(buf[i] for buf in layer_caches)
                x, kv = block(c, self.lora, name=f"layers_{i}")(x, layer_cache, i, lora_on[i], *rest)
                kvs.append(kv)
            window_kv = tuple(jnp.stack(parts) for parts in zip(*kvs))
        if decoding:
            window_kv = after(window_kv, x)
        x = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name="final_norm")(x)
        if return_hidden:
            return x, window_kv
        if c.tie_word_embeddings:
            head = embed.T
        else:
            head = self.param("lm_head", declare(nn.initializers.normal(0.02), ("embed", "vocab")),
                              (c.hidden_size, c.vocab_size), c.jnp_param_dtype)
        logits = jnp.einsum("btd,dv->btv", x, head.astype(c.jnp_dtype), preferred_element_type=jnp.float32)
        return logits, window_kv


def _init_boxed(config: ModelConfig, lora: LoraConfig | None, key: Array) -> dict:
    """`Qwen3.init`'s variables, each parameter still boxed with its declared logical axes."""
    tokens = jnp.zeros((1, 2), jnp.int32)
    config = config.replace(attention="dense")  # the params do not depend on the kernel; 2 tokens suit any
    k1, k2 = jax.random.split(key)
    return Qwen3(config, lora).init({"params": k1, "lora": k2}, tokens)


def declared_axes(config: ModelConfig, lora: LoraConfig | None = None) -> dict[str, tuple[str | None, ...]]:
    """{'path': logical axes} of every variable `init_params(config, key, lora)` creates (the 'params' and
    'lora' paths are disjoint), as declared where each is created. Traced only: nothing is allocated.
    Raises ConfigError naming a parameter created without a declaration."""
    boxed = jax.eval_shape(lambda k: _init_boxed(config, lora, k), jax.random.PRNGKey(0))
    return {path: axes for collection in boxed.values() for path, axes in partitioning.declared(collection).items()}


def init_params(config: ModelConfig, key: Array, lora: LoraConfig | None = None):
    """Random params (and LoRA params when `lora` is given) with the shapes a checkpoint has: bare arrays,
    the axes declarations stripped."""
    # jit: an eager init of the scanned layers runs op by op and is many times slower.
    variables = jax.jit(lambda k: meta.unbox(_init_boxed(config, lora, k)))(key)
    if lora is None:
        return variables["params"]
    return variables["params"], variables["lora"]


def split_layers(tree):
    """Params (or LoRA params) with the stack `layers` ([num_layers, …] leaves) split into one tree per
    layer, `layers_0` …, the layout `Qwen3(stacked=False)` reads; anything else as it is (None, or a tree
    already split). Under `jax.jit` the split is one copy of the weights per call, made before a decode
    loop instead of on every pass (`Qwen3`); outside it, one copy held by the caller."""
    if not isinstance(tree, dict) or "layers" not in tree:
        return tree
    stack = tree["layers"]
    n = jax.tree.leaves(stack)[0].shape[0]
    split = {f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], stack) for i in range(n)}
    return {**{k: v for k, v in tree.items() if k != "layers"}, **split}


def apply(params, config: ModelConfig, tokens: Array, positions: Array | None = None, *, lora_params=None,
          lora: LoraConfig | None = None, **kwargs):
    """`Qwen3.apply` as a plain function of the params pytree, stacked or split (`split_layers`: the
    adapter's layout must be the params'); see `Qwen3.__call__` for kwargs."""
    stacked = "layers" in params
    variables = {"params": params}
    if lora_params is not None:
        if ("layers" in lora_params) != stacked:
            raise ValueError("params and lora_params must both be stacked or both split (model.split_layers)")
        variables["lora"] = lora_params
    return Qwen3(config, lora if lora_params is not None else None, stacked=stacked).apply(
        variables, tokens, positions, **kwargs)


# The parameter `lm_head` projects with, by name, and its logical axes (as `Qwen3` declares it).
HEAD_AXES = {"embed": ("vocab", "embed"), "lm_head": ("embed", "vocab")}


def head_params(params, config: ModelConfig) -> dict:
    """The one parameter `lm_head` reads, by name: {"embed": [v, d]} when tied, else {"lm_head": [d, v]}
    (its logical axes in `HEAD_AXES`)."""
    name = "embed" if config.tie_word_embeddings else "lm_head"
    return {name: params[name]}


def lm_head(params, config: ModelConfig, hidden: Array) -> Array:
    """The output projection of `Qwen3` on final-normed hidden states [..., d] (`apply(..., return_hidden=True)`):
    logits float32 [..., v], so a caller that needs a few rows' logits projects only those. `params` may be
    the whole tree or just `head_params(params, config)`."""
    head = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
    return jnp.einsum("...d,dv->...v", hidden, head.astype(config.jnp_dtype), preferred_element_type=jnp.float32)


def forward(params, config: ModelConfig, tokens: Array, positions: Array | None = None) -> Array:
    """Plain causal forward (through `config.attention`): logits float32 [b, l, v]; positions default to
    arange(l). Params of another config are a `ShapeError` naming the first param that does not fit."""
    hf_params.check_params(params, config)  # shapes only: also under jit, where it runs once per trace
    logits, _ = apply(params, config, jnp.asarray(tokens, jnp.int32),
                      None if positions is None else jnp.asarray(positions, jnp.int32))
    return logits
