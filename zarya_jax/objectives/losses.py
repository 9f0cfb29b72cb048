"""Zarya's hybrid loss (docs/algorithms.md §2.6, §3.5; paper eq. 1): L = λ·L_dif + (1 − λ)·L_seq, in fp32.

  L_seq  mean cross-entropy over the AR-convention targets of the batch (clean-slot next tokens, or
         the sequential pass's masked positions);
  L_dif  Σ weight·CE over the MDM-convention targets of each example, divided by the example's number
         of answer tokens, then the mean over the examples that have an answer (weight = 1/p_mask,
         or the ELBO weight).

`zarya_loss` runs the transform (slotted or not, per `ZaryaConfig.slotted_training`), the model and
the loss; `loss_from_logits` is the loss alone, given the transform's outputs and the logits. A train
step never makes the [B, L, V] logits: the losses project the final hidden states onto the vocabulary
a block of positions at a time (`map_sequence_blocks`, rematerialised in the backward). With
`sequential_convention="mdm"` (non-slotted) the sequential rows are replaced by Eso-LM's reconstruction
rows (`objectives.reconstruction`), run in a second forward of their own shape; with "both" the AR-convention
sequential rows are kept as a third part. The parts are flattened into one set of per-token arrays before
the loss, so `L_seq` is the mean over the AR and the reconstruction targets together.
"""
from __future__ import annotations

import functools
import itertools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..config import ConfigError, ModelConfig, ZaryaConfig, missing_mask_token
from .. import model as model_lib
from ..nn.partitioning import spec_for
from .noise import noise_transform
from .reconstruction import reconstruction_rows
from .slots import slotted_transform

Array = jax.Array


def mask_id_of(model_config: ModelConfig) -> int:
    if model_config.mask_token_id is None:
        raise ConfigError(missing_mask_token("the Zarya objectives need", otherwise="for a model of your own, add "
                                             "the mask token to the vocabulary and set mask_token_id"))
    return int(model_config.mask_token_id)


def transform(key: Array, batch: dict, zarya_config: ZaryaConfig, slot_size: int, mask_id: int) -> dict:
    """The training transform selected by `zarya_config.slotted_training` (slot_size unused when False)."""
    if zarya_config.slotted_training:
        return slotted_transform(key, batch, zarya_config, slot_size, mask_id)
    return noise_transform(key, batch, zarya_config, mask_id)


def token_cross_entropy(logits: Array, targets: Array) -> tuple[Array, Array]:
    """fp32 CE and argmax hits per token. logits [R, L, V], targets int [R, L] -> ([R, L], [R, L] bool)."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    ce = jax.nn.logsumexp(logits, axis=-1) - picked
    return ce, jnp.argmax(logits, axis=-1) == targets


def _without(z: Array, token_id: int | None) -> Array:
    """fp32 logits with column `token_id` at -inf, as a fusable select (no scattered copy of [.., V])."""
    z = z.astype(jnp.float32)
    if token_id is None:
        return z
    return jnp.where(jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1) == token_id, -jnp.inf, z)


# Sequence positions per block of the vocabulary projection: a block's f32 logits are [rows per device,
# SEQ_CHUNK, V] (0.3 GiB per row at Qwen3's 151,936 ids), made and dropped one block at a time.
SEQ_CHUNK = 512


def _blocks(x: Array, c: int) -> Array:
    """[B, L, ...] -> [n, B, c, ...], L zero-padded to n·c (the batch dim stays whole: under a mesh each
    device keeps its own rows)."""
    b, length = x.shape[:2]
    n = -(-length // c)
    x = jnp.pad(x, [(0, 0), (0, n * c - length)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape((b, n, c) + x.shape[2:]), 1, 0)


def _unblocks(y: Array, length: int) -> Array:
    """`_blocks`' inverse: [n, B, c, ...] -> [B, L, ...] (the padding dropped)."""
    n, b, c = y.shape[:3]
    return jnp.moveaxis(y, 0, 1).reshape((b, n * c) + y.shape[3:])[:, :length]


def _rows_sharded(x: Array) -> Array:
    """Pins dim 0 of a block [B, c, ...] to the context mesh's batch axes, the other dims left to the
    compiler (none: unchanged). Inside the loop the compiler would otherwise follow the head's sharding
    (vocab or embed over FSDP) and gather every row's block onto every device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1 or mesh.manual_axes:  # under `shard_map` each device has its own rows
        return x
    batch = spec_for(x.shape[:1], ("batch",), mesh)[0]
    return jax.lax.with_sharding_constraint(
        x, jax.sharding.PartitionSpec(batch, *([jax.sharding.PartitionSpec.UNCONSTRAINED] * (x.ndim - 1))))


def map_sequence_blocks(fn, *arrays: Array, chunk: int | None = None):
    """fn(*blocks) over blocks of `chunk` sequence positions of arrays [B, L, ...] (`lax.map`), each block
    rematerialised (`jax.checkpoint`): the backward recomputes a block's intermediates (its [B, c, V]
    logits) instead of keeping them, so at most one block's exist at once, forward or backward. The
    batch dim is never sliced (slicing rows would make every device of a batch-sharded mesh hold all of
    them). fn's outputs [B, c, ...] come back as [B, L, ...]. chunk: positions per block (default
    `SEQ_CHUNK`; L need not divide by it: the last block is zero-padded and its padding dropped)."""
    length = arrays[0].shape[1]
    c = max(1, min(SEQ_CHUNK if chunk is None else chunk, length))
    block_fn = jax.checkpoint(lambda *xs: jax.tree.map(_rows_sharded, fn(*map(_rows_sharded, xs))),
                              prevent_cse=False)
    out = jax.lax.map(lambda xs: block_fn(*xs), tuple(_blocks(a, c) for a in arrays))
    return jax.tree.map(lambda y: _unblocks(y, length), out)


def map_head_blocks(fn, weights: dict, *arrays: Array, chunk: int | None = None):
    """`map_sequence_blocks(lambda *blocks: fn(weights, *blocks), *arrays)` for a loss whose blocks project
    through `weights` (a dict of head weights, `model.head_params`, or a dict of such dicts for two heads;
    each leaf named by its key in `model.HEAD_AXES`), with their gradient summed over the batch once, not
    once per block.

    Left to the partitioner, a weight used inside the block loop has its gradient all-reduced whole at
    every block (each device's rows give a partial sum; the loop carries the sum unsharded). Under a
    mesh whose batch axes split the rows, this runs per device (`shard_map` over the batch axes): each
    device gathers its FSDP shard of the weights (pass them in the dtype to gather, e.g. the compute
    dtype) once before the loop, the loop accumulates the gathered weights' gradient on the device, and the backward
    reduce-scatters it once onto the FSDP shards (the gather's transpose), summing over the data axis
    too. Without such a mesh it is `map_sequence_blocks` as is."""
    mesh = jax.sharding.get_abstract_mesh()
    local = lambda w, *xs: map_sequence_blocks(lambda *blocks: fn(w, *blocks), *xs, chunk=chunk)
    rows = None if mesh.empty or mesh.size == 1 or mesh.manual_axes else spec_for(arrays[0].shape[:1], ("batch",), mesh)[0]
    if rows is None:
        return local(weights, *arrays)
    manual = (rows,) if isinstance(rows, str) else tuple(rows)
    only_manual = lambda entry: tuple(a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a in manual)

    def w_spec(path, w):
        axes = model_lib.HEAD_AXES[path[-1].key]
        return P(*(only_manual(e) or None for e in spec_for(w.shape, axes, mesh)))

    w_specs = jax.tree.map_with_path(w_spec, weights)

    def gathered(w, spec):
        # Marked as differing per batch device before the gather (as the gathered copy's gradient
        # does): the backward then reduce-scatters first and sums only the shard over the other axes.
        whole = tuple(a for a in manual if a not in jax.tree.leaves(tuple(spec)))
        w = jax.lax.pcast(w, whole, to="varying")
        for dim, axes in enumerate(spec):
            if axes:  # gathered along the major dim, so the backward's scatter is contiguous
                w = jnp.moveaxis(jax.lax.all_gather(jnp.moveaxis(w, dim, 0), axes, axis=0, tiled=True), 0, dim)
        return w

    def per_device(w, *xs):
        return local(jax.tree.map(gathered, w, w_specs, is_leaf=lambda x: isinstance(x, P)), *xs)

    # Axes of size 1 are manual too, so a mesh without a tensor split is wholly manual.
    axis_names = frozenset(manual) | {a for a in mesh.axis_names if mesh.shape[a] == 1}
    row_spec = lambda x: P(rows, *([None] * (x.ndim - 1)))
    return jax.shard_map(per_device, mesh=mesh, in_specs=(w_specs, *map(row_spec, arrays)), out_specs=P(rows),
                         axis_names=axis_names)(weights, *arrays)


def head_token_cross_entropy(params, config: ModelConfig, hidden: Array, targets: Array,
                             chunk: int | None = None) -> tuple[Array, Array]:
    """`token_cross_entropy(model.lm_head(params, config, hidden), targets)` without the [B, L, V] logits:
    hidden [B, L, d] (final-normed, `model.apply(..., return_hidden=True)`), targets int [B, L] -> (CE [B, L]
    fp32, hits [B, L] bool), projected block by block, the head's gradient reduced once (`map_head_blocks`)."""
    def block(w, h, t):
        return token_cross_entropy(model_lib.lm_head(w, config, h), t)

    return map_head_blocks(block, head_weights(params, config), hidden, targets, chunk=chunk)


def head_weights(params, config: ModelConfig) -> dict:
    """`model.head_params` in the compute dtype: what `map_head_blocks` gathers (half the bytes of an fp32
    master copy)."""
    return {k: v.astype(config.jnp_dtype) for k, v in model_lib.head_params(params, config).items()}


def _chunk_terms(zq, zp, targets, exclude_id):
    """TV, CE, KL and the backward's statistics of paired rows (zq, zp [..., V])."""
    zq, zp = _without(zq, exclude_id), _without(zp, exclude_id)
    lse_q = jax.nn.logsumexp(zq, axis=-1, keepdims=True)
    lse_p = jax.nn.logsumexp(zp, axis=-1, keepdims=True)
    q, p = jnp.exp(zq - lse_q), jnp.exp(zp - lse_p)
    tv = jnp.sum(jnp.abs(q - p), axis=-1)
    ce = lse_q[..., 0] - jnp.take_along_axis(zq, targets[..., None], axis=-1)[..., 0]
    # log q − log p where q > 0 (0·(−inf) at the excluded column would be NaN)
    log_ratio = jnp.where(q > 0, (zq - lse_q) - jnp.where(p > 0, zp - lse_p, 0.0), 0.0)
    kl = jnp.sum(q * log_ratio, axis=-1)
    q_sign = jnp.sum(q * jnp.sign(q - p), axis=-1)
    return tv, ce, kl, lse_q[..., 0], lse_p[..., 0], q_sign


def _chunk_grad(zq, zp, targets, exclude_id, stats, cotangents):
    """d(g_tv·TV + g_ce·CE + g_kl·KL)/dz_q of paired rows, from the forward's per-row statistics."""
    lse_q, lse_p, q_sign, kl = (x[..., None] for x in stats)
    g_tv, g_ce, g_kl = (g[..., None] for g in cotangents)
    zq, zp = _without(zq, exclude_id), _without(zp, exclude_id)
    q, p = jnp.exp(zq - lse_q), jnp.exp(zp - lse_p)
    log_ratio = jnp.where(q > 0, (zq - lse_q) - jnp.where(p > 0, zp - lse_p, 0.0), 0.0)
    onehot = jax.lax.broadcasted_iota(jnp.int32, zq.shape, zq.ndim - 1) == targets[..., None]
    return q * (g_tv * (jnp.sign(q - p) - q_sign) + g_ce + g_kl * (log_ratio - kl)) - jnp.where(onehot, g_ce, 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _draft_block(zq: Array, zp: Array, targets: Array, exclude_id: int | None):
    """(TV, CE, KL) [..] of paired logits zq, zp [.., V]; the gradient is written directly (and none flows to zp),
    so autodiff keeps no softmax intermediates."""
    return _chunk_terms(zq, zp, targets, exclude_id)[:3]


def _draft_block_fwd(zq, zp, targets, exclude_id):
    tv, ce, kl, lse_q, lse_p, q_sign = _chunk_terms(zq, zp, targets, exclude_id)
    return (tv, ce, kl), (zq, zp, targets, (lse_q, lse_p, q_sign, kl))


def _draft_block_bwd(exclude_id, res, cotangents):
    zq, zp, targets, stats = res
    g = _chunk_grad(zq, zp, targets, exclude_id, stats, cotangents)
    return g.astype(zq.dtype), jnp.zeros_like(zp), None


_draft_block.defvjp(_draft_block_fwd, _draft_block_bwd)


def draft_row_losses(logits: Array, targets: Array, exclude_id: int | None = None, chunk: int | None = None):
    """Uno's drafter terms per row (docs/algorithms.md §7) from paired logits [B, 2L, V]: rows 0..L-1 the draft q, rows
    L..2L-1 the target p (a constant: no gradient flows to it); targets int [B, L]. Returns
    (Σ_v |q − p|, −log q(target), KL(q ‖ p)) as three [B, L] fp32 arrays, each softmax over the
    vocabulary with `exclude_id` (the mask token) removed.

    Fused over the vocabulary, block by block of the sequence: the backward recomputes q and p from the
    logits and writes the gradient directly (d/dz_q: g_tv·q(s − Σqs) + g_ce·(q − onehot) +
    g_kl·q(log q/p − KL), s = sign(q − p); zero on the p rows). A train step uses
    `head_draft_row_losses`, which never makes the [B, 2L, V] logits.
    """
    length = logits.shape[1] // 2
    return map_sequence_blocks(lambda zq, zp, t: _draft_block(zq, zp, t, exclude_id),
                               logits[:, :length], logits[:, length:], targets, chunk=chunk)


def head_draft_row_losses(head_q: Callable[..., Array], hidden_q: Array, head_p: Callable[..., Array],
                          hidden_p: Array, targets: Array, exclude_id: int | None = None, chunk: int | None = None,
                          *, weights: dict | None = None):
    """`draft_row_losses` of the logits head_q(hidden_q) (q) and head_p(hidden_p) (p, a constant), hidden
    [B, L, d] each, heads [..., d] -> fp32 [..., V] (`model.lm_head`): each block of positions is projected,
    reduced and (in the backward) re-projected on its own, so no [B, L, V] array exists.

    weights: the head weights that take a gradient (e.g. {"q": a student's `model.head_params`, "p": its
    teacher's}), passed to the heads as their first argument, head(weights, hidden), through
    `map_head_blocks`, so their gradient is summed over the batch once per step rather than once per block.
    None: the heads close over their (frozen) weights, head(hidden)."""
    if weights is None:
        def block(hq, hp, t):
            return _draft_block(head_q(hq), jax.lax.stop_gradient(head_p(hp)), t, exclude_id)

        return map_sequence_blocks(block, hidden_q, hidden_p, targets, chunk=chunk)

    def head_block(w, hq, hp, t):
        return _draft_block(head_q(w, hq), jax.lax.stop_gradient(head_p(w, hp)), t, exclude_id)

    return map_head_blocks(head_block, weights, hidden_q, hidden_p, targets, chunk=chunk)


def loss_from_logits(logits: Array, inputs: dict, zarya_config: ZaryaConfig, slot_size: int = 0):
    """Loss and metrics from logits [R, L, V] in the physical order of `inputs` (a transform's output)."""
    ce, hit = token_cross_entropy(logits, inputs["targets"])
    return loss_from_token_ce(ce, hit, inputs, zarya_config, slot_size)


def loss_from_token_ce(ce: Array, hit: Array, inputs: dict, zarya_config: ZaryaConfig, slot_size: int = 0):
    """`loss_from_logits` given per-token CE and hits [R, L] (`inputs["primary"]` [R] or [R, L])."""
    w = inputs["weights"].astype(jnp.float32)
    has = w > 0
    seq = has & ~inputs["is_dif"]
    dif = has & inputs["is_dif"]
    f32 = lambda x: x.astype(jnp.float32)
    n_seq = jnp.sum(seq)
    n_dif = jnp.sum(dif)
    n_ex = jnp.sum(inputs["num_examples"])
    loss_seq = jnp.sum(jnp.where(seq, ce, 0.0)) / jnp.maximum(n_seq, 1)
    per_token = jnp.where(dif, w * ce / jnp.maximum(inputs["ans_len"], 1.0), 0.0)
    loss_dif = jnp.sum(per_token) / jnp.maximum(n_ex, 1)
    lam = zarya_config.diffusion_loss_proportion
    # λ ∈ {0, 1} keeps exactly one term (no 0·x, which would still carry a NaN/inf from the other).
    if lam == 1.0:
        loss = loss_dif
    elif lam == 0.0:
        loss = loss_seq
    else:
        loss = lam * loss_dif + (1.0 - lam) * loss_seq

    primary = inputs["primary"]
    primary = jnp.broadcast_to(primary[:, None] if primary.ndim == 1 else primary, inputs["answer"].shape)
    answer = inputs["answer"] & primary
    n_answer = jnp.sum(answer)
    metrics = {
        "loss": loss, "loss_seq": loss_seq, "loss_dif": loss_dif,
        "acc_seq": jnp.sum(seq & hit) / jnp.maximum(n_seq, 1),
        "acc_dif": jnp.sum(dif & hit) / jnp.maximum(n_dif, 1),
        "mask_ratio": jnp.sum(inputs["masked"] & answer) / jnp.maximum(n_answer, 1),
        "mean_p_mask": jnp.sum(jnp.where(answer, inputs["p_mask"], 0.0)) / jnp.maximum(n_answer, 1),
        "slot_size": jnp.asarray(slot_size if zarya_config.slotted_training else 0),
        "num_seq_targets": n_seq, "num_dif_targets": n_dif, "num_answer_tokens": n_answer,
        "num_examples": n_ex,
    }
    return loss.astype(jnp.float32), {k: f32(v) for k, v in metrics.items()}


def zarya_loss(params, model_config: ModelConfig, zarya_config: ZaryaConfig, batch: dict, key: Array,
               slot_size: int, *, apply_fn: Callable | None = None, chunk: int | None = None):
    """Transform (docs/algorithms.md §2 or §3) → model → loss. Returns (scalar fp32 loss, metrics dict of scalars).

    batch: [B, L] arrays (see `data/batch.py`); key: this step's key (e.g. fold_in(run_key, step));
    slot_size: static int, or a traced int32 scalar (one compile for the whole curriculum; ignored when
    not slotted). apply_fn(params, model_config, tokens, positions, segment_ids=..., return_hidden=True)
    -> (final-normed hidden [b, t, d], …) like `model.apply` (the default); use it for remat/sharded
    variants. The loss projects the hidden states onto the vocabulary block by block
    (`head_token_cross_entropy`, `chunk` positions at a time): the [B, L, V] logits are never made.
    The model attends causally within the transform's physical-order segments (the transform's
    `window_mask`, `masks.segment_causal`), through the kernel `model_config.attention` picks.
    Use under `jax.value_and_grad(zarya_loss, has_aux=True)` with the configs (and an int slot_size) static.
    """
    inputs = transform(key, batch, zarya_config, slot_size, mask_id_of(model_config))
    apply_fn = model_lib.apply if apply_fn is None else apply_fn

    def hidden_of(rows, **attention):
        out = apply_fn(params, model_config, rows["tokens"], rows["positions"], return_hidden=True, **attention)
        return out[0] if isinstance(out, tuple) else out

    if zarya_config.slotted_training or zarya_config.sequential_convention == "ar":
        ce, hit = head_token_cross_entropy(params, model_config, hidden_of(inputs, segment_ids=inputs["segment_ids"]),
                                           inputs["targets"], chunk)
        return loss_from_token_ce(ce, hit, inputs, zarya_config, slot_size)
    # Rows 2b are the sequential pass (x0), 2b + 1 the diffusion pass (see `noise_transform`).
    dif = {k: v[1::2] for k, v in inputs.items() if k != "window_mask"}
    seq = {k: v[0::2] for k, v in inputs.items() if k != "window_mask"}
    rec = reconstruction_rows(seq, mask_id_of(model_config))
    passes = [(dif, hidden_of(dif, segment_ids=dif["segment_ids"])), (rec, hidden_of(rec, window_mask=rec["window_mask"]))]
    if zarya_config.sequential_convention == "both":
        passes.append((seq, hidden_of(seq, segment_ids=seq["segment_ids"])))
    # One projection of every pass's positions (side by side in each row): the head is gathered, and its
    # gradient reduced, once per step rather than once per pass (each would hold a gathered copy).
    ce, hit = head_token_cross_entropy(params, model_config, jnp.concatenate([h for _, h in passes], axis=1),
                                       jnp.concatenate([r["targets"] for r, _ in passes], axis=1), chunk)
    ends = list(itertools.accumulate(r["targets"].shape[1] for r, _ in passes))[:-1]
    return loss_from_flat([(r, c, h) for (r, _), c, h in zip(passes, jnp.split(ce, ends, axis=1),
                                                            jnp.split(hit, ends, axis=1))], zarya_config)


def loss_from_flat(parts, zarya_config: ZaryaConfig):
    """The loss over several (inputs, CE, hits) parts of different shapes (CE, hits [R, L] per part), as one
    row of all their tokens."""
    fields = ("weights", "is_dif", "answer", "masked", "p_mask", "ans_len")
    ces, hits, flat = [], [], {k: [] for k in fields + ("primary",)}
    for rows, ce, hit in parts:
        ces.append(ce.reshape(-1))
        hits.append(hit.reshape(-1))
        for k in fields:
            flat[k].append(rows[k].reshape(-1))
        flat["primary"].append(jnp.broadcast_to(rows["primary"][:, None], rows["answer"].shape).reshape(-1))
    merged = {k: jnp.concatenate(v)[None] for k, v in flat.items()}
    merged["num_examples"] = sum(jnp.sum(rows["num_examples"]) for rows, _, _ in parts)[None]
    return loss_from_token_ce(jnp.concatenate(ces)[None], jnp.concatenate(hits)[None], merged, zarya_config)
