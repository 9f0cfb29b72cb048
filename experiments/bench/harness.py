"""The benchmarks' command line (`python -m experiments.bench NAME ...`): flag parsing shared by the subcommands
and `main`. What they measure lives in `zarya_jax.bench`.

A subcommand is a module with `add_arguments(parser)` and `run(args) -> (results dict, markdown)`, which parses
its flags into the benchmark's settings and makes one library call; `main` parses `--out DIR` (before or after
the subcommand) and the subcommand, runs it, writes `DIR/NAME.json` (with the code's provenance: commit, dirty
tree, package versions, machine) and `DIR/NAME.md` atomically and prints the Markdown. Bad options print one
`error:` line and exit with status 2 (`--out` is checked writable before the benchmark runs).
"""
from __future__ import annotations

import argparse

from zarya_jax.bench.baseline import HF_ATTENTION
from zarya_jax.bench.results import write_results
from zarya_jax.files import check_output, check_writable_dir
from zarya_jax.train import sharding as shd

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


def names(text: str) -> tuple[str, ...]:
    """'a,b,' -> ('a', 'b'): a comma-separated list, blanks dropped."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def check_positive(args, dests) -> None:
    """Raises ValueError naming the first of `dests` (argparse dests) that is not a positive integer."""
    for name in dests:
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")


def check_heads(hidden: int, heads: int, kv_heads: int) -> None:
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"--hidden={hidden}, --heads={heads}, --kv-heads={kv_heads}: expected hidden divisible "
                         "by heads and heads by kv-heads")


def mesh_config(text: str) -> shd.MeshConfig:
    """`--mesh data,fsdp,tensor` (one may be -1); '' is FSDP over every device."""
    if not text:
        return shd.MeshConfig(data=1, fsdp=-1, tensor=1)
    try:
        data, fsdp, tensor = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh {text!r}: expected three comma-separated sizes data,fsdp,tensor") from None
    return shd.MeshConfig(data=data, fsdp=fsdp, tensor=tensor)


def hf_attention(text: str) -> tuple[str, ...]:
    """`--hf-attention`: a non-empty comma-separated subset of `HF_ATTENTION`."""
    chosen = names(text)
    if not chosen or any(a not in HF_ATTENTION for a in chosen):
        raise ValueError(f"--hf-attention={text!r}: expected a comma-separated subset of {','.join(HF_ATTENTION)}")
    return chosen


def add_baseline_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a comparison with the HF baseline: rounds of child processes and HF's configurations."""
    p.add_argument("--rounds", type=int, default=3, help="child processes per side, alternated JAX, HF, JAX, HF …")
    p.add_argument("--hf-attention", default=",".join(HF_ATTENTION),
                   help="HF attention implementations to time (the fastest configuration is the baseline)")
    p.add_argument("--hf-threads", type=csv_ints, default=None,
                   help="PyTorch thread counts to time HF with (default: as many as XLA uses, and 1)")


def baseline_settings(args) -> dict:
    """The settings of a comparison with the HF baseline, from `add_baseline_arguments`' flags and `--no-hf`."""
    return dict(hf=not args.no_hf, rounds=args.rounds, hf_attention=hf_attention(args.hf_attention),
                hf_threads=None if args.hf_threads is None else tuple(args.hf_threads))


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
        print(f"\nwrote {args.out}/{args.command}.json and {args.command}.md")
        return 0

    return cli.run(body)
