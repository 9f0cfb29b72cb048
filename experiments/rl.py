"""GRPO post-training with AR or lossless speculative rollouts (docs/rl.md).

    python -m experiments.rl --base CKPT --workdir W --set data.train=FILE.jsonl [--set data.eval=FILE.jsonl]
        [--arm ar|frozen|refreshed|self] [--adapter DIR] [--set rl.num_generations=4 --set rl.beta=0.04 ...]
    python -m experiments.rl --demo [--workdir runs/rl-demo] [--smoke]

The run (`zarya_jax.rl.trainer`, a run of the shared training loop): per RL step,
`rl.prompts_per_step` prompts × `rl.num_generations` completions sampled by the arm's sampler from the
current policy, rewards (exact match of the final `####` answer + 0.1 × a format term, or
`rl.reward=module.function`), group-normalised advantages, the clipped objective with a k3 KL penalty to
the base checkpoint (β = rl.beta, ε = rl.epsilon, rl.num_iterations updates per batch,
rl.loss_agg_mode), AdamW (optim.*). Arms (the rollouts are the policy's samples in every arm, so they
differ in speed only):
  ar         plain AR sampling
  frozen     Ψ-Spec with the LoRA drafter of --adapter, never updated
  refreshed  the same drafter, refreshed every rl.refresh_every steps by rl.refresh_steps TV-loss steps
             on the latest rollouts (the current policy as teacher)
  self       Ψ-Spec with the Zarya self-drafter (the policy's own mask rows)
Modes mdm and slotted are refused: their tokens are not samples of the AR policy.

Outputs in W: metrics.jsonl (+ tb/), checkpoints/ (exact resume: rerun the same command), final/ (the
policy), adapter/ (refreshed arm), summary.json. `--demo` runs the whole experiment (docs/rl.md): data
at difficulty 1, a short SFT of a tiny Zarya on answers mostly unmarked (`so N`, see --unmarked), its
LoRA drafter, then GRPO per arm with the same seeds and a report (report.md, report.json, report.png) in W.
Exit status: 0 done, 2 bad input (one `error:` line, nothing written), 3 diverged, 128 + signal when
interrupted (rerun to resume).
"""
from __future__ import annotations

import argparse
import json

from zarya_jax import overrides
from zarya_jax.rl import config as rl_config

from . import cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.rl", description=__doc__,
                                epilog=overrides.help_table(rl_config.knobs()),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="the policy's starting checkpoint (zarya_jax.checkpoint); also the KL reference")
    p.add_argument("--workdir", default=None, help="run directory (default runs/rl-demo with --demo)")
    p.add_argument("--arm", default=None, help=f"rollout sampler, one of {rl_config.ARMS} (rl.arm; default ar)")
    p.add_argument("--adapter", default=None, help="LoRA drafter directory for the arms frozen and refreshed")
    p.add_argument("--demo", action="store_true", help="the whole experiment: SFT, drafter, GRPO per arm, report")
    p.add_argument("--smoke", action="store_true", help="with --demo: a seconds-long version (tests)")
    p.add_argument("--arms", default=None, help="with --demo: the arms to run, comma-separated (default all)")
    p.add_argument("--unmarked", type=float, default=None,
                   help="with --demo: the fraction of the SFT answers whose final line reads `so N` instead of "
                        "`#### N` (default 0.8; 0: the task as it is)")
    cli.add_run_flags(p)
    return p


def main(argv=None) -> int:
    args = cli.parse_args(parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    if args.demo:
        from zarya_jax.experiment import rl_demo as demo

        if args.base or args.adapter or args.arm:
            raise ValueError("--demo trains its own base and drafter and runs every arm: drop --base, --adapter, --arm")
        if args.unmarked is not None and not 0.0 <= args.unmarked <= 1.0:
            raise ValueError(f"--unmarked={args.unmarked}: expected a fraction in [0, 1]")
        workdir = args.workdir or "runs/rl-demo"
        cli.check_workdir(workdir, {})
        arms = tuple(a for a in (args.arms or ",".join(rl_config.ARMS)).split(",") if a)
        with cli.training_lock(workdir, "experiments.rl"):
            report = demo.run(workdir, smoke=args.smoke, arms=arms, overrides=cli.run_overrides(args),
                              force=args.force, unmarked=demo.UNMARKED if args.unmarked is None else args.unmarked)
        print(demo.report_markdown(report))
        return 0
    if args.unmarked is not None:
        raise ValueError("--unmarked shapes the demo's SFT data: it needs --demo")
    if not args.base or not args.workdir:
        raise ValueError("expected --base CKPT and --workdir DIR (or --demo)")
    flags = {"rl.arm": args.arm} if args.arm is not None else {}
    cfg = rl_config.build(cli.set_overrides(argparse.Namespace(overrides=cli.run_overrides(args)), flags))
    cli.check_workdir(args.workdir, {"--base": args.base, "--adapter": args.adapter, "data.train": cfg.data.train,
                                     "data.eval": cfg.data.eval})
    from zarya_jax.rl.trainer import train_rl

    with cli.training_lock(args.workdir, "experiments.rl", cfg.train.distributed):
        summary = train_rl(cfg, args.base, args.workdir, adapter=args.adapter, force=args.force)
    print(json.dumps(summary, indent=2, default=str))
    return cli.run_status(summary)


if __name__ == "__main__":
    cli.main(main)
