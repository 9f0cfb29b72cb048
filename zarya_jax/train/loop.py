"""The training loop: `train(run_config, workdir) -> summary`, and the one loop every run shares,
`run_loop(session) -> summary`.

`train` is the supervised runs' front (Zarya, AR, the drafter, the draft model, DCD): it validates the
run config and the data and sets up a `Session` whose batches come from the data pipeline. Another kind
of run sets up its own `Session` (GRPO, `rl.trainer`): a `BatchSource` (`draw(state, step)`: a step's
batch may depend on the live params, e.g. rollouts of the current policy; its `iterator` is the data
position a checkpoint saves), an objective, hooks that run before the metrics row (its evaluations), and
companion train states kept in the same checkpoint (`step.TrainSteps`). Everything below holds for both.

Order of work: validate everything (the tokenizer of `train.init_from`'s checkpoint, `train.inherit`;
config vs workdir, tokenizer vs model, data files and records,
batch vs mesh) → build mesh, objective, optimizer and shardings → check that the step's estimated memory
fits the machine (`train.memory`; else one `OutOfMemoryError`, nothing written) → restore the latest checkpoint (state
and data iterator) or initialise (random or `train.init_from`) → loop: batch → sharded step → hooks
(`train.hooks`: eval, metrics log, progress bar, checkpoints; the NaN/Inf guard before any of them) →
at the end, the objective's export of the final params.

Resuming is the default: a workdir with checkpoints continues from the latest one, exactly (same
params, optimizer state, step, PRNG and data position), provided it is the same run: same config and
same data content (`train.identity`; else `ConfigError`, unless `force=True`). The mesh, device count
and host count may differ from the run that wrote the checkpoint; the global batch may not. The workdir's record of
the run is rewritten only once the state is restored, so a refused or failed (forced) resume changes
nothing. Every checkpoint read is verified against its checksums (`train.verify_checkpoints`). SIGTERM/
SIGINT finish the step running (no other is queued behind it), save it once and return with
`status='interrupted'` — on several hosts after the same step on all of them, whichever host got the
signal (`train.preemption`). An out-of-memory error of XLA's becomes one `OutOfMemoryError`; a run that had
saved no checkpoint then leaves the workdir as it found it. A
non-finite step (`NonFiniteError`) or a diverging run (`train.divergence`) stops before that step is
checkpointed.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..config import ConfigError, ModelConfig, PromptFormat
from ..data import pipeline as data_lib
from ..data.tokenizer import load_tokenizer
from .. import lock as workdir_lock
from ..files import atomic_write_json, check_writable_dir
from .. import checkpoint as ckpt_lib
from .. import model as model_lib
from ..objectives.ar import ar_objective
from ..objectives.base import Objective
from ..objectives.losses import mask_id_of
from ..objectives.zarya import zarya_objective
from . import config as rc
from . import identity
from . import inherit
from . import memory as memory_lib
from . import sharding as shd
from . import trackers
from .checkpoints import RunCheckpointer, abstract_like
from .divergence import DivergenceDetector, DivergenceError
from .hooks import Checkpointer, Evaluator, Export, Hook, MetricsLogger, ProgressBar, StepEvent
from .metrics import device_peak, train_flops_per_token
from .optim import OptimConfig
from .preemption import StopSignal
from .step import NonFiniteError, StepCache, TrainSteps, build_steps, host_fingerprint

CONFIG_FILE = identity.CONFIG_FILE
_STRUCTURAL = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
               "head_dim", "tie_word_embeddings")
BATCH_KEYS = ("tokens", "segment_ids", "positions", "answer_mask")


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def resolve_model(run: rc.RunConfig, tokenizer, init_config: ModelConfig | None) -> ModelConfig:
    """The model config: from the init checkpoint (structure) or the run, special ids from the tokenizer
    when unset, and a check that every token id fits the vocabulary."""
    cfg = run.model
    if init_config is not None:
        cfg = init_config.with_runtime_of(run.model)
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


@dataclasses.dataclass
class _Setup:
    """Everything `train` validated and built before the first step."""

    run: rc.RunConfig
    model_config: ModelConfig
    tokenizer: Any
    splits: data_lib.Splits
    mesh: Any
    local_batch: int
    objective: Objective
    init_config: ModelConfig | None


def _prepare(run: rc.RunConfig, workdir: str, force: bool, objective: Objective | None,
             extra_identity: dict | None, tokenizer: str | None) -> _Setup:
    """Validates every input before any compute: init checkpoint and its tokenizer (`inherit.init_tokenizer`),
    tokenizer vs model, workdir, data, batch vs mesh, objective (default: Zarya's for `run.zarya`)."""
    trackers.check(run.train.tracker)
    run, note = inherit.init_tokenizer(run, tokenizer)
    if note:
        _log(note)
    tokenizer = load_tokenizer(run.data.tokenizer)
    init_config = None
    if run.train.init_from:
        if not os.path.exists(run.train.init_from):
            raise ConfigError(f"train.init_from={run.train.init_from!r} does not exist")
        init_config = ckpt_lib.load_config(run.train.init_from)
    model_cfg = resolve_model(run, tokenizer, init_config)
    if init_config is not None:
        changed = [f for f in _STRUCTURAL if getattr(run.model, f) != getattr(init_config, f)]
        if changed:
            _log(f"note: model structure taken from {run.train.init_from} ({', '.join(changed)} differ from the config)")
    run = run.replace(model=model_cfg)
    identity.check_workdir(run, workdir, force, extra_identity)
    splits = data_lib.load_splits(run.data, tokenizer)
    _log(f"data: {splits.stats}")
    mesh = shd.make_mesh(run.mesh)
    local_batch = _validate_batch(run, mesh)
    if objective is None:
        if run.train.objective == "ar":
            objective = ar_objective(model_cfg)
        else:
            mask_id_of(model_cfg)  # the Zarya transforms need the mask token: fail now, not inside jit
            objective = zarya_objective(model_cfg, run.zarya)
    return _Setup(run, model_cfg, tokenizer, splits, mesh, local_batch, objective, init_config)


def _init_fn(init_params: Any, model_config: ModelConfig):
    """key -> the trainable params: `init_params` when it is a function, the given tree, or a fresh model."""
    if callable(init_params):
        return init_params
    if init_params is not None:
        return lambda key: init_params
    return lambda key: model_lib.init_params(model_config, key)


# --------------------------------------------------------------------------- the seams of the shared loop
@dataclasses.dataclass
class Drawn:
    """One step's batch: its arrays on the mesh, its real tokens (global), this host's data checksum, and host
    metrics of its own for the step's row (e.g. GRPO's rollout statistics)."""

    batch: dict
    tokens: int
    crc: int
    metrics: dict = dataclasses.field(default_factory=dict)


class BatchSource(Protocol):
    """Where a run's batches come from. `iterator`: the data position a checkpoint saves and a resume
    restores (`get_state()` / `set_state()`); `draw(state, step)`: the batch of step `step` (0-based), given
    the live train state before it (GRPO's rollouts come from the current params)."""

    iterator: Any

    def draw(self, state: dict, step: int) -> Drawn: ...


class DataBatches:
    """The supervised runs' batches: the data pipeline's iterator, placed on the mesh."""

    def __init__(self, iterator, mesh):
        self.iterator, self.mesh = iterator, mesh

    def draw(self, state: dict, step: int) -> Drawn:
        local = next(self.iterator)
        tokens = int((local["segment_ids"] > 0).sum()) * jax.process_count()
        return Drawn(shd.global_batch(local, self.mesh), tokens, host_fingerprint(local))


@dataclasses.dataclass
class Session:
    """One run of the shared loop (`run_loop`), as a kind of run sets it up: `train` for the Zarya, AR,
    drafter, draft-model and DCD runs, `rl.trainer.train_rl` for GRPO.

    batches: () -> the `BatchSource` (made once the workdir is taken); batch_keys: its arrays; rows × length:
    the global batch (the memory estimate, FLOPs); init_params: key -> tree, a tree, or None (a fresh model,
    or `init_checkpoint`'s params); frozen_params: see `train`; updates: optimizer updates per step on one
    batch; companions: other train states kept in the state (`step.build_steps`); early_hooks(steps, frozen):
    hooks that run before the metrics log (evaluations; hooks that update a companion), default none;
    hooks: after the built-in ones; export: the final export hook; record(): writes what identifies the
    run, once its state is there; config: the run's config for trackers; summary: the summary's first
    entries."""

    workdir: str
    mesh: Any
    model_config: ModelConfig
    objective: Objective
    optim: OptimConfig
    train: rc.TrainConfig
    batches: Callable[[], BatchSource]
    batch_keys: Sequence[str]
    rows: int
    length: int
    init_params: Any = None
    init_checkpoint: str = ""
    frozen_params: Any = None
    updates: int = 1
    companions: dict = dataclasses.field(default_factory=dict)
    early_hooks: Callable[[TrainSteps, Any], Sequence[Hook | None]] = lambda steps, frozen: ()
    hooks: Sequence[Hook] = ()
    export: Hook | None = None
    record: Callable[[], None] = lambda: None
    config: dict = dataclasses.field(default_factory=dict)
    summary: dict = dataclasses.field(default_factory=dict)
    return_state: bool = False


def _initial_state(s: Session, steps: TrainSteps, ckpt: RunCheckpointer, iterator, init_key) -> tuple[dict, dict]:
    """(state, the meta record of the checkpoint it came from, else {}): the latest checkpoint (state and
    data position), else `init_checkpoint`'s params (when no `init_params` is given), else `init_params` (a
    tree, or key -> tree; default a fresh model init), written straight into the state shardings."""
    latest = ckpt.latest_step()
    verify = s.train.verify_checkpoints
    carry, state_sh = s.objective.init_carry, steps.shardings
    if latest is not None:
        saved = ckpt.read_meta(latest).get("checksums") or {}
        if carry is not None and not any(k.startswith("['carry']") for k in saved):
            # a checkpoint of an objective without a carry, resumed (forced) with one, e.g. a drafter trained
            # with TV continued with DCD: the carry starts from the restored params
            rest = {k: v for k, v in steps.abstract_state.items() if k != "carry"}
            state, meta = ckpt.restore(latest, abstract_like(rest, {k: state_sh[k] for k in rest}), iterator,
                                       verify=verify)
            state["carry"] = jax.jit(carry, out_shardings=state_sh["carry"])(state["params"])
            _log(f"resumed from {ckpt.directory}/{latest} (no carry saved: started from its params)")
            return state, meta
        state, meta = ckpt.restore(latest, abstract_like(steps.abstract_state, state_sh), iterator, verify=verify)
        _log(f"resumed from {ckpt.directory}/{latest}")
        return state, meta
    if s.init_params is None and s.init_checkpoint:
        loaded, _ = ckpt_lib.load(s.init_checkpoint, state_sh["params"], verify=verify)
        _log(f"initialised from {s.init_checkpoint}")
        return steps.from_params(loaded), {}
    if s.init_params is not None and not callable(s.init_params):
        return steps.from_params(s.init_params), {}
    return steps.init(init_key), {}


def _frozen_on_mesh(frozen_params: Any, mesh) -> tuple[Any, Any]:
    """(the frozen tree on `mesh`, its shardings): `frozen_params` is None, a tree (placed by the params'
    rules) or a function mesh -> tree that loads it there itself."""
    if frozen_params is None:
        return None, None
    tree = frozen_params(mesh) if callable(frozen_params) else frozen_params
    sh = shd.tree_shardings(tree, mesh)
    return jax.device_put(tree, sh), sh  # a no-op for leaves already on their shardings


def _evaluator(setup: _Setup, steps: StepCache, frozen, total: int) -> Evaluator | None:
    """The held-out loss every `train.eval_every` steps, on up to `train.eval_batches` fixed batches."""
    run = setup.run
    if not (setup.splits.eval and run.train.eval_batches):
        return None
    eval_ds = data_lib.make_dataset(setup.splits.eval, run.data, local_batch=setup.local_batch,
                                    pad_id=setup.tokenizer.pad_id, train=False, process_index=jax.process_index(),
                                    process_count=jax.process_count())
    n_eval = min(run.train.eval_batches, max(1, math.ceil(len(setup.splits.eval) / run.data.batch_size)))
    batches = [shd.global_batch(b, setup.mesh) for b in data_lib.take(iter(eval_ds), n_eval)]
    eval_key = jax.random.PRNGKey(run.train.seed + 1)

    def eval_loss(state, step: int) -> float:
        fn = steps.eval(setup.objective.static_at(max(step - 1, 0), total))
        params, carry = state["params"], state.get("carry")
        losses = [fn(params, carry, frozen, b, jax.random.fold_in(eval_key, i), jnp.asarray(step, jnp.int32))[0]
                  for i, b in enumerate(batches)]
        return float(np.mean(jax.device_get(losses)))

    return Evaluator(eval_loss, run.train.eval_every)


def _undo_start(workdir: str, created: bool, before: set[str]) -> None:
    """Leaves `workdir` as it was before this call: removed again when the call created it (lock files
    aside), else without the entries the call added."""
    if jax.process_index() != 0 or not os.path.isdir(workdir):
        return
    if created:
        workdir_lock.clear(workdir)
        return
    for name in set(os.listdir(workdir)) - before:
        path = os.path.join(workdir, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


def train(run: rc.RunConfig, workdir: str, *, force: bool = False, objective: Objective | None = None,
          init_params: Any = None, frozen_params: Any = None, hooks: Sequence[Hook] = (),
          return_state: bool = False, identity_extra: dict | None = None, tokenizer: str | None = None) -> dict:
    """Trains (or resumes) the run in `workdir`. Returns a summary dict (status, step, loss, eval_loss,
    tokens_per_s, mfu, final_params, …; plus 'state' when `return_state`).

    objective: default Zarya's hybrid loss for `run.zarya`. init_params: the trainable tree, or a
    function key -> tree (default: `model.init_params`, or `train.init_from`'s params). frozen_params:
    a tree passed to the loss but not trained (e.g. the AR base under a LoRA drafter), or a function
    mesh -> tree that reads it straight onto the run's mesh (e.g. `checkpoint.load(path, mesh=mesh)`,
    so no device holds it whole); give it again when resuming. hooks: more `train.hooks.Hook`s, run
    after the built-in ones (eval, metrics log, progress bar, checkpoint, export of the final params
    when the objective has an export and `train.export_final`). identity_extra: more JSON that
    identifies the run (compared on resume like the config, e.g. a drafter's settings and the content
    of its base checkpoint). tokenizer: the tokenizer named for a run with `train.init_from` over that
    checkpoint's own (the CLI's `--set data.tokenizer`); by default `data.tokenizer` when it is not `byte`,
    else the checkpoint's own tokenizer when it has one; one that is not the checkpoint's is refused unless
    `train.allow_tokenizer_mismatch` (`train.inherit`).

    Raises `memory.OutOfMemoryError` (a ConfigError) when the step's estimated memory exceeds the
    machine's (`train.memory_check`), before anything is compiled or written, and when XLA runs out of
    memory anyway; in both cases a run that had saved no checkpoint leaves the workdir as it found it.
    """
    t0 = time.perf_counter()
    shd.maybe_initialize_distributed(run.train.distributed)
    check_writable_dir(workdir, "--workdir")
    setup = _prepare(run, workdir, force, objective, identity_extra, tokenizer)
    run, objective = setup.run, setup.objective
    for warning in rc.degenerate(run) if jax.process_index() == 0 else ():
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    batches = lambda: DataBatches(iter(data_lib.make_dataset(  # noqa: E731
        setup.splits.train, run.data, local_batch=setup.local_batch, pad_id=setup.tokenizer.pad_id,
        process_index=jax.process_index(), process_count=jax.process_count())), setup.mesh)
    export = (Export(objective.export, workdir, setup.tokenizer, PromptFormat.of(run.data))
              if run.train.export_final and objective.export else None)
    session = Session(
        workdir, setup.mesh, setup.model_config, objective, run.optim, run.train, batches, BATCH_KEYS,
        run.data.batch_size, run.data.max_length, init_params=init_params,
        init_checkpoint=run.train.init_from if setup.init_config is not None else "", frozen_params=frozen_params,
        early_hooks=lambda steps, frozen: [_evaluator(setup, steps.cache, frozen, run.train.steps)], hooks=hooks,
        export=export, record=lambda: identity.record(run, workdir, identity_extra), config=run.to_dict(),
        summary={"data_stats": setup.splits.stats}, return_state=return_state)
    return run_loop(session, t0)


@dataclasses.dataclass
class _Started:
    """What `_start` made: the state (restored or initialised), the checkpoint's meta record, the
    checkpointer, the batch source, and how to leave the workdir as it was found."""

    state: dict
    meta: dict
    ckpt: RunCheckpointer
    source: BatchSource
    undo: Callable[[], None]


def _start(s: Session, steps: TrainSteps, init_key, out_of_memory) -> _Started:
    """Restores or initialises the state straight onto the mesh. A failure here (a damaged or unfitting
    checkpoint) leaves the workdir as it was: a workdir this call created is removed again."""
    workdir = s.workdir
    created = workdir_lock.is_new(workdir)
    before = set(os.listdir(workdir)) if os.path.isdir(workdir) else set()
    undo = functools.partial(_undo_start, workdir, created, before)
    os.makedirs(workdir, exist_ok=True)
    ckpt = None
    try:
        source = s.batches()
        t = s.train
        ckpt = RunCheckpointer(workdir, keep=t.keep, keep_best=t.keep_best, async_save=t.async_checkpointing)
        state, meta = _initial_state(s, steps, ckpt, source.iterator, init_key)
        if jax.process_index() == 0:  # only now: a refused or failed restore leaves the workdir's record as it was
            s.record()
    except BaseException as e:
        if ckpt is not None:
            ckpt.close()
        undo()
        oom = out_of_memory(e, "initialising the train state")
        if oom is not None:
            raise oom from None
        raise
    return _Started(state, meta, ckpt, source, undo)


def _memory(s: Session, steps: TrainSteps):
    """The step's memory estimate, checked against the machine (`train.memory_check`) before anything is
    written; returns (estimate, out_of_memory(error, where) -> OutOfMemoryError | None)."""
    estimate = memory_lib.estimate_train_step(
        s.model_config, steps.abstract_state, steps.shardings, s.mesh, batch_size=s.rows, max_length=s.length,
        grad_accum=s.optim.grad_accum_steps, forward_passes=s.objective.forward_passes * s.updates,
        async_checkpointing=s.train.async_checkpointing)
    device = s.mesh.devices.flat[0]
    _log(memory_lib.check(estimate, device, s.model_config, s.mesh) if s.train.memory_check else
         f"memory: estimated {estimate.describe()}; not checked (train.memory_check=false)")

    def out_of_memory(e: BaseException, where: str) -> memory_lib.OutOfMemoryError | None:
        if not memory_lib.is_out_of_memory(e):
            return None
        return memory_lib.out_of_memory_error(e, estimate, s.model_config, s.mesh, where)

    return estimate, out_of_memory


def _hooks(s: Session, steps: TrainSteps, frozen, started: _Started, start: int) -> tuple[list[Hook], Checkpointer]:
    """The hooks in the order they run (see train.hooks): the session's early hooks (evaluations), the
    metrics log, the progress bar, the checkpoint, the export, the session's hooks."""
    t = s.train
    flops_tok = train_flops_per_token(s.model_config, s.length, s.objective.forward_passes * s.updates)
    peak = device_peak(s.mesh.devices.flatten().tolist(), t.peak_flops, s.model_config.dtype)
    _log(f"model {s.model_config.num_params() / 1e6:.2f}M params; mesh {dict(s.mesh.shape)}; batch "
         f"{s.rows}×{s.length}; steps {start}→{t.steps}; MFU peak: {peak.note}")
    tracker = None if t.tracker == "none" else functools.partial(
        trackers.open_tracker, t.tracker, project=t.tracker_project, group=t.tracker_group, name=t.tracker_run,
        config=s.config, workdir=s.workdir)
    logger = MetricsLogger(s.workdir, start, t.log_every, s.rows, s.length, flops_tok, peak, tracker)
    logger.resume_from(started.meta)
    saver = Checkpointer(started.ckpt, started.source.iterator, t.save_every, start, meta=logger.resume_record)
    bar = ProgressBar(t.steps, start, logger) if t.progress_bar and jax.process_index() == 0 else None
    hooks = [*s.early_hooks(steps, frozen), logger, bar, saver, s.export, *s.hooks]
    return [h for h in hooks if h is not None], saver


def run_loop(s: Session, t0: float | None = None) -> dict:
    """Runs (or resumes) the session: the state restored or initialised, steps `start` → `train.steps` with
    the hooks, at the end the summary (also WORKDIR/summary.json). See the module doc and `train`."""
    t0 = time.perf_counter() if t0 is None else t0
    total = s.train.steps
    init_key, run_key = jax.random.split(jax.random.PRNGKey(s.train.seed))
    frozen, frozen_sh = _frozen_on_mesh(s.frozen_params, s.mesh)
    steps = build_steps(s.objective, s.optim, total, _init_fn(s.init_params, s.model_config), s.mesh, s.batch_keys,
                        run_key, init_key=init_key, frozen_shardings=frozen_sh, updates=s.updates,
                        companions=s.companions)
    estimate, out_of_memory = _memory(s, steps)  # checked with the frozen params already in memory
    started = _start(s, steps, init_key, out_of_memory)
    state, start = started.state, int(started.state["step"])
    detector = DivergenceDetector(s.train.divergence, float(jax.jit(optax.tree.norm)(state["params"])))
    hooks, saver = _hooks(s, steps, frozen, started, start)
    summary: dict[str, Any] = {"status": "completed", "workdir": os.path.abspath(s.workdir), "start_step": start,
                               **s.summary, "memory_estimate_bytes": estimate.pool}
    stepper = _Stepper(steps.cache, frozen, s.objective, started.source, hooks, saver, detector, total)
    failure = None
    try:
        stepper.begin(state, start)
        state = stepper.run(state, start, summary)
    except Exception as e:
        failure = out_of_memory(e, "in the train step")
        if failure is None:
            raise
    finally:
        stepper.flag.restore()
        for h in hooks:
            h.close()
        started.ckpt.close()
    if failure is not None:
        if start == 0 and saver.saved_step == 0:  # nothing was checkpointed: as if the run never started
            started.undo()
        raise failure from None
    summary.update(step=int(state["step"]), loss=stepper.last.get("loss"), eval_loss=None, tokens_per_s=None,
                   mfu=None, checkpoint_dir=started.ckpt.directory, final_params=None)
    summary["memory_peak_bytes"], summary["memory_peak_source"] = memory_lib.peak_used(s.mesh.devices.flat[0])
    for h in hooks:
        h.on_end(state, summary)
    summary["wall_s"] = time.perf_counter() - t0
    _record_summary(s.workdir, summary)
    if s.return_state:
        summary["state"] = state
    return summary


SUMMARY_FILE = "summary.json"
_RECORDED = ("loss", "eval_loss", "tokens_per_s", "mfu", "compile_s", "memory_peak_bytes", "wall_s")


def _record_summary(workdir: str, summary: dict) -> None:
    """A completed run's summary goes to WORKDIR/summary.json; a rerun that finds nothing left to do
    reports those numbers instead of the nulls of zero steps (and never writes over them)."""
    path = os.path.join(workdir, SUMMARY_FILE)
    if summary["status"] != "completed" or jax.process_index() != 0:
        return
    if summary["start_step"] == summary["step"] and os.path.exists(path):
        try:
            with open(path) as f:
                recorded = json.load(f)
        except (OSError, ValueError):
            recorded = {}
        if recorded.get("step") == summary["step"]:
            summary.update({k: recorded.get(k) for k in _RECORDED})
            return
    atomic_write_json(path, {k: v for k, v in summary.items() if k != "state"}, default=str)


class _Stepper:
    """Steps `start` → `total` (see `train.hooks` for when hooks run and the host synchronises).

    At most one step is on the device at a time: the host draws and places the next batch while a step
    runs, waits for that step (its metrics), then asks whether a signal came (`StopSignal.reached`) and only
    then dispatches the next step, so a signal at any moment costs at most the step already running, and
    the run saves the state after it once. The batch drawn for a step that never ran is put back (the data
    iterator's position is restored) before that save, so the resumed run sees it. Each shape's step is
    compiled ahead of its first run (`jit(...).lower(...).compile()`): the compile is timed (excluded from
    throughput) and a signal during it stops the run before the step runs."""

    def __init__(self, steps: StepCache, frozen, objective: Objective, source: BatchSource, hooks: list[Hook],
                 saver: Checkpointer, detector: DivergenceDetector, total: int):
        self.steps, self.frozen, self.objective, self.source = steps, frozen, objective, source
        self.hooks, self.saver, self.detector, self.total = hooks, saver, detector, total
        self.last: dict[str, float] = {}
        self.programs: dict[Any, Any] = {}
        self.flag = StopSignal()

    def begin(self, state: dict, start: int) -> None:
        """Each hook's `on_start`; what they add to the event's metrics is logged at the start step."""
        event = StepEvent(start, self.total, {}, 0, 0, state=state)
        for h in self.hooks:
            h.on_start(event)

    def _last_checkpoint(self) -> str:
        step = self.saver.checkpointer.latest_step()
        return ("no checkpoint was written" if step is None else
                f"the last checkpoint, {self.saver.checkpointer.step_dir(step)}, was written from a healthy state")

    def program(self, static, state, batch) -> tuple[Any, float]:
        """(the train step compiled for `static`, seconds spent compiling it now)."""
        if static in self.programs:
            return self.programs[static], 0.0
        t = time.perf_counter()
        _log("compiling the train step" + (f" ({self.objective.name}, static {static!r})" if static is not None
                                           else "") + "…")
        self.programs[static] = self.steps.train(static).lower(state, self.frozen, batch).compile()
        seconds = time.perf_counter() - t
        _log(f"compiled the train step in {seconds:.1f} s")
        return self.programs[static], seconds

    def fetch(self, pending) -> StepEvent:
        """The host side of a dispatched step: its metrics, checked for NaN/Inf and divergence before any
        hook sees them (synchronises on the step)."""
        step_no, metrics, drawn, compile_s = pending
        m = jax.device_get(metrics)
        done = time.perf_counter()
        if int(m["bad_step"]) >= 0:
            raise NonFiniteError(
                f"loss, gradient or params became non-finite at step {int(m['bad_step']) + 1} "
                f"(loss={float(m['loss'])}, grad_norm={float(m['grad_norm'])}, param_norm={float(m['param_norm'])})"
                f"; training stopped and the state was not updated; {self._last_checkpoint()}. Lower optim.lr or "
                "check the data.")
        reason = self.detector.check(step_no, {k: float(v) for k, v in m.items()})
        if reason:
            raise DivergenceError(f"training diverged at step {step_no}: {reason}. Training stopped without saving "
                                  f"this step; {self._last_checkpoint()}. Lower optim.lr, check the data, or adjust "
                                  "train.divergence.*")
        self.last.clear()
        self.last.update({k: float(v) for k, v in m.items() if k != "bad_step"})
        return StepEvent(step_no, self.total, {**self.last, **drawn.metrics}, drawn.tokens, drawn.crc, time=done,
                         compile_s=compile_s)

    def emit(self, event: StepEvent) -> None:
        for h in self.hooks:
            h.on_metrics(event)

    def stop(self, step: int, start: int, state: dict, position, previous, summary: dict) -> None:
        """A signal came before step `step` ran: the hooks of the step before, the batch put back, a save."""
        if previous is not None:
            self.emit(previous)
        self.source.iterator.set_state(position)  # this batch was not trained on
        self.saver.save(step, state, self.last)
        summary["status"] = "interrupted"
        summary["signal"] = int(self.flag.signum)
        _log(f"signal {self.flag.signum}: " + (f"saved checkpoint {step}" if step > start else
                                                "no step ran since the start, nothing to save") + ", stopping")

    def run(self, state: dict, start: int, summary: dict) -> dict:
        """The steps; returns the final state (a signal sets `summary['status']` to 'interrupted')."""
        pending = None  # the step on the device: (step number, metrics, its Drawn, compile seconds)
        for step in range(start, self.total):
            position = self.source.iterator.get_state()
            drawn = self.source.draw(state, step)  # host work while the previous step runs
            previous = self.fetch(pending) if pending is not None else None  # waits for the step in flight
            pending = None
            fn, compile_s = self.program(self.objective.static_at(step, self.total), state, drawn.batch)
            if self.flag.reached(step):  # a signal (here or, on several hosts, on any host): save what is done
                self.stop(step, start, state, position, previous, summary)
                break
            state, metrics = fn(state, self.frozen, drawn.batch)
            pending = (step + 1, metrics, drawn, compile_s)
            if previous is not None:  # its hooks run while this step runs on the device
                self.emit(previous)
            due = [h.due(step + 1, self.total) for h in self.hooks]
            if any(due):
                event = self.fetch(pending)
                pending = None
                event.state = state
                for h, is_due in zip(self.hooks, due):
                    if is_due:
                        h.on_step(event)
                    h.on_metrics(event)
                state = event.state  # a hook may have replaced a companion's state (`train.hooks`)
        if pending is not None:
            self.emit(self.fetch(pending))
        return state
