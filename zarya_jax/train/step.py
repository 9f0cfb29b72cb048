"""Sharded training step: the train state, the jitted train/eval steps and their compile cache.

Objective-agnostic: an `objectives.Objective` supplies the loss and, per step, a hashable static value
(Zarya's slot size, docs/algorithms.md §2.1) that fixes shapes, so `StepCache` compiles one step per distinct value.
Only `trainable` gets gradients and optimizer state; `frozen` (e.g. the AR base under a LoRA drafter,
docs/algorithms.md §7) is passed through, sharded but never updated or checkpointed.

Train state (a dict, all of it checkpointed): `step` int32, `params` (trainable, fp32 master
weights), `opt_state` (fp32 Adam moments), `rng` (the run key's data), `bad_step` int32 (-1, or the
first step whose loss or gradient was not finite), and `carry` for an objective that has one (e.g. a
frozen teacher copy, `Objective.init_carry`/`next_carry`), updated after each healthy step. Per-step randomness is
`fold_in(run_key, step)` (and `fold_in(·, micro)` per accumulation micro-batch), so a resumed run
repeats bit for bit.

The step: micro-batches scanned for gradient accumulation → clip → AdamW. A non-finite loss, grad
norm or updated params leaves the state as it was (params, optimizer, step) and records `bad_step`; the
loop then stops with `NonFiniteError`, so no broken state is ever checkpointed. The step also reports
`param_norm`, the updated params' global norm, for the divergence checks (`train.divergence`). The state is donated
into the jitted step (its buffers are reused for the new state: one copy of params and Adam moments in
memory). Steps are traced with the mesh as the context mesh, so the model's fused attention kernels run
per shard (`nn.attention`). Gradients are constrained to their params' shardings (`_sharded_like`), so each
ends on its own FSDP/tensor shard. The constraint says where a gradient lives, not how it is summed; the
output head's gradient is reduce-scattered once per step by the blockwise loss itself
(`objectives.losses.map_head_blocks`, docs/parallelism.md).
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from ..objectives.base import Objective, StepInfo
from . import sharding as shd
from .divergence import DivergenceError
from .optim import OptimConfig, make_optimizer, make_schedule, trainable_labels


class NonFiniteError(DivergenceError):
    """The loss, gradient or updated params became NaN/Inf; the state was not updated nor checkpointed."""


# ------------------------------------------------------------------ state and shardings


def init_state(params, optimizer, run_key: jax.Array, init_carry=None) -> dict:
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)  # fp32 master weights
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params),
             "rng": jax.random.key_data(run_key), "bad_step": jnp.full((), -1, jnp.int32)}
    if init_carry is not None:  # only objectives with a carry have the key: other runs' checkpoints are unchanged
        state["carry"] = init_carry(params)
    return state


def state_shardings(abstract_state: dict, optimizer, mesh) -> dict:
    params_sh = shd.tree_shardings(abstract_state["params"], mesh)
    rep = shd.replicated(mesh)
    out = {"step": rep, "params": params_sh,
           "opt_state": shd.opt_state_shardings(optimizer, abstract_state["opt_state"], params_sh, mesh),
           "rng": rep, "bad_step": rep}
    if "carry" in abstract_state:
        out["carry"] = shd.tree_shardings(abstract_state["carry"], mesh)
    return out


def _batch_specs(mesh, batch_keys) -> dict:
    return {k: shd.batch_sharding(mesh) for k in batch_keys}


# ------------------------------------------------------------------ steps


def _where_tree(pred, a, b):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def _sharded_like(grads, mesh):
    """`grads` (a params-like pytree) constrained to the params' shardings (`shd.tree_shardings`, the
    same as the state's), so no gradient (or accumulation carry) is left whole on every device by the
    partitioner's propagation."""
    return jax.lax.with_sharding_constraint(grads, shd.tree_shardings(grads, mesh))


def make_train_step(objective: Objective, optimizer, optim_config: OptimConfig, total_steps: int, mesh,
                    trainable_mask=None, updates: int = 1):
    """Returns step(state, frozen, batch, static) -> (state, metrics). Pure; jitted by `StepCache`.

    Batch leaves are [B, …] with B divisible by grad_accum_steps × the data-parallel size.
    `trainable_mask` (bool pytree like params) restricts the reported grad norm to trained leaves.
    `updates`: optimizer updates per step on the same batch (GRPO's μ, `num_iterations`; the metrics are
    the last update's, `state["step"]` counts steps and the schedule's `total_steps` counts steps, so
    the optimizer is built for total_steps × updates). Entries of the state the step does not own (a
    companion's train state, e.g. GRPO's refreshed drafter) pass through unchanged.
    """
    schedule = make_schedule(optim_config, total_steps * updates)
    grads_of = _accumulated_grads(objective, optim_config.grad_accum_steps, mesh)

    def step(state, frozen, batch, static):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return _step(state, frozen, batch, static)

    def _update(state, frozen, batch, static, key, u):
        params = state["params"]
        info = StepInfo(step=state["step"], static=static, total_steps=total_steps, carry=state.get("carry"))
        loss, metrics, grads = grads_of(params, frozen, batch, key, info)
        counted = grads if trainable_mask is None else jax.tree.map(
            lambda g, t: g if t else jnp.zeros((), g.dtype), grads, trainable_mask)
        grad_norm = optax.tree.norm(counted)
        updates_, opt_state = optimizer.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates_)
        param_norm = optax.tree.norm(new_params)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(param_norm) & (state["bad_step"] < 0)
        new_state = {**state, "params": _where_tree(ok, new_params, params),
                     "opt_state": _where_tree(ok, opt_state, state["opt_state"]),
                     "bad_step": jnp.where(ok | (state["bad_step"] >= 0), state["bad_step"], state["step"])}
        out = {"loss": loss, "grad_norm": grad_norm, "param_norm": param_norm,
               "lr": schedule(state["step"] * updates + u), "bad_step": new_state["bad_step"],
               **{k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}}
        return new_state, out

    def _step(state, frozen, batch, static):
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        new_state, out = _update(state, frozen, batch, static, key, 0)
        for u in range(1, updates):  # the same batch again, from the updated params
            new_state, out = _update(new_state, frozen, batch, static, jax.random.fold_in(key, u), u)
        ok = new_state["bad_step"] < 0
        new_state["step"] = jnp.where(ok, state["step"] + 1, state["step"])
        if "carry" in state:
            carry = objective.next_carry(state["carry"], new_state["params"], new_state["step"])
            new_state["carry"] = _where_tree(ok, carry, state["carry"])
        return new_state, out

    return step


def _accumulated_grads(objective: Objective, accum: int, mesh):
    """(params, frozen, batch, key, info) -> (loss, metrics, grads): the objective's loss and gradient,
    averaged over `accum` micro-batches (a scan). Strided split (row r goes to micro-batch r % accum)
    keeps each micro-batch spread over every data-parallel device instead of living on a few of them."""
    micro_sharding = NamedSharding(mesh, P(None, shd.BATCH_AXES))

    def grad_fn(p, frozen, mb, k, info):
        def loss_of(p):
            loss, metrics = objective.loss_fn(p, frozen, mb, k, info)
            return loss.astype(jnp.float32), metrics

        (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(p)
        return loss, metrics, _sharded_like(grads, mesh)

    def grads_of(params, frozen, batch, key, info):
        if accum == 1:
            return grad_fn(params, frozen, batch, key, info)
        micro = jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(
                x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1),
                NamedSharding(mesh, P(*micro_sharding.spec, *([None] * (x.ndim - 1))))),
            batch)

        def body(carry, xs):
            g_sum, l_sum, m_sum = carry
            mb, i = xs
            l, m, g = grad_fn(params, frozen, mb, jax.random.fold_in(key, i), info)
            return (jax.tree.map(jnp.add, g_sum, g), l_sum + l,
                    jax.tree.map(lambda a, b: a + b.astype(jnp.float32), m_sum, m)), None

        _, m0, _ = jax.eval_shape(lambda p, mb: grad_fn(p, frozen, mb, key, info), params,
                                  jax.tree.map(lambda x: x[0], micro))
        zeros_m = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), m0)
        (g_sum, l_sum, m_sum), _ = jax.lax.scan(
            body, (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32), zeros_m),
            (micro, jnp.arange(accum)))
        return l_sum / accum, jax.tree.map(lambda m: m / accum, m_sum), jax.tree.map(lambda g: g / accum, g_sum)

    return grads_of


def make_eval_step(objective: Objective, total_steps: int, mesh):
    """eval(params, carry, frozen, batch, key, step, static) -> (loss, metrics); pure, jitted by the caller
    (`carry`: the state's, None without one)."""

    def evaluate(params, carry, frozen, batch, key, step, static):
        info = StepInfo(step=step, static=static, total_steps=total_steps, carry=carry)
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            loss, metrics = objective.loss_fn(params, frozen, batch, key, info)
        return loss.astype(jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    return evaluate


class StepCache:
    """One jitted, sharded step per static value (slot size): in/out shardings, donated state."""

    def __init__(self, step_fn, eval_fn, state_sh, frozen_sh, mesh, batch_keys):
        self._step_fn, self._eval_fn = step_fn, eval_fn
        self._state_sh, self._frozen_sh = state_sh, frozen_sh
        self._batch_sh = _batch_specs(mesh, batch_keys)
        self._rep = shd.replicated(mesh)
        self._train, self._eval = {}, {}

    def train(self, static):
        if static not in self._train:
            self._train[static] = jax.jit(
                lambda state, frozen, batch: self._step_fn(state, frozen, batch, static),
                in_shardings=(self._state_sh, self._frozen_sh, self._batch_sh),
                out_shardings=(self._state_sh, self._rep), donate_argnums=(0,))
        return self._train[static]

    def eval(self, static):
        if static not in self._eval:
            self._eval[static] = jax.jit(
                lambda params, carry, frozen, batch, key, step: self._eval_fn(params, carry, frozen, batch, key, step,
                                                                              static),
                in_shardings=(self._state_sh["params"], self._state_sh.get("carry"), self._frozen_sh, self._batch_sh,
                              self._rep, self._rep),
                out_shardings=self._rep)
        return self._eval[static]


def build_optimizer(optim_config: OptimConfig, total_steps: int, params):
    optimizer = make_optimizer(optim_config, total_steps, params)
    mask = None
    if optim_config.freeze:
        mask = jax.tree.map(lambda lab: lab == "train", trainable_labels(params, optim_config))
    return optimizer, mask


@dataclasses.dataclass
class TrainSteps:
    """A run's optimizer, train state (abstract, with its shardings) and jitted steps, from `build_steps`.

    `init(key)` (from `init_params(key)`) and `from_params(tree)` make a real state straight onto the
    shardings (a given tree is an argument of the program, not a constant). `companions` (name -> another
    `TrainSteps` and its initial params) are other train states kept in this state under their names:
    checkpointed with it, passed through the step unchanged (GRPO's refreshed drafter, trained by a hook)."""

    optimizer: Any
    trainable_mask: Any
    abstract_state: dict
    shardings: dict
    cache: StepCache
    run_key: Any
    init_params: Callable
    init_carry: Callable | None
    companions: dict

    def _state(self, params) -> dict:
        return init_state(params, self.optimizer, self.run_key, self.init_carry)

    def _own(self) -> dict:
        return {k: v for k, v in self.shardings.items() if k not in self.companions}

    def _with_companions(self, state: dict) -> dict:
        return {**state, **{name: steps.from_params(params) for name, (steps, params) in self.companions.items()}}

    def init(self, key) -> dict:
        return self._with_companions(jax.jit(lambda k: self._state(self.init_params(k)),
                                             out_shardings=self._own())(key))

    def from_params(self, params) -> dict:
        placed = jax.device_put(params, self.shardings["params"])  # a no-op for leaves already placed so
        return self._with_companions(jax.jit(self._state, out_shardings=self._own())(placed))


def build_steps(objective: Objective, optim_config: OptimConfig, total_steps: int, init_params: Callable, mesh,
                batch_keys, run_key, *, init_key=None, frozen_shardings=None, updates: int = 1,
                companions: dict | None = None) -> TrainSteps:
    """The one way a run builds optimizer → abstract state → shardings → step cache: `objective` trained from
    `init_params` (key -> the trainable tree, evaluated abstractly here) for `total_steps` steps of `updates`
    optimizer updates each (`make_train_step`); the state's `rng` is `run_key`'s, and `init_key` (default
    `run_key`) the key the abstract state is traced with."""
    init_key = run_key if init_key is None else init_key
    companions = dict(companions or {})
    optimizer, mask = build_optimizer(optim_config, total_steps * updates, jax.eval_shape(init_params, init_key))
    abstract = jax.eval_shape(lambda k: init_state(init_params(k), optimizer, run_key, objective.init_carry),
                              init_key)
    shardings = state_shardings(abstract, optimizer, mesh)
    for name, (steps, _) in companions.items():
        abstract[name], shardings[name] = steps.abstract_state, steps.shardings
    cache = StepCache(make_train_step(objective, optimizer, optim_config, total_steps, mesh, mask, updates),
                      make_eval_step(objective, total_steps, mesh), shardings, frozen_shardings, mesh, batch_keys)
    return TrainSteps(optimizer, mask, abstract, shardings, cache, run_key, init_params, objective.init_carry,
                      companions)


def host_fingerprint(batch: dict[str, np.ndarray]) -> int:
    """crc32 of this host's batch tokens: a cheap record of the data order (logged as data_crc)."""
    return zlib.crc32(np.ascontiguousarray(batch["tokens"]).tobytes())

