"""The benchmark harness: the one command line (`python -m experiments.bench NAME ...`), the timing
helpers every benchmark uses, and the result files.

A benchmark is a module with `add_arguments(parser)` and `run(args) -> (results dict, markdown)`;
`main` parses `--out DIR` (before or after the subcommand) and the subcommand, runs it, writes `DIR/NAME.json` and `DIR/NAME.md`
atomically and prints the Markdown. Bad options print one `error:` line and exit with status 2 (`--out`
is checked writable before the benchmark runs).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

from zarya_jax.files import atomic_write, atomic_write_json, check_output, check_writable_dir

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


def cpu_worker(module: str, argv: list[str], devices: int) -> Any:
    """Runs `python -m module argv…` on `devices` virtual CPU devices (the XLA flag must be set before JAX
    starts, hence a process of its own) and returns the JSON of its last stdout line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}").strip()
    out = subprocess.run([sys.executable, "-m", module, *argv], env=env, capture_output=True, text=True, check=False,
                         cwd=REPO)
    if out.returncode:
        raise RuntimeError(f"{module} worker on {devices} devices failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_results(out_dir: str, name: str, results: dict, markdown: str) -> None:
    """`out_dir/name.json` and `out_dir/name.md`, each written atomically."""
    atomic_write_json(f"{out_dir}/{name}.json", results)
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
