"""Write the embedded arithmetic task's train/test (and validation) JSONL (`zarya_jax.eval.tasks`).

    python -m experiments.tasks --out data/ --train 20000 --test 200 [--val 100] --difficulty 1 --seed 0
    python -m experiments.tasks --out data_long/ --task long      # worked solutions, 123–271 tokens an answer
"""
from __future__ import annotations

import argparse

from zarya_jax.eval import tasks
from zarya_jax.files import check_output, check_writable_dir

from . import cli


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for train.jsonl, test.jsonl (and val.jsonl)")
    p.add_argument("--train", type=int, default=20000, help="number of training problems")
    p.add_argument("--test", type=int, default=200, help="number of held-out problems")
    p.add_argument("--val", type=int, default=0, help="number of validation problems (val.jsonl; 0 = none)")
    p.add_argument("--task", default="arith", help=f"the task: one of {sorted(tasks.TASKS)} (default arith)")
    p.add_argument("--difficulty", type=int, default=1, choices=sorted(tasks.DIFFICULTY))
    p.add_argument("--seed", type=int, default=0)
    args = cli.parse_args(p, argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    for flag in ("train", "test", "val"):
        if not 0 <= getattr(args, flag) <= tasks.MAX_PROBLEMS:
            raise ValueError(f"--{flag}={getattr(args, flag)}: expected 0 … {tasks.MAX_PROBLEMS}")
    try:
        tasks.task_config(args.difficulty, args.task)
    except ValueError as e:
        raise ValueError(f"--task {args.task} --difficulty {args.difficulty}: {e}") from None
    check_output(args.out, {}, "--out", writes=("train.jsonl", "test.jsonl", "val.jsonl"))
    check_writable_dir(args.out, "--out")
    paths = tasks.write_splits(args.out, args.train, args.test, args.seed, args.difficulty, args.val, args.task)
    print("\n".join(paths.values()))
    return 0


if __name__ == "__main__":
    cli.main(main)
