"""One process of the multi-process training test (`test_multihost.py`): `experiments.train`'s command
line, plus a SIGTERM that this process sends to itself after step `--signal-at` when it is process
`--signal-process`, so that the signal reaches exactly one of the processes at a known step.

    python tests/multihost_worker.py --signal-at 2 --signal-process 1 -- --config tiny --set ... --workdir W

Environment as for any multi-process run: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.
Prints the loop's summary as JSON; exits like `experiments.train` (143 when stopped by the signal).
"""
import argparse
import json
import os
import signal
import sys
import time

import jax

from experiments import train as train_cli
from zarya_jax.train import config as rc
from zarya_jax.train.hooks import OnStep
from zarya_jax.train.loop import train
from zarya_jax.train.sharding import maybe_initialize_distributed


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--signal-at", type=int, required=True)
    p.add_argument("--signal-process", type=int, required=True)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    maybe_initialize_distributed("auto")  # before any device use, as `train` would
    cli = train_cli.parser().parse_args([a for a in args.rest if a != "--"])
    run = rc.load(cli.config, cli.overrides)

    def poke(event):
        if event.step == args.signal_at and jax.process_index() == args.signal_process:
            os.kill(os.getpid(), signal.SIGTERM)
            # Let the notice reach the coordination service before this host moves on (the others wait
            # for it in the next step's collectives), so the agreed stop step is close to this one.
            time.sleep(2)

    summary = train(run, cli.workdir, hooks=[OnStep(poke)])
    print(json.dumps({"process": jax.process_index(), **{k: summary[k] for k in ("status", "step")},
                      "signal": summary.get("signal")}), flush=True)
    return 128 + summary["signal"] if summary["status"] == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())
