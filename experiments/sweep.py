"""Sweeps: run a grid or a list of config overrides one after another, resumably, and tabulate.

    python -m experiments.sweep experiments/sweeps/paper_ablations.yaml [--workdir DIR]
        [--host-index I --num-hosts N] [--set key=value ...] [--dry-run] [--collect-only]

A sweep file (YAML or JSON):

    name: my_sweep
    base:                      # overrides applied to every run (dotted keys into the run config)
      train.steps: 300
    runs:                      # an explicit list of runs; each a dict of overrides, `name` optional
      - {name: curriculum}
      - {name: fixed4, zarya.slot_size_set: [4], zarya.slot_step_borders: [1.0]}
    grid:                      # a cartesian product (crossed with `runs` when both are given)
      zarya.diffusion_loss_proportion: [0.25, 0.5]

The run config is the quickstart's (`zarya_jax.experiment.ExperimentConfig`: sections task, model,
zarya, optim, data, mesh, train, drafter, draft_model, eval, frontier, goals); its dotted keys are typed and checked by
`zarya_jax.overrides` for every run before anything runs (also by --dry-run, which prints each run's
typed overrides). Each run trains a model and evaluates it in the configured decoding modes.
Resumable: a finished run leaves `<workdir>/<run>/DONE.json` (written atomically, so a killed run
never looks finished) and is skipped next time; a failed run is recorded and retried next time. A
finished run whose config has changed since (a new `--set`, an edited sweep file) is refused up front
unless `--force`, which reruns it (and resumes its training whatever its config). Run names are single
folder names: a name that would leave the workdir (`../x`, `a/b`) is an error.
For pods, each host takes runs i with i % num_hosts == host_index. After the runs, the results of
every finished run (from any host, via the shared workdir) are collected into `results.csv`,
`results.md` and `results.png`. The engine is `zarya_jax.experiment.sweep`.
"""
from __future__ import annotations

import argparse
import os
import sys

from zarya_jax.experiment import sweep as engine
from zarya_jax.lock import host_lock_name, workdir_lock
from zarya_jax.experiment.sweep import DONE, SweepError, load_spec  # noqa: F401  (their former home)

from . import cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="sweep file (.yaml/.yml/.json)")
    p.add_argument("--workdir", default=None, help="default: runs/sweeps/<name>")
    p.add_argument("--host-index", type=int, default=0, help="this host's index (pods)")
    p.add_argument("--num-hosts", type=int, default=1, help="number of hosts sharing the sweep")
    cli.add_set_flag(p)
    p.add_argument("--dry-run", action="store_true",
                   help="validate every run's overrides, list this host's runs with their typed values, run nothing")
    p.add_argument("--collect-only", action="store_true", help="only rebuild the results table from finished runs")
    p.add_argument("--force", action="store_true",
                   help="rerun finished runs whose config changed, and resume trainings whatever their config")
    p.add_argument("--no-verify", action="store_true",
                   help="read checkpoints without checking their checksums (train.verify_checkpoints=false)")
    return p


def main(argv=None) -> int:
    args = cli.parse_args(build_parser(), argv)
    return cli.run(lambda: _run(args), "; rerun to resume (finished runs are skipped)")


def _run(args) -> int:
    spec = load_spec(args.spec)
    extra = cli.set_overrides(args, {"train.verify_checkpoints": False} if args.no_verify else {})
    workdir = args.workdir or engine.default_workdir(spec)
    if args.dry_run:
        print("\n".join(engine.dry_run(spec, extra, args.host_index, args.num_hosts, workdir)))
        return 0
    cli.check_workdir(workdir, {"sweep file": args.spec},
                      ("sweep.json", "results.csv", "results.md", "results.png") + tuple(n for n, _ in engine.expand(spec)))
    with workdir_lock(workdir, "experiments.sweep", name=host_lock_name(args.host_index, args.num_hosts)):
        status, written = engine.sweep(spec, workdir, extra=extra, host_index=args.host_index,
                                       num_hosts=args.num_hosts, force=args.force, collect_only=args.collect_only)
    print(open(os.path.join(workdir, "results.md")).read())
    print("wrote " + ", ".join(written))
    if status["failed"]:
        print(f"error: {len(status['failed'])} run(s) failed: {status['failed']} (rerun to retry them)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cli.main(main)
