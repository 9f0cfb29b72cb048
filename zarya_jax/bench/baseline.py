"""Child processes and the Hugging Face baseline's configurations.

A comparison with another library times each side in a process of its own while the other side is
idle (`alternate`, `side_main`): XLA's CPU worker threads keep spinning for a while after each JAX
call, and PyTorch's share the same cores, so two libraries timed in one process slow each other down.
A measurement that needs virtual CPU devices runs in a child too (`cpu_worker`): the XLA flag must be set
before JAX starts. A child is `python -m zarya_jax.bench.MODULE --side NAME --kwargs JSON`, which calls the
module's `SIDES[NAME](**kwargs)` and prints its result as one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_ATTENTION = ("eager", "sdpa")  # transformers' attention implementations a baseline is timed with

SideRunner = Callable[[str, str, dict], Any]  # (module, side, kwargs) -> the side's result


def worker(module: str, side: str, kwargs: dict, env: dict | None = None) -> Any:
    """Runs side `side` of `module` (`side_main`) in a child process from the repository root and returns
    its result (the JSON of its last stdout line)."""
    argv = ["--side", side, "--kwargs", json.dumps(kwargs)]
    out = subprocess.run([sys.executable, "-m", module, *argv], env=env, capture_output=True, text=True, check=False,
                         cwd=REPO)
    if out.returncode:
        raise RuntimeError(f"{module} --side {side} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_worker(module: str, side: str, kwargs: dict, devices: int) -> Any:
    """`worker` on `devices` virtual CPU devices (the XLA flag must be set before JAX starts, hence a process
    of its own)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    return worker(module, side, kwargs, env)


def alternate(module: str, sides: dict[str, dict], rounds: int, run_side: SideRunner = worker) -> dict[str, list]:
    """Runs `run_side(module, S, kwargs)` (default: a child process, `worker`) for each side S of `sides`
    (name -> keyword arguments) in turn, `rounds` times (A, B, A, B, …), each child alone on the machine;
    returns {side: [the side's result per round]}."""
    runs: dict[str, list] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, kwargs in sides.items():
            runs[side].append(run_side(module, side, kwargs))
    return runs


def side_main(measures: dict[str, Callable[..., Any]], argv=None) -> int:
    """The child of `worker`: `--side NAME --kwargs JSON` calls `measures[NAME](**kwargs)` and prints its
    result as one JSON line."""
    p = argparse.ArgumentParser(description="one side of a benchmark, timed in a process of its own")
    p.add_argument("--side", choices=sorted(measures), required=True)
    p.add_argument("--kwargs", type=json.loads, default={}, help="the measuring function's keyword arguments")
    args = p.parse_args(argv)
    print(json.dumps(measures[args.side](**args.kwargs)))
    return 0


def to_json(settings) -> dict:
    """A settings dataclass as a child's keyword argument (`from_json` reads it back)."""
    return dataclasses.asdict(settings)


def from_json(cls, data: dict):
    """The `cls` settings `to_json` wrote: JSON's lists back to tuples."""
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def cpu_threads() -> int:
    """The cores this process may run on: XLA's CPU thread pool uses them all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def hf_threads(counts) -> tuple[int, ...]:
    """PyTorch thread counts to time the baseline with. Default (None): as many as XLA uses and 1 (on a busy
    machine a single PyTorch thread can beat several that wait for each other at every op)."""
    return tuple(dict.fromkeys(counts or (cpu_threads(), 1)))


def hf_setups(attention: tuple[str, ...], threads: tuple[int, ...]) -> list[tuple[str, str, int]]:
    """(name, attention implementation, PyTorch threads) of each configuration the HF baseline is timed in."""
    return [(f"{a}, {t} thread{'s' if t > 1 else ''}", a, t) for t in threads for a in attention]
