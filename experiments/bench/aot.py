"""Compile for the target, not for the host: every program a pod run executes, per chip, from the target's compiler.

    python -m experiments.bench aot --target tpu:v5e:4x4 --presets qwen3-1.7b,qwen3-4b --mesh 1,-1,4 \\
        --seq 4096 --batch 64 --decode-batch 64 --prompt 1024 --new 8192

`--target`: `tpu:GENERATION:SHAPE` compiles with the TPU compiler through libtpu on any host (no TPU needed),
`gpu:MODEL[xN]` with XLA:GPU through the CUDA plugin (no GPU needed), `cpu` with this host's devices. Every
train step (`zarya`, `zarya-nonslotted`, `drafter`, `draft-model`, `grpo`, `eval`) at `--batch` × `--seq` and
every decoder `generate()` runs at `--decode-batch` prompts of `--prompt` + `--new` tokens, on the project's
mesh (`--mesh data,fsdp,tensor`), rules and donation; per program: compiled or the compiler's first error
line, per-chip memory against the chip's HBM, compile time and attention kernel; and its roofline by the
target compiler's cost model (bytes and FLOPs per chip of a train step or a decoder's cycle and its passes,
the roofline time and a hand bound beside it; `--no-roofline` skips it, `zarya_jax.bench.roofline`). What it
compiles and how to read it: `zarya_jax.bench.aot` (`compile_rows(AotSettings(...))`), docs/parallelism.md.
"""
from __future__ import annotations

import argparse

from zarya_jax import target as target_lib
from zarya_jax.bench import aot

from .harness import mesh_config, names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tpu:v5e:4x4",
                   help="comma-separated targets: tpu:GENERATION:SHAPE (v4, v5e, v5p, v6e; needs the tpu extra), "
                   f"gpu:MODEL[xN] ({', '.join(target_lib.GPU_MODELS)}; needs the gpu extra) or cpu")
    p.add_argument("--presets", default="qwen3-1.7b,qwen3-4b", help="comma-separated model presets")
    p.add_argument("--programs", default="all", help=f"comma-separated subset of {','.join(aot.PROGRAMS)}, or all")
    p.add_argument("--mesh", default="", help="data,fsdp,tensor sizes (one may be -1); default FSDP over all chips")
    p.add_argument("--seq", type=int, default=4096, help="training sequence length")
    p.add_argument("--batch", type=int, default=64, help="global training batch (rows)")
    p.add_argument("--decode-batch", type=int, default=64, help="prompts per generate() call")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens per decoding row")
    p.add_argument("--new", type=int, default=8192, help="new tokens per decoding row")
    p.add_argument("--attention", default="auto", help="model.attention for every program")
    p.add_argument("--remat", default="true", choices=("true", "false"), help="recompute each layer in the backward")
    p.add_argument("--layer-loop", default="auto", help="GenerationConfig.layer_loop of every decoder: auto, split, scan")
    p.add_argument("--no-roofline", action="store_true",
                   help="memory only: no roofline rows (each costs compiles of two- and four-layer programs)")


def settings(args) -> aot.AotSettings:
    programs = aot.PROGRAMS if args.programs == "all" else tuple(n for n in args.programs.split(",") if n)
    return aot.AotSettings(targets=names(args.target), presets=names(args.presets), programs=programs,
                           mesh=mesh_config(args.mesh), seq=args.seq, batch=args.batch, decode_batch=args.decode_batch,
                           prompt=args.prompt, new=args.new, attention=args.attention, remat=args.remat == "true",
                           layer_loop=args.layer_loop, roofline=not args.no_roofline)


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench aot` → (results, markdown)."""
    return aot.run(settings(args))
