"""The benchmark harness: the one command line (`python -m experiments.bench NAME ...`), the timing
helpers every benchmark uses, and the result files.

A benchmark is a module with `add_arguments(parser)` and `run(args) -> (results dict, markdown)`;
`main` parses `--out DIR` (before or after the subcommand) and the subcommand, runs it, writes `DIR/NAME.json` (with the code's
provenance: commit, dirty tree, package versions, machine) and `DIR/NAME.md` atomically and prints the
Markdown. Bad options print one `error:` line and exit with status 2 (`--out` is checked writable before
the benchmark runs).

A comparison with another library times each side in a process of its own while the other side is
idle (`alternate`, `side_main`): XLA's CPU worker threads keep spinning for a while after each JAX
call, and PyTorch's share the same cores, so two libraries timed in one process slow each other down.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import statistics
import time
from typing import Any, Callable

from zarya_jax.files import atomic_write, atomic_write_json, check_output, check_writable_dir
from zarya_jax.provenance import provenance

from .. import cli


def csv_ints(text: str) -> list[int]:
    """argparse type: '1,4,16' -> [1, 4, 16] (positive integers)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def check_positive(args, names) -> None:
    """Raises ValueError naming the first of `names` (argparse dests) that is not a positive integer."""
    for name in names:
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")


def check_heads(hidden: int, heads: int, kv_heads: int) -> None:
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"--hidden={hidden}, --heads={heads}, --kv-heads={kv_heads}: expected hidden divisible "
                         "by heads and heads by kv-heads")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), wall seconds). `fn` must block until its result is ready (`jax.block_until_ready`)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def timings(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` (which must block until its result is ready)."""
    return [timed(fn)[1] for _ in range(repeats)]


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(module: str, argv: list[str], env: dict | None = None) -> Any:
    """Runs `python -m module argv…` from the repository root and returns the JSON of its last stdout line."""
    out = subprocess.run([sys.executable, "-m", module, *argv], env=env, capture_output=True, text=True, check=False,
                         cwd=REPO)
    if out.returncode:
        raise RuntimeError(f"{module} {' '.join(argv[:2])} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_worker(module: str, argv: list[str], devices: int) -> Any:
    """`worker` on `devices` virtual CPU devices (the XLA flag must be set before JAX starts, hence a process
    of its own)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    return worker(module, argv, env)


HF_ATTENTION = ("eager", "sdpa")  # transformers' attention implementations a baseline is timed with


def hf_attention(text: str) -> tuple[str, ...]:
    """`--hf-attention`: a non-empty comma-separated subset of `HF_ATTENTION`."""
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    if not names or any(a not in HF_ATTENTION for a in names):
        raise ValueError(f"--hf-attention={text!r}: expected a comma-separated subset of {','.join(HF_ATTENTION)}")
    return names


def add_baseline_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a comparison with the HF baseline: rounds of child processes and HF's configurations."""
    p.add_argument("--rounds", type=int, default=3, help="child processes per side, alternated JAX, HF, JAX, HF …")
    p.add_argument("--hf-attention", default=",".join(HF_ATTENTION),
                   help="HF attention implementations to time (the fastest configuration is the baseline)")
    p.add_argument("--hf-threads", type=csv_ints, default=None,
                   help="PyTorch thread counts to time HF with (default: as many as XLA uses, and 1)")


def cpu_threads() -> int:
    """The cores this process may run on: XLA's CPU thread pool uses them all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def hf_threads(counts: list[int] | None) -> tuple[int, ...]:
    """`--hf-threads`: PyTorch thread counts to time the baseline with. Default: as many as XLA uses and 1 (on
    a busy machine a single PyTorch thread can beat several that wait for each other at every op)."""
    return tuple(dict.fromkeys(counts or (cpu_threads(), 1)))


def hf_setups(attention: tuple[str, ...], threads: tuple[int, ...]) -> list[tuple[str, str, int]]:
    """(name, attention implementation, PyTorch threads) of each configuration the HF baseline is timed in."""
    return [(f"{a}, {t} thread{'s' if t > 1 else ''}", a, t) for t in threads for a in attention]


def alternate(module: str, sides: dict[str, dict], rounds: int) -> dict[str, list]:
    """Runs `python -m module --side S --kwargs JSON` (see `side_main`) for each side S of `sides` (name ->
    keyword arguments) in turn, `rounds` times (A, B, A, B, …), each child alone on the machine; returns
    {side: [the child's result per round]}."""
    runs: dict[str, list] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, kwargs in sides.items():
            runs[side].append(worker(module, ["--side", side, "--kwargs", json.dumps(kwargs)]))
    return runs


def side_main(measures: dict[str, Callable[..., dict]], argv=None) -> int:
    """The child of `alternate`: `--side NAME --kwargs JSON` calls `measures[NAME](**kwargs)` and prints its
    result as one JSON line."""
    p = argparse.ArgumentParser(description="one side of a benchmark, timed in a process of its own")
    p.add_argument("--side", choices=sorted(measures), required=True)
    p.add_argument("--kwargs", type=json.loads, default={}, help="the measuring function's keyword arguments")
    args = p.parse_args(argv)
    print(json.dumps(measures[args.side](**args.kwargs)))
    return 0


def pooled(per_round: list[list[float]]) -> dict:
    """{'median_s', 'min_s', 'calls'} over the timed calls of every round."""
    calls = [t for times in per_round for t in times]
    return {"median_s": statistics.median(calls), "min_s": min(calls), "calls": len(calls)}


def write_results(out_dir: str, name: str, results: dict, markdown: str) -> None:
    """`out_dir/name.json` (`results` and the code's provenance) and `out_dir/name.md`, each written
    atomically."""
    atomic_write_json(f"{out_dir}/{name}.json", {**results, "provenance": provenance()})
    atomic_write(f"{out_dir}/{name}.md", markdown)


def main(benchmarks: dict, argv=None, description: str = "") -> int:
    """Runs the benchmark named by the first argument (`benchmarks`: name -> module)."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    out_help = "directory for <name>.json and <name>.md"
    p.add_argument("--out", default="runs/bench", help=out_help)
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in benchmarks.items():
        summary = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else None
        sp = sub.add_parser(name, help=summary, description=module.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        # after the subcommand too; SUPPRESS keeps a value given before it when this one is absent
        sp.add_argument("--out", default=argparse.SUPPRESS, help=out_help)
        module.add_arguments(sp)
    args = cli.parse_args(p, argv)

    def body() -> int:
        check_output(args.out, {"--ckpt": getattr(args, "ckpt", None)}, "--out",
                     writes=(f"{args.command}.json", f"{args.command}.md"))
        check_writable_dir(args.out, "--out")
        results, md = benchmarks[args.command].run(args)
        write_results(args.out, args.command, results, md)
        print(md)
        return 0

    return cli.run(body)
