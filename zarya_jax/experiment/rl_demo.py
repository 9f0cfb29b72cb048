"""The RL experiment (`python -m experiments.rl --demo`): GRPO with AR rollouts against lossless
speculative rollouts, from one imperfect base, with the same seeds.

Stages, each resumable in its own folder of the workdir:
1. data/: the quickstart's arithmetic task (`eval.tasks`), and `sft_train.jsonl`, its training split with
   the final line of a fraction `unmarked` of the answers restated from `#### N` to `so N` (`unmark`);
2. train/: a short SFT of the quickstart's tiny Zarya on `sft_train.jsonl` (its training sections,
   `DEMO_SFT` steps). The base is imperfect on purpose, in a way RL can see: it often computes the right
   value but states it in the form the reward and the exact match do not read, so a group's completions
   differ in reward for a reason the policy controls (docs/rl.md, the probe);
3. drafter/: Uno's LoRA drafter on that checkpoint (the frozen and refreshed arms start from it);
4. arms/<arm>/: `rl.trainer.train_rl` per arm, every arm with the same config and seeds;
5. report.json, report.md, report.png: per arm the held-out greedy exact match before and after, the
   reward, the accepted draft tokens per cycle at the start and the end of RL, the rollout tokens per
   forward and wall time; the plot draws exact match and accepted tokens per cycle against the RL step
   and the speed per arm.
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from .. import overrides as ov
from ..config import PromptFormat
from ..eval import tasks
from ..files import atomic_write, atomic_write_json
from ..inference import load_for_inference
from ..provenance import describe, provenance
from ..rl import config as rl_config
from ..rl.plots import rl_plot
from ..rl.trainer import train_rl
from ..train.metrics import read_metrics
from . import config as exp_config
from . import stages

# On bases whose only errors are wrong values (difficulty 2, 22% greedy; difficulty 1, 36%) no learning
# rate raised the held-out exact match in 30 steps: few samples are right, so few groups carry an advantage
# (docs/rl.md, the probe). With SFT answers unmarked, a 1000-step base computes the right value for about
# 60% of the held-out problems but marks it for fewer, and at 1e-4 GRPO teaches it the marker. At half
# unmarked the base's greedy choice of the form is close to a coin flip (16% exact match in one SFT, 55% in
# another), so the demo unmarks 80%: the base then mostly answers `so N`, while its samples still state
# `#### N` often enough for most groups to hold both forms.
UNMARKED = 0.8
# The SFT stage pins the batch, warmup, drafter batch and remat its measured table was trained with (docs/rl.md).
DEMO_SFT = {"task.difficulty": 1, "task.num_train": 20000, "task.num_test": 64, "task.num_val": 0,
            "data.batch_size": 32, "optim.warmup_steps": 100, "train.steps": 1000, "drafter.steps": 150,
            "drafter.batch_size": 16, "model.remat": False, "frontier.enabled": False}
DEMO_RL = {"rl.prompts_per_step": 8, "rl.num_generations": 8, "rl.max_new_tokens": 40, "rl.draft_length": 4,
           "rl.beta": 0.02, "rl.refresh_every": 5, "rl.refresh_steps": 5, "optim.lr": 1e-4, "train.steps": 30,
           "train.eval_every": 5, "train.save_every": 10, "data.eval_size": 64}
SMOKE_SFT = {**exp_config.SMOKE, "task.num_val": 0, "frontier.enabled": False,
             "drafter.steps": 3, "drafter.batch_size": 4, "drafter.objective.block_sizes": [2, 4]}
TITLE = "GRPO: AR vs lossless speculative rollouts"
SMOKE_RL = {"rl.prompts_per_step": 2, "rl.num_generations": 2, "rl.max_new_tokens": 8, "rl.draft_length": 4,
            "rl.refresh_every": 1, "rl.refresh_steps": 1, "train.steps": 2, "train.eval_every": 1,
            "data.eval_size": 4, "mesh.num_devices": 1}


def configs(smoke: bool, overrides) -> tuple[exp_config.ExperimentConfig, rl_config.RLConfig]:
    """The SFT/drafter config (the quickstart's tree; `--set sft.KEY=VALUE` reaches it) and the RL config
    (every other `--set` key, e.g. `rl.beta=0.02`, `optim.lr=1e-4`)."""
    items = ov.parse_all(overrides)
    sft_items = {k[4:]: v for k, v in items.items() if k.startswith("sft.")}
    rl_items = {k: v for k, v in items.items() if not k.startswith("sft.")}
    sft = ov.apply(exp_config.default_config(), {**(SMOKE_SFT if smoke else DEMO_SFT), **sft_items})
    return sft, rl_config.build({**(SMOKE_RL if smoke else DEMO_RL), **rl_items})


def unmark(records: list[dict], fraction: float, seed: int = 0) -> list[dict]:
    """`records` with the final `#### N` line of each answer restated as `so N` with probability `fraction`
    (a generator seeded with `seed`; prompts and worked lines unchanged). An unmarked answer states its
    value in a form the `final` answer extraction does not read."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"unmarked fraction {fraction!r}: expected a value in [0, 1]")
    rng = np.random.default_rng(seed)
    out = []
    for record, draw in zip(records, rng.random(len(records))):
        head, marker, value = record["answer"].rpartition("#### ")
        out.append({**record, "answer": f"{head}so {value}"} if marker and draw < fraction else record)
    return out


def run(workdir: str, *, smoke: bool = False, arms=rl_config.ARMS, overrides=(), force: bool = False,
        unmarked: float = UNMARKED) -> dict:
    """Runs (or resumes) the experiment into `workdir` and returns the report (module doc)."""
    bad = [a for a in arms if a not in rl_config.ARMS]
    if bad or not arms:
        raise ValueError(f"--arms {','.join(arms)}: expected a non-empty subset of {rl_config.ARMS}")
    if not 0.0 <= unmarked <= 1.0:
        raise ValueError(f"--unmarked={unmarked}: expected a fraction in [0, 1]")
    sft, rl = configs(smoke, overrides)
    t0 = time.perf_counter()
    os.makedirs(workdir, exist_ok=True)
    fmt = PromptFormat.of(sft.data)
    splits = stages.prepare_data(sft.task, workdir, fmt=fmt, need_val=False)
    sft_train = os.path.join(workdir, "data", "sft_train.jsonl")
    tasks.write_jsonl(sft_train, unmark(tasks.read_jsonl(splits.train, fmt), unmarked, sft.task.seed))
    sft_splits = dataclasses.replace(splits, train=sft_train)
    trained = stages.train(sft.trainer, sft_splits, workdir, force=force)
    base = load_for_inference(trained.ckpt, verify=sft.train.verify_checkpoints)
    t_sft = time.perf_counter()
    adapter = None
    if any(a in rl_config.LORA_ARMS for a in arms):  # the drafter learns the base's own outputs: the SFT data
        stages.train_drafter(sft.drafter, sft.trainer, base, sft_train, workdir, force=force)
        adapter = os.path.join(workdir, "drafter", "adapter")
    t_drafter = time.perf_counter()
    rows = []
    for arm in arms:
        cfg = ov.apply(rl, {"rl.arm": arm, "data.train": splits.train, "data.eval": splits.test})
        out = os.path.join(workdir, "arms", arm)
        summary = train_rl(cfg, trained.ckpt, out, adapter=adapter if arm in rl_config.LORA_ARMS else None,
                           force=force)
        if summary["status"] != "completed":
            raise stages.TrainingInterrupted(f"RL arm {arm} stopped by signal {summary.get('signal')}; rerun to "
                                             "resume", summary.get("signal"))
        rows.append(arm_result(arm, out, summary))
    report = {"provenance": provenance(), "arms": rows,
              "config": {"sft": ov.to_dict(sft), "rl": ov.to_dict(rl), "unmarked": unmarked},
              "base_checkpoint": trained.ckpt, "smoke": smoke,
              "timings": {"sft_s": t_sft - t0, "drafter_s": t_drafter - t_sft,
                          "rl_s": time.perf_counter() - t_drafter, "wall_s": time.perf_counter() - t0}}
    atomic_write_json(os.path.join(workdir, "report.json"), report, default=str)
    atomic_write(os.path.join(workdir, "report.md"), report_markdown(report))
    rl_plot(rows, os.path.join(workdir, "report.png"), title=TITLE)
    return report


def arm_result(arm: str, workdir: str, summary: dict) -> dict:
    """One arm's row and curves from its metrics.jsonl."""
    metrics = read_metrics(workdir)
    steps = [m for m in metrics if "loss" in m]
    em = [(m["step"], m["eval_exact_match"]) for m in metrics if "eval_exact_match" in m]
    acc = [(m["step"], m["accepted_per_cycle"]) for m in steps if "accepted_per_cycle" in m]
    later = steps[1:] or steps  # the first step's rollout time includes compiling the sampler

    def mean(key, rows=steps):
        vals = [m[key] for m in rows if key in m]
        return float(np.mean(vals)) if vals else None

    return {"arm": arm, "exact_match_start": em[0][1] if em else None, "exact_match_end": em[-1][1] if em else None,
            "reward_start": steps[0]["reward"] if steps else None, "reward_end": steps[-1]["reward"] if steps else None,
            "accepted_start": acc[0][1] if acc else None, "accepted_end": acc[-1][1] if acc else None,
            "tokens_per_forward": mean("tokens_per_forward"), "rollout_s": mean("rollout_s", later),
            "update_s": mean("update_s", later), "active_rows": mean("active_rows"), "wall_s": summary.get("wall_s"),
            "curves": {"exact_match": em, "accepted_per_cycle": acc,
                       "reward": [(m["step"], m["reward"]) for m in steps]}}


def _f(x, fmt="{:.2f}"):
    return "–" if x is None else fmt.format(x)


def report_markdown(report: dict) -> str:
    lines = [f"# {TITLE}", "", describe(report.get("provenance") or {}), "",
             "| arm | exact match start → end | reward start → end | accepted/cycle start → end | "
             "tokens/forward | rollout s/step | update s/step | active rows | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["arms"]:
        pct = lambda x: _f(None if x is None else 100 * x, "{:.1f}%")
        lines.append(f"| {r['arm']} | {pct(r['exact_match_start'])} → {pct(r['exact_match_end'])} | "
                     f"{_f(r['reward_start'])} → {_f(r['reward_end'])} | {_f(r['accepted_start'])} → "
                     f"{_f(r['accepted_end'])} | {_f(r['tokens_per_forward'])} | {_f(r['rollout_s'], '{:.3f}')} | "
                     f"{_f(r['update_s'], '{:.3f}')} | {_f(r['active_rows'])} | {_f(r['wall_s'], '{:.0f}')} |")
    t = report.get("timings", {})
    lines.append("")
    lines.append(f"SFT {_f(t.get('sft_s'), '{:.0f}')} s, drafter {_f(t.get('drafter_s'), '{:.0f}')} s, RL "
                 f"{_f(t.get('rl_s'), '{:.0f}')} s, total {_f(t.get('wall_s'), '{:.0f}')} s"
                 + (" (smoke size)" if report.get("smoke") else ""))
    return "\n".join(lines) + "\n"
