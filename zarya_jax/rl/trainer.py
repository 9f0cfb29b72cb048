"""The GRPO trainer: `train_rl(cfg, base, workdir, adapter=None) -> summary`, a run of the shared loop
(`train.loop.run_loop`: init-or-restore, the sharded step, hooks, checkpoints, signals, the divergence
guard, trackers) whose batches are rollouts, whose objective is GRPO's and whose hooks evaluate.

Per RL step s (of `train.steps`; one step of the loop):
1. Prompts: `rl.prompts_per_step` records of `data.train`, drawn without replacement by a generator
   seeded with (train.seed, s); each repeated `rl.num_generations` times (prompt-major groups).
2. Rollouts (`rollout.sample`) with the arm's sampler (`config.RLSection.generation_config`) from the
   current policy, keyed by fold_in(rollout key, s); rewards, group advantages, and the sampler's
   log-probabilities as π_old (`grpo.rollout_batch`). Steps 1–3 are the loop's batch source
   (`RolloutBatches`): the batch of a step depends on the params the step before left.
3. The frozen reference's log-probabilities (the base checkpoint's params; skipped when β = 0).
4. `rl.num_iterations` optimizer updates on the same rollouts: the loop's sharded step with that many
   updates per step (`train.step.make_train_step`: mesh and shardings, gradient accumulation, clipping,
   AdamW, the NaN/Inf guard) on the GRPO objective (`grpo_objective`). The batch carries the whole
   batch's completion tokens per row, so `token-mean` is the same loss and gradient at any
   `optim.grad_accum_steps` (`grpo.row_weights`).
5. Arm "refreshed": every `rl.refresh_every` steps, `rl.refresh_steps` TV-loss steps of the LoRA drafter
   (`objectives.drafter.drafter_objective`, block = the draft length, optimizer `rl.refresh_optim`) on this
   step's rollouts, the updated policy as the frozen teacher (`hooks.DrafterRefresh`; the drafter's train
   state is a companion of the policy's, `train.step.TrainSteps.companions`, checkpointed with it).
6. The loop's hooks: the held-out greedy exact match every `train.eval_every` steps, at the end and before
   the first step (`hooks.ExactMatch`), the metrics row (WORKDIR/metrics.jsonl, TensorBoard, a tracker),
   a progress bar, a checkpoint every `train.save_every` steps and at the end, the policy's export.

Resume is exact: everything random comes from the step (prompts, rollouts, the drafter's noise), and
the checkpoint holds every state that changes, so a run killed at any point and rerun repeats the
same steps bit for bit. A workdir holding another run (another config beyond `config.RESUMABLE`,
another base or adapter content) is refused unless `force`. SIGTERM/SIGINT finish the step, save and
return with status 'interrupted'. At the end: WORKDIR/final (the policy, `checkpoint`),
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

from .. import overrides as ov
from ..config import ConfigError, PromptFormat
from ..data import records as records_lib
from ..data import render
from ..files import atomic_write_json, check_writable_dir
from ..inference import Inference, load_for_inference
from .. import checkpoint as ckpt_lib
from ..objectives.base import Objective
from ..objectives.drafter import DrafterConfig, drafter_objective
from ..sampling import GenerationConfig
from ..train import inherit
from ..train import sharding as shd
from ..train import trackers
from ..train.hooks import Export
from ..train.identity import file_fingerprint
from ..train.loop import Drawn, Session, run_loop
from ..train.step import build_steps, host_fingerprint
from . import grpo, rollout
from .config import LORA_ARMS, RLConfig, diff, load_reward
from .hooks import DrafterRefresh, ExactMatch, RolloutClock

RUN_FILE = "rl_run.json"
BATCH_KEYS = ("tokens", "prompt_lengths", "completions", "mask", "old_logprobs", "advantages", "ref_logprobs")
# what the trainer's batches carry besides: the whole batch's completion tokens per row (`grpo.row_weights`)
UPDATE_KEYS = BATCH_KEYS + ("mean_tokens",)
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
    rows, dp = rl.prompts_per_step * rl.num_generations, shd.data_parallel_size(mesh)
    # The policy's update and, in the refreshed arm, the drafter's refresh both split the rollout rows.
    accums = {"optim.grad_accum_steps": cfg.optim.grad_accum_steps}
    if rl.arm == "refreshed":
        accums["rl.refresh_optim.grad_accum_steps"] = rl.refresh_optim.grad_accum_steps
    for key, accum in accums.items():
        if rows % (dp * accum):
            raise ConfigError(f"rl.prompts_per_step × rl.num_generations = {rows} rollout rows: not divisible by the "
                              f"data-parallel size {dp} × {key}={accum}")
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


# --------------------------------------------------------------------------- the objective and the batches
def grpo_objective(config, cfg: grpo.GRPOConfig, temperature: float) -> Objective:
    """GRPO as a trainer `Objective`: the batch carries the rollouts, advantages, reference log-probabilities
    (`BATCH_KEYS`) and, from the trainer, the whole batch's completion tokens per row ("mean_tokens"); the
    export writes the policy as a model checkpoint."""

    def loss_fn(params, frozen, batch, key, info):
        # the per-row arrays travel as [N, 1] (the batch sharding splits rows and replicates dim 1)
        batch = {**batch, "prompt_lengths": batch["prompt_lengths"][:, 0]}
        return grpo.grpo_loss(params, config, batch, batch["advantages"][:, 0], batch["ref_logprobs"], cfg,
                              temperature)

    def export(params, path: str, tokenizer, prompt_format) -> str:
        return ckpt_lib.save(path, jax.device_get(params), config, tokenizer=tokenizer, prompt_format=prompt_format)

    return Objective(loss_fn, forward_passes=1.0, name="grpo", export=export)


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


class RolloutBatches:
    """The loop's batch source (module doc, 1–3): step s's rollouts from the policy in the state before it,
    on the mesh with the reference's log-probabilities; `last` keeps the rollouts (host arrays) for the
    drafter's refresh, `drawn_at[s]` when step s's batch was ready and `ready_at[s]` when the step before
    had finished (its params were needed), for the update's time (`hooks.RolloutClock`)."""

    def __init__(self, su: "Setup", rollout_key):
        self.su, self.rollout_key, self.iterator = su, rollout_key, StepCursor()
        rl, config, mesh = su.cfg.rl, su.model.config, su.mesh
        self.reference = jax.device_put(su.model.params, shd.tree_shardings(su.model.params, mesh))
        self.last: dict | None = None
        self.drawn_at: dict[int, float] = {}
        self.ready_at: dict[int, float] = {}

        @jax.jit
        def ref_logprobs(params, batch):
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                rows = {**batch, "prompt_lengths": batch["prompt_lengths"][:, 0]}
                return grpo.completion_logprobs(params, config, rows, rl.temperature)

        self.ref_logprobs = ref_logprobs

    def draw(self, state: dict, step: int) -> Drawn:
        su, rl = self.su, self.su.cfg.rl
        jax.block_until_ready(state["params"])
        self.ready_at[step] = time.perf_counter()
        pick = np.random.default_rng([su.cfg.train.seed, step]).choice(len(su.train_records), rl.prompts_per_step,
                                                                      replace=False)
        drafter = {} if rl.arm not in LORA_ARMS else {
            "lora_params": state["drafter"]["params"] if "drafter" in state else su.model.adapter,
            "lora": su.model.lora}
        ro = rollout.sample(state["params"], su.model.config, [su.train_records[i] for i in pick],
                            [su.train_prompts[i] for i in pick], su.gcfg, jax.random.fold_in(self.rollout_key, step),
                            su.model.tokenizer, su.reward_fns, rl.num_generations, fmt=su.fmt, **drafter)
        local = {k: np.asarray(v).reshape(len(v), -1) for k, v in ro.batch.items()}
        n, tokens = len(local["mask"]), int(ro.batch["mask"].sum())
        local["mean_tokens"] = np.full((n, 1), tokens / n, np.float32)
        batch = shd.global_batch(local, su.mesh)
        batch["ref_logprobs"] = (self.ref_logprobs(self.reference, batch) if rl.beta
                                 else jnp.zeros_like(batch["old_logprobs"]))
        self.last = ro.batch
        self.iterator.step = step + 1
        self.drawn_at[step] = time.perf_counter()
        return Drawn(batch, tokens, host_fingerprint(local), {"reward": float(np.mean(ro.rewards)), **ro.stats})


# --------------------------------------------------------------------------- the run
def _refresh(su: "Setup", source: RolloutBatches, drafter_key, workdir: str) -> tuple[dict, list]:
    """Arm "refreshed": (the drafter's companion train state, its refresh hook); else ({}, [])."""
    rl, mesh = su.cfg.rl, su.mesh
    if rl.arm != "refreshed":
        return {}, []
    block = DrafterConfig(block_sizes=(max(rl.draft_length, 2),))
    objective = drafter_objective(su.model.config, su.model.lora, block)
    steps = build_steps(objective, rl.refresh_optim, max(su.cfg.train.steps * rl.refresh_steps, 1),
                        lambda key: su.model.adapter, mesh, DRAFT_KEYS, drafter_key,
                        frozen_shardings=shd.tree_shardings(su.model.params, mesh))
    hook = DrafterRefresh(steps.cache, source, rl.refresh_every, rl.refresh_steps, mesh, su.model.lora,
                          draft_batch, workdir)
    return {"drafter": (steps, su.model.adapter)}, [hook]


def train_rl(cfg: RLConfig, base: str, workdir: str, *, adapter: str | None = None, force: bool = False) -> dict:
    """Trains (or resumes) the GRPO run in `workdir` from the checkpoint `base` (module doc). Returns the
    loop's summary plus the arm, the held-out exact match before and after, the mean rollout time."""
    t0 = time.perf_counter()
    shd.maybe_initialize_distributed(cfg.train.distributed)
    su = prepare(cfg, base, workdir, adapter, force)
    rl, config = cfg.rl, su.model.config
    rollout_key, drafter_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(cfg.train.seed), 1))
    source = RolloutBatches(su, rollout_key)
    companions, refresh = _refresh(su, source, drafter_key, workdir)

    def exact_match(params) -> float:
        return rollout.greedy_exact_match(params, config, su.model.tokenizer, su.eval_records, su.eval_prompts,
                                          rl.max_new_tokens, su.fmt, config.eos_token_id)

    evaluate = [ExactMatch(exact_match, cfg.train.eval_every)] if su.eval_prompts else []
    objective = grpo_objective(config, rl.grpo(), rl.temperature)
    session = Session(
        workdir, su.mesh, config, objective, cfg.optim, cfg.train, lambda: source, UPDATE_KEYS,
        rl.prompts_per_step * rl.num_generations, su.gcfg.prompt_bucket + rl.max_new_tokens,
        init_params=su.model.params, updates=rl.num_iterations, companions=companions,
        early_hooks=lambda steps, frozen: [RolloutClock(source), *refresh, *evaluate],
        export=Export(objective.export, workdir, su.model.tokenizer, su.fmt) if cfg.train.export_final else None,
        record=lambda: atomic_write_json(os.path.join(workdir, RUN_FILE), su.identity), config=ov.to_dict(cfg),
        summary={"arm": rl.arm})
    return run_loop(session, t0)
