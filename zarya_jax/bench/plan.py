"""Memory and FLOP plan per device, before booking hardware: ahead-of-time compiles, nothing runs.

For each device count N, in a process of its own with N virtual CPU devices
(`--xla_force_host_platform_device_count=N`), on an FSDP mesh (data 1 × fsdp N, or `PlanSettings.mesh`):
`jax.jit(...).lower(...).compile()` of

- the train step (`train.step.build_steps`, through `train.step_setup`: Zarya slotted loss, AdamW, fp32 master
  weights and moments, the state donated; the preset's dtype and `remat`) at `seq` × (N × `batch_per_device`)
  rows, once per attention backend;
- one decode pass per mode (`zarya_jax.sampling.passes`: AR 1 row, mode A 2K rows, mode B one block,
  Ψ-Spec F rows, default `GenerationConfig`) against a KV cache of `seq` + max_new_tokens rows, params
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

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp

from .. import model as model_lib
from ..nn import kv_cache
from ..nn.partitioning import spec_for
from ..sampling import modes as modes_lib
from ..sampling import passes
from ..sampling.config import GenerationConfig
from ..train import sharding as shd
from ..train.checkpoints import abstract_like
from ..train.metrics import train_flops_per_token
from .baseline import cpu_worker, from_json, side_main, to_json
from .results import GIB, markdown_table
from .train import model_config, step_setup

MODES = tuple(modes_lib.MODES)  # any decoding mode, by its one name
DEFAULT_MODES = ("ar", "mdm", "slotted", "spec-self")
CACHE_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")  # kv_cache's head-major layout


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """`bench plan`: per device count of `devices` (a child process each), every preset's train step per
    attention backend of `attention` and one decode pass per mode of `modes`, on `mesh` (default: FSDP over
    all devices)."""

    presets: tuple[str, ...] = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")
    devices: tuple[int, ...] = (8, 64)
    mesh: shd.MeshConfig = shd.MeshConfig(data=1, fsdp=-1, tensor=1)
    seq: int = 2048
    batch_per_device: int = 1
    attention: tuple[str, ...] = ("dense", "splash")
    remat: bool = True
    modes: tuple[str, ...] = DEFAULT_MODES

    def check(self) -> None:
        """ValueError naming the first bad setting (before any child process starts)."""
        if self.seq < 1 or self.batch_per_device < 1:
            raise ValueError(f"--seq={self.seq}, --batch-per-device={self.batch_per_device}: expected positive "
                             "integers")
        for name in self.attention:
            model_config("tiny", attention=name)  # a ConfigError (ValueError) names a bad backend
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"--modes {bad}: expected some of {MODES}")
        for name in self.presets:
            model_config(name)


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
        return fn.lower(abstract_like(params, shd.tree_shardings(params, mesh)), abstract_like(cache, cache_sh), window_in,
                        window_in, config=c).compile()

    compiled, seconds, count = compile_and_count(compile_for, cfg)
    cache_bytes = kv_cache.nbytes(jax.eval_shape(lambda: kv_cache.init(cfg, rows, cache_len)))
    return {"preset": preset_name, "devices": int(mesh.devices.size), "batch": rows, "mode": mode, "window": window,
            "cache_rows": cache_len, "cache_gib": cache_bytes / mesh.devices.size / GIB, **memory(compiled),
            "gflop_per_device": count / 1e9, "compile_s": seconds}


def device_rows(s: PlanSettings) -> dict:
    """{'train': rows, 'decode': rows}: every compile of `s` on this process's devices."""
    mesh = shd.make_mesh(s.mesh)
    rows = len(jax.devices()) * s.batch_per_device
    out = {"train": [], "decode": []}
    for name in s.presets:
        for attention in s.attention:
            out["train"].append(train_row(name, mesh, s.seq, rows, attention, s.remat))
        for mode in s.modes:
            out["decode"].append(decode_row(name, mesh, s.seq, rows, mode))
    return out


def _device_side(settings: dict) -> dict:
    """The child of `rows`: `device_rows` of the settings as JSON (`baseline.to_json`)."""
    return device_rows(from_json(PlanSettings, {**settings, "mesh": shd.MeshConfig(**settings["mesh"])}))


SIDES = {"rows": _device_side}


def rows(s: PlanSettings) -> dict:
    """{'train': rows, 'decode': rows} over every device count of `s`, each in a child process of its own."""
    s.check()
    results = {"train": [], "decode": []}
    for n in s.devices:
        part = cpu_worker(__name__, "rows", {"settings": to_json(s)}, n)
        for key in results:
            results[key] += part[key]
    return results


def markdown(results: dict) -> str:
    md = ["Train step, per device (GiB; TFLOP per step: XLA's count and the model's 6N + attention):", "",
          markdown_table(results["train"], ["preset", "devices", "seq", "batch", "attention", "args_gib", "temp_gib",
                                            "total_gib", "tflop_per_device", "model_tflop_per_device", "compile_s"])]
    if results["decode"]:
        md += ["One decode pass, per device (cache = K and V in the compute dtype):", "",
               markdown_table(results["decode"], ["preset", "devices", "batch", "mode", "window", "cache_rows",
                                                  "cache_gib", "total_gib", "gflop_per_device", "compile_s"])]
    return "\n".join(md)


def run(s: PlanSettings) -> tuple[dict, str]:
    results = rows(s)
    return results, markdown(results)


if __name__ == "__main__":
    sys.exit(side_main(SIDES))
