"""Train-step throughput: tokens/s and estimated MFU per model preset, and step time vs device count.

    python -m experiments.bench train --presets tiny,100m --batch 8 --length 256 --steps 3 --scaling 1,2,4,8

The step is the real sharded train step of `zarya_jax.train.step` (Zarya slotted loss, AdamW, fp32
master weights) on synthetic prompt/answer rows; compile time is reported apart. Device scaling runs
in a subprocess (`python -m experiments.bench.train --worker`) with `--xla_force_host_platform_device_count`
virtual CPU devices (on one CPU these share the same cores: expect flat or worse, it measures sharding
overhead, not speed-up).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from zarya_jax.config import ModelConfig, ZaryaConfig, preset
from zarya_jax.model import init_params
from zarya_jax.objectives.zarya import zarya_objective
from zarya_jax.train import sharding as shd
from zarya_jax.train.loop import BATCH_KEYS
from zarya_jax.train.metrics import device_peak, train_flops_per_token
from zarya_jax.train.checkpoints import abstract_like
from zarya_jax.train.optim import OptimConfig
from zarya_jax.train.step import build_steps

from .harness import cpu_worker, timed


def model_config(preset_name: str, **changes) -> ModelConfig:
    """A preset with a mask token (the last id, if it has none) and `changes` (dtype, attention, remat, …)."""
    cfg = preset(preset_name)
    mask = cfg.mask_token_id if cfg.mask_token_id is not None else cfg.vocab_size - 1
    return cfg.replace(mask_token_id=mask, **{k: v for k, v in changes.items() if v is not None})


@dataclasses.dataclass
class StepSetup:
    """The real sharded train step of `zarya_jax.train.step` (Zarya slotted loss at a fixed slot size, AdamW,
    fp32 master weights, state donated) for one model on one mesh, built without allocating anything.

    step(state, None, batch) -> (state, metrics); abstract_state and abstract_batch(rows, length) are
    ShapeDtypeStructs carrying their shardings (for `step.lower(...)`); init(key) makes a real state."""

    config: ModelConfig
    mesh: Any
    step: Callable
    abstract_state: dict
    init: Callable
    forward_passes: float

    def abstract_batch(self, rows: int, length: int) -> dict:
        sharding = shd.batch_sharding(self.mesh)
        return {k: jax.ShapeDtypeStruct((rows, length), bool if k == "answer_mask" else jnp.int32, sharding=sharding)
                for k in BATCH_KEYS}


def step_setup(cfg: ModelConfig, mesh, slot_size: int = 8, seed: int = 0) -> StepSetup:
    zc = ZaryaConfig(slot_size_set=(slot_size,), slot_step_borders=(1.0,))
    objective = zarya_objective(cfg, zc)
    steps = build_steps(objective, OptimConfig(lr=1e-4, warmup_steps=0), 1000, lambda k: init_params(cfg, k), mesh,
                        BATCH_KEYS, jax.random.PRNGKey(seed))
    return StepSetup(cfg, mesh, steps.cache.train(slot_size), abstract_like(steps.abstract_state, steps.shardings),
                     steps.init, objective.forward_passes)


def random_batch(cfg: ModelConfig, rows: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of random tokens, one example each: a quarter prompt, the rest answer."""
    rng = np.random.default_rng(seed)
    return {"tokens": rng.integers(0, min(cfg.vocab_size, 256), (rows, length)).astype(np.int32),
            "segment_ids": np.ones((rows, length), np.int32),
            "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy(),
            "answer_mask": np.broadcast_to(np.arange(length) >= length // 4, (rows, length)).copy()}


def measure(preset_name: str, batch: int, length: int, steps: int, *, mesh=None, dtype: str | None = None,
            slot_size: int = 8, seed: int = 0, attention: str | None = None, remat: bool | None = None) -> dict:
    """Times `steps` train steps (after one compile) of `preset_name`; returns a dict of numbers."""
    cfg = model_config(preset_name, dtype=dtype, attention=attention, remat=remat)
    setup = step_setup(cfg, shd.make_mesh(mesh or shd.MeshConfig()), slot_size, seed)
    mesh = setup.mesh
    state = setup.init(jax.random.PRNGKey(seed))
    data = shd.global_batch(random_batch(cfg, batch, length, seed), mesh)

    def run_steps(n):
        nonlocal state
        for _ in range(n):
            state, m = setup.step(state, None, data)
        return jax.block_until_ready(m)

    _, compile_s = timed(lambda: run_steps(1))
    m, total_s = timed(lambda: run_steps(steps))
    step_s = total_s / steps
    tokens = batch * length
    flops = train_flops_per_token(cfg, length, setup.forward_passes) * tokens
    peak = device_peak(mesh.devices.flatten().tolist())
    return {"preset": preset_name, "params_m": cfg.num_params() / 1e6, "dtype": cfg.dtype, "batch": batch,
            "length": length, "devices": int(mesh.devices.size), "mesh": dict(mesh.shape),
            "attention": cfg.attention, "remat": cfg.remat,
            "compile_s": compile_s, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "model_tflops_per_s": flops / step_s / 1e12, "mfu": flops / step_s / peak.flops, "peak_note": peak.note,
            "loss": float(m["loss"])}


def scaling(preset_name: str, batch: int, length: int, steps: int, device_counts, mode: str = "data") -> list[dict]:
    """Step time on 1…8 virtual CPU devices (data-parallel, fsdp or tensor mesh), in a subprocess."""
    return cpu_worker("experiments.bench.train", ["--worker", "--presets", preset_name, "--batch", str(batch),
                                                  "--length", str(length), "--steps", str(steps), "--scaling",
                                                  ",".join(map(str, device_counts)), "--mode", mode],
                      max(device_counts))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--presets", default="tiny,100m", help="comma-separated model presets")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="timed steps after the compile step")
    p.add_argument("--dtype", default=None, help="compute dtype override (float32 / bfloat16)")
    p.add_argument("--scaling", default="1,2,4,8", help="device counts for the scaling table ('' to skip)")
    p.add_argument("--scaling-preset", default="tiny")
    p.add_argument("--mode", default="data", choices=("data", "fsdp", "tensor"), help="mesh axis for scaling")


def _check(args) -> None:
    for name in ("batch", "length", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name}={getattr(args, name)}: expected a positive integer")


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench train`: argparse namespace → (results, markdown)."""
    _check(args)
    rows = [measure(p, args.batch, args.length, args.steps, dtype=args.dtype) for p in args.presets.split(",") if p]
    counts = [int(c) for c in args.scaling.split(",") if c] if args.scaling else []
    scale = scaling(args.scaling_preset, args.batch, args.length, args.steps, counts, args.mode) if counts else []
    md = ["| preset | params (M) | dtype | batch×len | devices | compile s | step s | tokens/s | MFU (est.) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['preset']} | {r['params_m']:.1f} | {r['dtype']} | {r['batch']}×{r['length']} | {r['devices']} | "
                  f"{r['compile_s']:.1f} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['mfu']:.2%} |")
    if rows:
        md.append(f"\nMFU peak: {rows[0]['peak_note']}")
    if scale:
        md += ["", f"Scaling ({args.scaling_preset}, {args.mode} axis, {args.batch}×{args.length}):", "",
               "| devices | step s | tokens/s | vs 1 device |", "|---|---|---|---|"]
        base = scale[0]["step_s"]
        for r in scale:
            md.append(f"| {r['devices']} | {r['step_s']:.4f} | {r['tokens_per_s']:.0f} | {base / r['step_s']:.2f}× |")
    return {"presets": rows, "scaling": scale}, "\n".join(md)


def worker(argv=None) -> int:
    """The scaling subprocess: step times on 1 … N virtual devices, printed as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.train")
    add_arguments(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = []
    for n in [int(c) for c in args.scaling.split(",")]:
        mesh = shd.MeshConfig(**{"data": 1, "fsdp": 1, "tensor": 1, args.mode: n, "num_devices": n})
        out.append(measure(args.presets, args.batch, args.length, args.steps, mesh=mesh, dtype=args.dtype))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(worker())
