"""Memory and FLOP plan per device, before booking hardware: ahead-of-time compiles, nothing runs.

    python -m experiments.bench plan --presets qwen3-0.6b,qwen3-1.7b,qwen3-4b --devices 8,64 --seq 2048 \\
        --batch-per-device 1 --attention dense,splash --modes ar,mdm,slotted,spec-self

For each device count N, in a process of its own with N virtual CPU devices
(`--xla_force_host_platform_device_count=N`), on an FSDP mesh (data 1 × fsdp N, or `--mesh data,fsdp,tensor`):
`jax.jit(...).lower(...).compile()` of

- the train step (`zarya_jax.train.step`: Zarya slotted loss, AdamW, fp32 master weights and moments,
  the state donated; the preset's dtype and `--remat`) at `--seq` × (N × `--batch-per-device`) rows,
  once per `--attention` backend;
- one decode pass per mode (`zarya_jax.sampling.passes`: AR 1 row, mode A 2K rows, mode B one block,
  Ψ-Spec F rows, default `GenerationConfig`) against a KV cache of `--seq` + max_new_tokens rows, params
  in the compute dtype, the cache donated;

and reports, per device, `memory_analysis()` (arguments, temporaries, and the total arguments + outputs −
aliased (donated) + temporaries) and `cost_analysis()` FLOPs next to the model FLOPs
(`train.metrics.train_flops_per_token`). XLA's cost analysis counts a loop body once, so the scanned
layer stack is counted from two more compiles of the same program with 2 and 3 unrolled layers:
F = F(2) + (L − 2)·(F(3) − F(2)); a stack of at most 3 layers is compiled unrolled instead.

What the numbers are: XLA's CPU buffer assignment and cost model for the per-device program. An
accelerator's compiler fuses and schedules differently, so read them as the size of the problem (which
arrays exist per device, how big the temporaries are), not to the byte. On CPU `dot_product` compiles
XLA's unfused implementation (the same memory as `dense`), and `splash` compiles the Pallas kernel in
interpret mode, whose temporaries are its blocks: the fused column is splash.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp

from zarya_jax.nn import kv_cache
from zarya_jax import model as model_lib
from zarya_jax.nn.partitioning import spec_for
from zarya_jax.sampling import passes
from zarya_jax.sampling import modes as modes_lib
from zarya_jax.sampling.config import GenerationConfig
from zarya_jax.train import sharding as shd
from zarya_jax.train.metrics import train_flops_per_token

from .harness import cpu_worker, csv_ints, markdown_table
from .train import model_config, step_setup

GIB = 1 << 30
MODES = tuple(modes_lib.MODES)  # any decoding mode, by its one name
DEFAULT_MODES = ("ar", "mdm", "slotted", "spec-self")
CACHE_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")  # kv_cache's head-major layout


def memory(compiled) -> dict:
    """Per-device bytes of a compiled program, in GiB: arguments, temporaries, and the peak estimate
    arguments + outputs − aliased (donated inputs reused as outputs) + temporaries."""
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return {"args_gib": m.argument_size_in_bytes / GIB, "temp_gib": m.temp_size_in_bytes / GIB, "total_gib": total / GIB}


def flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", float("nan")))


def compile_and_count(compile_for, cfg) -> tuple[object, float, float]:
    """(the program `compile_for(cfg)` compiled, its compile seconds, its FLOPs with every one of the
    `cfg.num_layers` scanned layers counted — see the module doc)."""
    small = cfg.num_layers <= 3
    if small:
        cfg = cfg.replace(scan_unroll=cfg.num_layers)
    t0 = time.perf_counter()
    compiled = compile_for(cfg)
    seconds = time.perf_counter() - t0
    if small:
        return compiled, seconds, flops(compiled)
    two = flops(compile_for(cfg.replace(num_layers=2, scan_unroll=2)))
    three = flops(compile_for(cfg.replace(num_layers=3, scan_unroll=3)))
    return compiled, seconds, two + (cfg.num_layers - 2) * (three - two)


def train_row(preset_name: str, mesh, seq: int, rows: int, attention: str, remat: bool) -> dict:
    cfg = model_config(preset_name, attention=attention, remat=remat)

    def compile_for(c):
        setup = step_setup(c, mesh)
        return setup.step.lower(setup.abstract_state, None, setup.abstract_batch(rows, seq)).compile()

    compiled, seconds, count = compile_and_count(compile_for, cfg)
    model = train_flops_per_token(cfg, seq, 1.0) * rows * seq / mesh.devices.size
    return {"preset": preset_name, "devices": int(mesh.devices.size), "seq": seq, "batch": rows, "attention": attention,
            "remat": remat, "dtype": cfg.dtype, **memory(compiled), "tflop_per_device": count / 1e12,
            "model_tflop_per_device": model / 1e12, "compile_s": seconds}


def _sharded(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def decode_row(preset_name: str, mesh, seq: int, rows: int, mode: str) -> dict:
    cfg = model_config(preset_name)
    gcfg = GenerationConfig(mode=mode)
    window, cache_len = passes.window_rows(gcfg), passes.cache_rows(gcfg, seq)
    named = lambda shape, axes: jax.sharding.NamedSharding(mesh, spec_for(shape, axes, mesh))
    window_in = jax.ShapeDtypeStruct((rows, window), jnp.int32, sharding=named((rows, window), ("batch", None)))
    logits_sh = named((rows, window, cfg.vocab_size), ("batch", None, "vocab"))

    def compile_for(c):
        params = jax.eval_shape(lambda k: model_lib.init_params(c.replace(param_dtype=c.dtype), k),
                                jax.random.PRNGKey(0))
        cache = jax.eval_shape(lambda: kv_cache.init(c, rows, cache_len))
        cache_sh = {"k": named(cache["k"].shape, CACHE_AXES), "v": named(cache["v"].shape, CACHE_AXES),
                    "length": named((rows,), ("batch",))}
        fn = jax.jit(passes.cached_pass, static_argnames=("config",), donate_argnames=("cache",),
                     out_shardings=(logits_sh, cache_sh))
        return fn.lower(_sharded(params, shd.tree_shardings(params, mesh)), _sharded(cache, cache_sh), window_in,
                        window_in, config=c).compile()

    compiled, seconds, count = compile_and_count(compile_for, cfg)
    cache_bytes = kv_cache.nbytes(jax.eval_shape(lambda: kv_cache.init(cfg, rows, cache_len)))
    return {"preset": preset_name, "devices": int(mesh.devices.size), "batch": rows, "mode": mode, "window": window,
            "cache_rows": cache_len, "cache_gib": cache_bytes / mesh.devices.size / GIB, **memory(compiled),
            "gflop_per_device": count / 1e9, "compile_s": seconds}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default="qwen3-0.6b,qwen3-1.7b,qwen3-4b", help="comma-separated model presets")
    p.add_argument("--devices", type=csv_ints, default=[8, 64], help="virtual device counts (one process each)")
    p.add_argument("--mesh", default="", help="data,fsdp,tensor sizes (one may be -1); default FSDP over all devices")
    p.add_argument("--seq", type=int, default=2048, help="training sequence length; the prompt length of decoding")
    p.add_argument("--batch-per-device", type=int, default=1, help="rows per device (global batch = devices × this)")
    p.add_argument("--attention", default="dense,splash", help="attention backends to compile the train step with")
    p.add_argument("--remat", default="true", choices=("true", "false"), help="recompute each layer in the backward")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"decoding modes among {', '.join(MODES)}, one pass each ('' to skip)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def _mesh_config(text: str) -> shd.MeshConfig:
    if not text:
        return shd.MeshConfig(data=1, fsdp=-1, tensor=1)
    try:
        data, fsdp, tensor = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh {text!r}: expected three comma-separated sizes data,fsdp,tensor") from None
    return shd.MeshConfig(data=data, fsdp=fsdp, tensor=tensor)


def _check(args) -> None:
    if args.seq < 1 or args.batch_per_device < 1:
        raise ValueError(f"--seq={args.seq}, --batch-per-device={args.batch_per_device}: expected positive integers")
    for name in [a for a in args.attention.split(",") if a]:
        model_config("tiny", attention=name)  # a ConfigError (ValueError) names a bad backend
    bad = [m for m in args.modes.split(",") if m and m not in MODES]
    if bad:
        raise ValueError(f"--modes {bad}: expected some of {MODES}")
    for name in args.presets.split(","):
        model_config(name)
    _mesh_config(args.mesh)


def _rows(args) -> dict:
    """The worker: every compile on this process's devices."""
    mesh = shd.make_mesh(_mesh_config(args.mesh))
    rows = len(jax.devices()) * args.batch_per_device
    out = {"train": [], "decode": []}
    for name in [p for p in args.presets.split(",") if p]:
        for attention in [a for a in args.attention.split(",") if a]:
            out["train"].append(train_row(name, mesh, args.seq, rows, attention, args.remat == "true"))
        for mode in [m for m in args.modes.split(",") if m]:
            out["decode"].append(decode_row(name, mesh, args.seq, rows, mode))
    return out


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench plan`: one worker per device count → (results, markdown)."""
    _check(args)
    results = {"train": [], "decode": []}
    for n in args.devices:
        worker_argv = ["--worker", "--presets", args.presets, "--mesh", args.mesh, "--seq", str(args.seq),
                       "--batch-per-device", str(args.batch_per_device), "--attention", args.attention,
                       "--remat", args.remat, "--modes", args.modes]
        part = cpu_worker("experiments.bench.plan", worker_argv, n)
        for key in results:
            results[key] += part[key]
    md = ["Train step, per device (GiB; TFLOP per step: XLA's count and the model's 6N + attention):", "",
          markdown_table(results["train"], ["preset", "devices", "seq", "batch", "attention", "args_gib", "temp_gib",
                                            "total_gib", "tflop_per_device", "model_tflop_per_device", "compile_s"])]
    if results["decode"]:
        md += ["One decode pass, per device (cache = K and V in the compute dtype):", "",
               markdown_table(results["decode"], ["preset", "devices", "batch", "mode", "window", "cache_rows",
                                                  "cache_gib", "total_gib", "gflop_per_device", "compile_s"])]
    return results, "\n".join(md)


def worker(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench.plan")
    add_arguments(p)
    args = p.parse_args(argv)
    print(json.dumps(_rows(args)))
    return 0


if __name__ == "__main__":
    sys.exit(worker())
