"""The GRPO trainer: `train_rl(cfg, base, workdir, adapter=None) -> summary`.

Per RL step s (of `train.steps`):
1. Prompts: `rl.prompts_per_step` records of `data.train`, drawn without replacement by a generator
   seeded with (train.seed, s); each repeated `rl.num_generations` times (prompt-major groups).
2. Rollouts (`rollout.sample`) with the arm's sampler (`config.RLSection.generation_config`) from the
   current policy, keyed by fold_in(rollout key, s); rewards, group advantages, and the sampler's
   log-probabilities as π_old (`grpo.rollout_batch`).
3. The frozen reference's log-probabilities (the base checkpoint's params; skipped when β = 0).
4. `rl.num_iterations` optimizer updates on the same rollouts: the trainer's sharded step
   (`train.step.make_train_step`: mesh and shardings, gradient accumulation, clipping, AdamW, the
   NaN/Inf guard) on the GRPO objective (`grpo.grpo_loss`).
5. Arm "refreshed": every `rl.refresh_every` steps, `rl.refresh_steps` TV-loss steps of the LoRA
   drafter (`objectives.drafter.drafter_objective`, block = the draft length) on this step's rollouts,
   the updated policy as the frozen teacher.
6. A metrics.jsonl / TensorBoard / tracker row (`train.metrics.MetricsLog`), the held-out greedy
   exact match every `train.eval_every` steps (and before the first step), a checkpoint every
   `train.save_every` steps and at the end (`train.checkpoints.RunCheckpointer`: the policy's train
   state, and the drafter's for "refreshed"), a progress bar.

Resume is exact: everything random comes from the step (prompts, rollouts, the drafter's noise), and
the checkpoint holds every state that changes, so a run killed at any point and rerun repeats the
same steps bit for bit. A workdir holding another run (another config beyond the logging knobs,
another base or adapter content) is refused unless `force`. SIGTERM/SIGINT finish the step, save and
return with status 'interrupted'. At the end: WORKDIR/final (the policy, `zarya_jax.checkpoint`),
WORKDIR/adapter (the refreshed drafter) and WORKDIR/summary.json.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from .. import checkpoint as model_ckpt
from .. import lock as workdir_lock
from .. import overrides as ov
from ..config import ConfigError, PromptFormat
from ..data import records as records_lib
from ..data import render
from ..files import atomic_write_json, check_writable_dir
from ..inference import Inference, load_for_inference
from ..nn import checkpoint as ckpt_lib
from ..nn import lora as lora_lib
from ..objectives.base import Objective
from ..objectives.drafter import DrafterConfig, drafter_objective
from ..sampling import GenerationConfig
from ..train import inherit
from ..train import sharding as shd
from ..train import trackers
from ..train.checkpoints import RunCheckpointer, abstract_like
from ..train.identity import file_fingerprint
from ..train.metrics import MetricsLog
from ..train.optim import OptimConfig
from ..train.preemption import StopSignal
from ..train.step import (NonFiniteError, StepCache, build_optimizer, init_state, make_eval_step, make_train_step,
                          state_shardings)
from . import grpo, rollout
from .config import LORA_ARMS, RLConfig, diff, load_reward

RUN_FILE = "rl_run.json"
SUMMARY_FILE = "summary.json"
BATCH_KEYS = ("tokens", "prompt_lengths", "completions", "mask", "old_logprobs", "advantages", "ref_logprobs")
DRAFT_KEYS = ("tokens", "segment_ids", "positions", "answer_mask")


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


class StepCursor(grain.DatasetIterator):
    """The data position of a checkpoint: the prompts of a step are drawn from the step itself, so the
    position is the RL step (kept for the checkpoint layout, which stores a data iterator)."""

    def __init__(self, step: int = 0):
        super().__init__()
        self.step = step

    def __next__(self):
        raise StopIteration

    def get_state(self) -> dict:
        return {"step": self.step}

    def set_state(self, state: dict) -> None:
        self.step = int(state["step"])


# --------------------------------------------------------------------------- setup (validation only)
@dataclasses.dataclass
class Setup:
    cfg: RLConfig
    model: Inference
    fmt: PromptFormat
    train_records: list[dict]
    train_prompts: list[list[int]]
    eval_records: list[dict]
    eval_prompts: list[list[int]]
    gcfg: GenerationConfig
    reward_fns: Any
    mesh: Any
    identity: dict


def _prompts(records: list[dict], tokenizer, fmt: PromptFormat, path: str) -> list[list[int]]:
    out = []
    for i, record in enumerate(records):
        ids = tokenizer.encode(render.render(record, tokenizer, fmt)[0])
        if not ids:
            raise ValueError(f"{path}: record {i} has an empty prompt")
        out.append(ids)
    return out


def prepare(cfg: RLConfig, base: str, workdir: str, adapter: str | None, force: bool) -> Setup:
    """Every check before anything is written: the arm and its adapter, the base checkpoint and the tokenizer
    the rollouts read (the base's own unless `data.tokenizer` names another, `train.inherit`), the data,
    the sampler against the model and every prompt, the batch against the mesh, the workdir's run."""
    rl, arm = cfg.rl, cfg.rl.arm
    if arm in LORA_ARMS and not adapter:
        raise ConfigError(f"rl.arm={arm!r} drafts with a LoRA adapter: give --adapter DIR (a drafter trained with "
                          "experiments.train_drafter on the base checkpoint)")
    if adapter and arm not in LORA_ARMS:
        raise ConfigError(f"--adapter {adapter!r}: only the LoRA arms {LORA_ARMS} draft with an adapter, not "
                          f"rl.arm={arm!r}")
    if not cfg.data.train:
        raise ConfigError("data.train: expected a JSONL file of prompt records (--set data.train=FILE)")
    trackers.check(cfg.train.tracker)
    check_writable_dir(workdir, "--workdir")
    model = load_for_inference(base, tokenizer=cfg.data.tokenizer or None, adapter=adapter,
                               verify=cfg.train.verify_checkpoints)
    inherit.check_tokenizer(model.tokenizer_spec, base, model.config, cfg.train.allow_tokenizer_mismatch, "--base")
    fmt = model.prompt_format
    train_records = records_lib.read_jsonl(cfg.data.train, fmt)
    if len(train_records) < rl.prompts_per_step:
        raise ConfigError(f"rl.prompts_per_step={rl.prompts_per_step}: data.train {cfg.data.train!r} has only "
                          f"{len(train_records)} records")
    eval_records = records_lib.read_jsonl(cfg.data.eval, fmt)[:cfg.data.eval_size] if cfg.data.eval else []
    train_prompts = _prompts(train_records, model.tokenizer, fmt, cfg.data.train)
    eval_prompts = _prompts(eval_records, model.tokenizer, fmt, cfg.data.eval)
    # one prompt bucket for every step: the sampler and the update compile once, whatever prompts a step draws
    gcfg = rl.generation_config().replace(prompt_bucket=rollout.width_bucket(max(map(len, train_prompts))))
    gcfg.validate(model.config, train_prompts)
    if eval_prompts:
        gcfg.replace(mode="ar", temperature=0.0).validate(model.config, eval_prompts)
    reward_fns = load_reward(rl.reward, fmt)
    mesh = shd.make_mesh(cfg.mesh)
    rows, dp, accum = rl.prompts_per_step * rl.num_generations, shd.data_parallel_size(mesh), cfg.optim.grad_accum_steps
    if rows % (dp * accum):
        raise ConfigError(f"rl.prompts_per_step × rl.num_generations = {rows} rollout rows: not divisible by the "
                          f"data-parallel size {dp} × optim.grad_accum_steps={accum}")
    identity = {"config": ov.to_dict(cfg), "base": _fingerprint(base, ckpt_lib.CHECKSUMS_FILE),
                "adapter": _fingerprint(adapter, "adapter.safetensors") if adapter else None}
    _check_run(workdir, cfg, identity, force)
    return Setup(cfg, model, fmt, train_records, train_prompts, eval_records, eval_prompts, gcfg, reward_fns, mesh,
                 identity)


def _fingerprint(directory: str, name: str) -> Any:
    path = os.path.join(directory, name)
    return file_fingerprint(path) if os.path.isfile(path) else os.path.realpath(directory)


def _check_run(workdir: str, cfg: RLConfig, identity: dict, force: bool) -> None:
    """A workdir with a recorded run continues only that run (same config beyond `config.RESUMABLE`,
    same base and adapter content) unless forced."""
    path = os.path.join(workdir, RUN_FILE)
    if force or not os.path.isfile(path):
        return
    with open(path) as f:
        recorded = json.load(f)
    problems = diff(ov.build(RLConfig, recorded["config"]), cfg)
    problems += [f"{k}: another file" for k in ("base", "adapter") if recorded.get(k) != identity[k]]
    if problems:
        raise ConfigError(f"--workdir {workdir} holds another RL run ({'; '.join(problems[:3])}): use another "
                          "workdir, or --force to continue it with this config")


# --------------------------------------------------------------------------- the objectives
def grpo_objective(config, cfg: grpo.GRPOConfig, temperature: float) -> Objective:
    """GRPO as a trainer `Objective`: the batch carries the rollouts, advantages and reference
    log-probabilities (`BATCH_KEYS`)."""

    def loss_fn(params, frozen, batch, key, info):
        # the per-row arrays travel as [N, 1] (the batch sharding splits rows and replicates dim 1)
        batch = {**batch, "prompt_lengths": batch["prompt_lengths"][:, 0]}
        return grpo.grpo_loss(params, config, batch, batch["advantages"][:, 0], batch["ref_logprobs"], cfg,
                              temperature)

    return Objective(loss_fn, forward_passes=1.0, name="grpo")


def draft_batch(batch: dict) -> dict:
    """A drafter-training batch (`data.batch` layout) from the rollouts: prompt + completion as one
    example, the completion supervised."""
    tokens, lengths, mask = batch["tokens"], batch["prompt_lengths"], batch["mask"]
    n, w = tokens.shape
    idx = np.arange(w)[None, :]
    ends = lengths[:, None] + mask.sum(1)[:, None]
    return {"tokens": tokens, "segment_ids": (idx < ends).astype(np.int32),
            "positions": np.broadcast_to(idx, (n, w)).astype(np.int32),
            "answer_mask": ((idx >= lengths[:, None]) & (idx < ends)).astype(np.int32)}


# --------------------------------------------------------------------------- the run
def train_rl(cfg: RLConfig, base: str, workdir: str, *, adapter: str | None = None, force: bool = False) -> dict:
    """Trains (or resumes) the GRPO run in `workdir` from the checkpoint `base` (module doc). Returns the
    summary (status, step, final exact match, mean rollout time, …)."""
    t_start = time.perf_counter()
    shd.maybe_initialize_distributed(cfg.train.distributed)
    su = prepare(cfg, base, workdir, adapter, force)
    rl, tc, mesh = cfg.rl, cfg.train, su.mesh
    config = su.model.config
    total_updates = tc.steps * rl.num_iterations
    run_key = jax.random.PRNGKey(tc.seed)
    k_state, k_roll, k_draft = jax.random.split(run_key, 3)

    optimizer, trainable_mask = build_optimizer(cfg.optim, total_updates, su.model.params)
    abstract = {"policy": jax.eval_shape(lambda p: init_state(p, optimizer, k_state), su.model.params)}
    sh = {"policy": state_shardings(abstract["policy"], optimizer, mesh)}
    params_sh = sh["policy"]["params"]
    refreshed = rl.arm == "refreshed"
    if refreshed:
        d_optim = OptimConfig(lr=rl.refresh_lr, warmup_steps=0, schedule="constant", weight_decay=0.0)
        d_optimizer, _ = build_optimizer(d_optim, max(tc.steps * rl.refresh_steps, 1), su.model.adapter)
        abstract["drafter"] = jax.eval_shape(lambda p: init_state(p, d_optimizer, k_draft), su.model.adapter)
        sh["drafter"] = state_shardings(abstract["drafter"], d_optimizer, mesh)
        d_obj = drafter_objective(config, su.model.lora, DrafterConfig(block_sizes=(max(rl.draft_length, 2),)))
        d_steps = StepCache(make_train_step(d_obj, d_optimizer, d_optim, 1, mesh),
                            make_eval_step(d_obj, 1, mesh), sh["drafter"], params_sh, mesh, DRAFT_KEYS)
    objective = grpo_objective(config, rl.grpo(), rl.temperature)
    steps = StepCache(make_train_step(objective, optimizer, cfg.optim, total_updates, mesh, trainable_mask),
                      make_eval_step(objective, total_updates, mesh), sh["policy"], None, mesh, BATCH_KEYS)
    reference = jax.device_put(su.model.params, params_sh)

    @jax.jit
    def ref_logprobs(params, batch):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return grpo.completion_logprobs(params, config, {**batch, "prompt_lengths": batch["prompt_lengths"][:, 0]},
                                            rl.temperature)

    # ---- state: restore or initialise; a failure here leaves a workdir this call created as it was
    created = workdir_lock.is_new(workdir)
    os.makedirs(workdir, exist_ok=True)
    ckpt = RunCheckpointer(workdir, keep=tc.keep, keep_best=0, async_save=tc.async_checkpointing)
    cursor = StepCursor()
    try:
        latest = ckpt.latest_step()
        if latest is not None:
            state, _ = ckpt.restore(latest, abstract_like(abstract, sh), cursor, verify=tc.verify_checkpoints)
            _log(f"resumed from {ckpt.step_dir(latest)}")
        else:
            # the trees are arguments, not constants of the program: written straight into the shardings
            init = {"policy": (lambda p: init_state(p, optimizer, k_state), su.model.params)}
            if refreshed:
                init["drafter"] = (lambda p: init_state(p, d_optimizer, k_draft), su.model.adapter)
            state = {k: jax.jit(f, out_shardings=sh[k])(jax.device_put(tree, sh[k]["params"]))
                     for k, (f, tree) in init.items()}
        if jax.process_index() == 0:
            atomic_write_json(os.path.join(workdir, RUN_FILE), su.identity)
    except BaseException:
        ckpt.close()
        if created and jax.process_index() == 0:
            workdir_lock.clear(workdir)
        raise
    start = latest or 0

    tracker = None if tc.tracker == "none" else (lambda: trackers.open_tracker(
        tc.tracker, project=tc.tracker_project, group=tc.tracker_group, name=tc.tracker_run,
        config=ov.to_dict(cfg), workdir=workdir))
    log = MetricsLog(workdir, start, tracker=tracker)
    bar = tqdm(total=tc.steps, initial=start, desc=f"rl[{rl.arm}]", dynamic_ncols=True,
               disable=not (tc.progress_bar and jax.process_index() == 0))
    eos = config.eos_token_id

    def exact_match(params) -> float:
        return rollout.greedy_exact_match(params, config, su.model.tokenizer, su.eval_records, su.eval_prompts,
                                          rl.max_new_tokens, su.fmt, eos)

    summary: dict[str, Any] = {"status": "completed", "workdir": os.path.abspath(workdir), "arm": rl.arm,
                               "start_step": start}
    rollout_times, flag, saved = [], StopSignal(), latest
    try:
        if start == 0 and su.eval_prompts:
            em = exact_match(state["policy"]["params"])
            log.write(0, {"eval_exact_match": em})
            summary["initial_exact_match"] = em
        for step in range(start, tc.steps):
            if flag.reached(step):
                if saved != step:
                    ckpt.save(step, state, StepCursor(step), {"step": step})
                summary.update(status="interrupted", signal=int(flag.signum))
                _log(f"signal {flag.signum}: saved checkpoint {step}, stopping")
                break
            row = _rl_step(su, state, step, steps, ref_logprobs, reference, k_roll, k_draft,
                           d_steps if refreshed else None)
            rollout_times.append(row["rollout_s"])
            done = step + 1
            if su.eval_prompts and ((tc.eval_every and done % tc.eval_every == 0) or done == tc.steps):
                row["eval_exact_match"] = exact_match(state["policy"]["params"])
                summary["final_exact_match"] = row["eval_exact_match"]
            if (tc.log_every and done % tc.log_every == 0) or done == tc.steps or "eval_exact_match" in row:
                log.write(done, row)
            if (tc.save_every and done % tc.save_every == 0) or done == tc.steps:
                ckpt.save(done, state, StepCursor(done), {"step": done, "loss": row["loss"]})
                saved = done
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", tpf=f"{row['tokens_per_forward']:.2f}",
                            roll_s=f"{row['rollout_s']:.1f}")
    finally:
        flag.restore()
        bar.close()
        log.close()
        ckpt.close()
    summary["step"] = int(state["policy"]["step"]) // rl.num_iterations
    summary["rollout_s_mean"] = float(np.mean(rollout_times[1:] or rollout_times)) if rollout_times else None
    if summary["status"] == "completed" and jax.process_index() == 0:
        summary["final_params"] = _export(state, su, workdir)
    summary["wall_s"] = time.perf_counter() - t_start
    if summary["status"] == "completed" and jax.process_index() == 0:
        atomic_write_json(os.path.join(workdir, SUMMARY_FILE), summary, default=str)
    return summary


def _rl_step(su: Setup, state: dict, step: int, steps: StepCache, ref_logprobs, reference, k_roll, k_draft,
             d_steps: StepCache | None) -> dict:
    """One RL step (module doc, 1–5), updating `state` in place; returns its metrics row."""
    rl, mesh, config = su.cfg.rl, su.mesh, su.model.config
    rng = np.random.default_rng([su.cfg.train.seed, step])
    pick = rng.choice(len(su.train_records), rl.prompts_per_step, replace=False)
    drafter = {} if rl.arm not in LORA_ARMS else {
        "lora_params": state["drafter"]["params"] if d_steps is not None else su.model.adapter, "lora": su.model.lora}
    ro = rollout.sample(state["policy"]["params"], config, [su.train_records[i] for i in pick],
                        [su.train_prompts[i] for i in pick], su.gcfg, jax.random.fold_in(k_roll, step),
                        su.model.tokenizer, su.reward_fns, rl.num_generations, fmt=su.fmt, **drafter)
    batch = shd.global_batch({k: np.asarray(v).reshape(len(v), -1) for k, v in ro.batch.items()}, mesh)
    batch["ref_logprobs"] = (ref_logprobs(reference, batch) if rl.beta else jnp.zeros_like(batch["old_logprobs"]))
    t0 = time.perf_counter()
    for _ in range(rl.num_iterations):
        state["policy"], metrics = steps.train(None)(state["policy"], None, batch)
    m = jax.device_get(metrics)
    update_s = time.perf_counter() - t0
    if int(m["bad_step"]) >= 0:
        raise NonFiniteError(f"the GRPO loss or gradient became non-finite at RL step {step + 1} "
                             f"(loss={float(m['loss'])}, grad_norm={float(m['grad_norm'])}); the state was not "
                             "updated. Lower optim.lr or rl.epsilon.")
    row = {"loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]), "kl": float(m["kl"]),
           "clip_fraction": float(m["clip_fraction"]), "ratio": float(m["ratio"]),
           "reward": float(np.mean(ro.rewards)),
           "update_s": update_s, **ro.stats}
    if d_steps is not None and (step + 1) % rl.refresh_every == 0 and rl.refresh_steps:
        pair = shd.global_batch(draft_batch(ro.batch), mesh)
        for _ in range(rl.refresh_steps):
            state["drafter"], dm = d_steps.train(None)(state["drafter"], state["policy"]["params"], pair)
        dm = jax.device_get(dm)
        if int(dm["bad_step"]) >= 0:
            raise NonFiniteError(f"the drafter refresh became non-finite at RL step {step + 1}; lower rl.refresh_lr")
        row.update(drafter_tv=float(dm["tv"]), drafter_accept_proxy=float(dm["accept_proxy"]))
    return row


def _export(state: dict, su: Setup, workdir: str) -> str:
    """WORKDIR/final (the policy) and, for the refreshed arm, WORKDIR/adapter; kept when already there
    (a rerun of a finished run)."""
    path = os.path.join(workdir, "final")
    if not os.path.isdir(path):
        model_ckpt.save(path, jax.device_get(state["policy"]["params"]), su.model.config,
                        tokenizer=su.model.tokenizer, prompt_format=su.fmt)
    if "drafter" in state and not os.path.isdir(os.path.join(workdir, "adapter")):
        lora_lib.save(os.path.join(workdir, "adapter"), jax.device_get(state["drafter"]["params"]), su.model.lora)
    return os.path.abspath(path)
