"""The training loop: `train(run_config, workdir) -> summary` (also `trainer.train`).

Order of work: validate everything (config vs workdir, tokenizer vs model, data files and records,
batch vs mesh) → build mesh, objective, optimizer and shardings → restore the latest checkpoint (state
and data iterator) or initialise (random or `train.init_from`) → loop: batch → sharded step → (one
step later) metrics, NaN/Inf guard, logging, eval, checkpoint → export the final params.

Resuming is the default: a workdir with checkpoints continues from the latest one, exactly (same
params, optimizer state, step, PRNG and data position), provided the run config is unchanged (else
`ConfigError`, unless `force=True`). SIGTERM/SIGINT finish the current step, save a checkpoint and
return with `status='interrupted'`.
"""
from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import data as data_lib
from . import model as model_lib
from . import run_config as rc
from . import sharding as shd
from .config import ConfigError, ModelConfig
from .metrics_log import MetricsLog, peak_flops, train_flops_per_token
from .run_checkpoint import RunCheckpointer, abstract_like
from .tokenizer import load_tokenizer
from .trainer import (NonFiniteError, Objective, StepCache, build_optimizer, host_fingerprint, init_state,
                      make_eval_step, make_train_step, state_shardings, zarya_objective)

CONFIG_FILE = "run_config.json"
_STRUCTURAL = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
               "head_dim", "tie_word_embeddings")


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def _atomic_write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def check_workdir(run: rc.RunConfig, workdir: str, force: bool) -> None:
    """Refuses to resume a workdir whose checkpoints belong to a different run config."""
    ckpt_dir = os.path.join(workdir, "checkpoints")
    has_ckpt = os.path.isdir(ckpt_dir) and any(name.isdigit() for name in os.listdir(ckpt_dir))
    path = os.path.join(workdir, CONFIG_FILE)
    if has_ckpt and not force:
        if not os.path.exists(path):
            raise ConfigError(f"workdir {workdir!r} holds checkpoints but no {CONFIG_FILE}: refusing to resume "
                              f"(use --force, or another --workdir)")
        with open(path) as f:
            old = rc.from_dict(json.load(f))
        changes = rc.diff(old, run)
        if changes:
            raise ConfigError(f"workdir {workdir!r} holds a run with a different config; refusing to resume "
                              f"(use --force to resume anyway, or another --workdir). Differences: "
                              + "; ".join(changes))


def resolve_model(run: rc.RunConfig, tokenizer, init_config: ModelConfig | None) -> ModelConfig:
    """The model config: from the init checkpoint (structure) or the run, special ids from the tokenizer
    when unset, and a check that every token id fits the vocabulary."""
    cfg = run.model
    if init_config is not None:
        cfg = init_config.replace(dtype=run.model.dtype, remat=run.model.remat)
    fill = {}
    for field, tok_attr in (("mask_token_id", "mask_id"), ("eos_token_id", "eos_id"), ("pad_token_id", "pad_id")):
        if getattr(cfg, field) is None and getattr(tokenizer, tok_attr, None) is not None:
            fill[field] = getattr(tokenizer, tok_attr)
    cfg = cfg.replace(**fill) if fill else cfg
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ConfigError(f"tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens but "
                          f"model.vocab_size={cfg.vocab_size}: expected vocab_size ≥ the tokenizer's")
    return cfg


def _validate_batch(run: rc.RunConfig, mesh) -> int:
    """Global batch vs hosts, data-parallel devices and accumulation; returns the per-host batch."""
    b, dp, accum, hosts = run.data.batch_size, shd.data_parallel_size(mesh), run.optim.grad_accum_steps, jax.process_count()
    if b % accum:
        raise ConfigError(f"data.batch_size={b} is not divisible by optim.grad_accum_steps={accum}")
    if (b // accum) % dp:
        raise ConfigError(f"data.batch_size={b} / grad_accum_steps={accum} = {b // accum} rows per micro-batch is "
                          f"not divisible by the data-parallel size {dp} (mesh data={mesh.shape['data']} × "
                          f"fsdp={mesh.shape['fsdp']}); choose a batch size that is a multiple of {dp * accum}")
    if b % hosts:
        raise ConfigError(f"data.batch_size={b} is not divisible by the {hosts} hosts")
    return b // hosts


class _SignalFlag:
    """SIGTERM/SIGINT set a flag the loop checks after each step (handlers only in the main thread)."""

    def __init__(self):
        self.signum = None
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._old[s] = signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def _maybe_distributed(mode: str) -> None:
    from jax._src import distributed

    if distributed.global_state.client is None:
        shd.maybe_initialize_distributed(mode)


def train(run: rc.RunConfig, workdir: str, *, force: bool = False, objective: Objective | None = None,
          init_params: Any = None, frozen_params: Any = None, callbacks: Sequence[Callable[[dict], None]] = (),
          return_state: bool = False) -> dict:
    """Trains (or resumes) the run in `workdir`. Returns a summary dict (status, step, loss, eval_loss,
    tokens_per_s, mfu, …; plus 'state' when `return_state`).

    objective: default Zarya's hybrid loss for `run.zarya`. init_params: the trainable tree, or a
    function key -> tree (default: `model.init_params`, or `train.init_from`'s params). frozen_params:
    a tree passed to the loss but not trained (e.g. the AR base under a LoRA drafter); give it again
    when resuming. callbacks: called on the host after every step with {'step', 'saved', 'data_crc'}.
    """
    _maybe_distributed(run.train.distributed)
    os.makedirs(workdir, exist_ok=True)

    # ---- inputs, all validated before any compute
    tokenizer = load_tokenizer(run.data.tokenizer)
    init_config = None
    if run.train.init_from:
        from . import checkpoint as ckpt_lib
        if not os.path.exists(run.train.init_from):
            raise ConfigError(f"train.init_from={run.train.init_from!r} does not exist")
        init_config = ckpt_lib.load_config(run.train.init_from)
    model_cfg = resolve_model(run, tokenizer, init_config)
    if init_config is not None:
        changed = [f for f in _STRUCTURAL if getattr(run.model, f) != getattr(init_config, f)]
        if changed:
            _log(f"note: model structure taken from {run.train.init_from} ({', '.join(changed)} differ from the config)")
    run = run.replace(model=model_cfg)
    check_workdir(run, workdir, force)
    splits = data_lib.load_splits(run.data, tokenizer)
    _log(f"data: {splits.stats}")
    mesh = shd.make_mesh(run.mesh)
    local_batch = _validate_batch(run, mesh)
    if objective is None:
        if run.train.objective != "zarya":
            raise ConfigError(f"train.objective={run.train.objective!r}: this entry point trains 'zarya'; "
                              f"pass an Objective to train() for others")
        from .losses import mask_id_of
        mask_id_of(model_cfg)  # the Zarya transforms need the mask token: fail now, not inside jit
        objective = zarya_objective(model_cfg, run.zarya)
    if jax.process_index() == 0:
        _atomic_write_json(os.path.join(workdir, CONFIG_FILE), run.to_dict())

    # ---- state: restore or initialise, straight onto the mesh
    total = run.train.steps
    init_key, run_key = jax.random.split(jax.random.PRNGKey(run.train.seed))
    from_checkpoint = init_params is None and init_config is not None
    if init_params is None:  # a converted checkpoint has the structure of a fresh init of its config
        init_params = lambda k: model_lib.init_params(model_cfg, k)  # noqa: E731
    init_fn = init_params if callable(init_params) else (lambda k: init_params)
    abstract_params = jax.eval_shape(init_fn, init_key)
    optimizer, trainable_mask = build_optimizer(run.optim, total, abstract_params)
    abstract_state = jax.eval_shape(lambda k: init_state(init_fn(k), optimizer, run_key), init_key)
    state_sh = state_shardings(abstract_state, optimizer, mesh)
    frozen_sh = None if frozen_params is None else shd.tree_shardings(frozen_params, mesh)
    frozen = None if frozen_params is None else jax.device_put(frozen_params, frozen_sh)

    train_ds = data_lib.make_dataset(splits.train, run.data, local_batch=local_batch, pad_id=tokenizer.pad_id,
                                     process_index=jax.process_index(), process_count=jax.process_count())
    train_iter = iter(train_ds)
    ckpt = RunCheckpointer(workdir, keep=run.train.keep, keep_best=run.train.keep_best,
                           async_save=run.train.async_checkpointing)
    latest = ckpt.latest_step()
    if latest is not None:
        state, _ = ckpt.restore(latest, abstract_like(abstract_state, state_sh), train_iter)
        _log(f"resumed from {ckpt.directory}/{latest}")
    elif from_checkpoint:
        from . import checkpoint as ckpt_lib
        loaded, _ = ckpt_lib.load(run.train.init_from, state_sh["params"])
        state = jax.jit(lambda p: init_state(p, optimizer, run_key), out_shardings=state_sh)(loaded)
        _log(f"initialised from {run.train.init_from}")
    else:
        if callable(init_params):
            state = jax.jit(lambda k: init_state(init_fn(k), optimizer, run_key), out_shardings=state_sh)(init_key)
        else:
            state = jax.jit(lambda p: init_state(p, optimizer, run_key), out_shardings=state_sh)(init_params)
    start = int(state["step"])

    steps = StepCache(make_train_step(objective, optimizer, run.optim, total, mesh, trainable_mask),
                      make_eval_step(objective, total), state_sh, frozen_sh, mesh,
                      ("tokens", "segment_ids", "positions", "answer_mask"))
    eval_batches = []
    if splits.eval and run.train.eval_batches:
        eval_ds = data_lib.make_dataset(splits.eval, run.data, local_batch=local_batch, pad_id=tokenizer.pad_id,
                                        train=False, process_index=jax.process_index(),
                                        process_count=jax.process_count())
        n_eval = min(run.train.eval_batches, max(1, math.ceil(len(splits.eval) / run.data.batch_size)))
        eval_batches = [shd.global_batch(b, mesh) for b in data_lib.take(iter(eval_ds), n_eval)]
    eval_key = jax.random.PRNGKey(run.train.seed + 1)

    flops_tok = train_flops_per_token(model_cfg, run.data.max_length, objective.forward_passes)
    peak, peak_note = peak_flops(mesh.devices.flatten().tolist(), run.train.peak_flops)
    _log(f"model {model_cfg.num_params() / 1e6:.2f}M params; mesh {dict(mesh.shape)}; batch {run.data.batch_size}"
         f"×{run.data.max_length}; steps {start}→{total}; MFU peak: {peak_note}")

    log = MetricsLog(workdir, start)
    flag = _SignalFlag()
    bar = None
    if run.train.progress_bar and jax.process_index() == 0:
        from tqdm import tqdm
        bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)

    summary: dict[str, Any] = {"status": "completed", "workdir": os.path.abspath(workdir), "start_step": start,
                               "data_stats": splits.stats, "peak_flops_note": peak_note}
    acc = {"loss": 0.0, "n": 0, "tokens": 0, "rows": 0, "t0": time.perf_counter()}
    totals = {"tokens": 0, "time": 0.0, "flops": 0.0}
    last_eval: dict[int, float] = {}
    last_metrics: dict[str, float] = {}

    def run_eval(step: int) -> float:
        static = objective.static_at(max(step - 1, 0), total)
        fn = steps.eval(static)
        losses = [fn(state["params"], frozen, b, jax.random.fold_in(eval_key, i), jnp.asarray(step, jnp.int32))[0]
                  for i, b in enumerate(eval_batches)]
        value = float(np.mean(jax.device_get(losses)))
        last_eval[step] = value
        return value

    def finish(pending) -> None:
        """Host side of a finished step: guard, accumulate, log (synchronises on that step only)."""
        step_no, metrics, real_tokens, crc = pending
        m = jax.device_get(metrics)
        if int(m["bad_step"]) >= 0:
            raise NonFiniteError(
                f"loss or gradient became non-finite at step {int(m['bad_step']) + 1} (loss={float(m['loss'])}, "
                f"grad_norm={float(m['grad_norm'])}); training stopped. The state was not updated; the last "
                f"checkpoint ({ckpt.latest_step()}) is intact. Lower optim.lr or check the data.")
        last_metrics.clear()
        last_metrics.update({k: float(v) for k, v in m.items()})
        acc["loss"] += float(m["loss"])
        acc["n"] += 1
        acc["tokens"] += real_tokens
        acc["rows"] += run.data.batch_size
        if bar is not None:
            bar.update(1)
        every = run.train.log_every
        if (every and step_no % every == 0) or step_no == total:
            dt = time.perf_counter() - acc["t0"]
            flops = flops_tok * acc["rows"] * run.data.max_length
            row = {"loss": acc["loss"] / acc["n"], "grad_norm": m["grad_norm"], "lr": m["lr"],
                   "tokens_per_s": acc["tokens"] / dt, "mfu": flops / dt / peak, "step_time_s": dt / acc["n"],
                   "data_crc": crc}
            row.update({k: float(v) for k, v in m.items() if k not in ("loss", "grad_norm", "lr", "bad_step")})
            if step_no in last_eval:
                row["eval_loss"] = last_eval[step_no]
            log.write(step_no, row)
            if acc["n"] and step_no - acc["n"] > start:  # the first interval includes compilation
                totals["tokens"] += acc["tokens"]
                totals["time"] += dt
                totals["flops"] += flops
            if bar is not None:
                bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_s']:.0f}",
                                mfu=f"{row['mfu']:.2%}")
            acc.update(loss=0.0, n=0, tokens=0, rows=0, t0=time.perf_counter())

    pending = None
    step = start
    try:
        saved = start
        for step in range(start, total):
            if flag.signum is not None:  # preempted between steps: save what is done, stop
                if pending is not None:
                    finish(pending)
                    pending = None
                if saved != step:
                    ckpt.save(step, state, train_iter, {"step": step, "loss": last_metrics.get("loss")})
                summary["status"] = "interrupted"
                summary["signal"] = int(flag.signum)
                _log(f"signal {flag.signum}: saved checkpoint {step}, stopping")
                break
            local = next(train_iter)
            crc = host_fingerprint(local)
            real = int((local["segment_ids"] > 0).sum()) * jax.process_count()
            batch = shd.global_batch(local, mesh)
            state, metrics = steps.train(objective.static_at(step, total))(state, frozen, batch)
            if pending is not None:
                finish(pending)
            pending = (step + 1, metrics, real, crc)
            step_no = step + 1
            do_eval = bool(eval_batches) and ((run.train.eval_every and step_no % run.train.eval_every == 0)
                                              or step_no == total)
            do_save = (run.train.save_every and step_no % run.train.save_every == 0) or step_no == total
            if do_eval or do_save:
                finish(pending)
                pending = None
            if do_eval:
                run_eval(step_no)
            if do_save:
                ckpt.save(step_no, state, train_iter, {"step": step_no, "loss": last_metrics.get("loss")},
                          last_eval.get(step_no))
                saved = step_no
            if step_no in last_eval and (run.train.log_every == 0 or step_no % run.train.log_every):
                log.write(step_no, {"eval_loss": last_eval[step_no]})
            for cb in callbacks:
                cb({"step": step_no, "saved": bool(do_save), "data_crc": crc, "metrics": dict(last_metrics)})
        if pending is not None:
            finish(pending)
    finally:
        flag.restore()
        if bar is not None:
            bar.close()
        log.close()
        ckpt.close()

    final_step = int(state["step"])
    summary.update(step=final_step, loss=last_metrics.get("loss"),
                   eval_loss=last_eval[max(last_eval)] if last_eval else None,
                   tokens_per_s=totals["tokens"] / totals["time"] if totals["time"] else None,
                   mfu=totals["flops"] / totals["time"] / peak if totals["time"] else None,
                   checkpoint_dir=ckpt.directory, final_params=None)
    if (summary["status"] == "completed" and run.train.export_final and frozen_params is None
            and objective.name.startswith("zarya")):
        from . import checkpoint as ckpt_lib
        path = os.path.join(workdir, "final")
        ckpt_lib.save(path, state["params"], model_cfg, run.zarya, overwrite=True, tokenizer=tokenizer)
        summary["final_params"] = os.path.abspath(path)
    if return_state:
        summary["state"] = state
    return summary
