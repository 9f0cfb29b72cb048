"""Train-step throughput: tokens/s and estimated MFU of one model preset, and step time vs device count.

The step is the real sharded train step (`train.step.build_steps`: Zarya slotted loss at a fixed slot size,
AdamW, fp32 master weights, state donated) on synthetic prompt/answer rows; compile time is reported apart.
Device scaling runs in a child process (`baseline.cpu_worker`) with `--xla_force_host_platform_device_count`
virtual CPU devices (on one CPU these share the same cores: expect flat or worse, it measures sharding
overhead, not speed-up).
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig, ZaryaConfig, preset
from ..model import init_params
from ..objectives.zarya import zarya_objective
from ..train import sharding as shd
from ..train.checkpoints import abstract_like
from ..train.loop import BATCH_KEYS
from ..train.metrics import device_peak, train_flops_per_token
from ..train.optim import OptimConfig
from ..train.step import build_steps
from .baseline import cpu_worker, side_main
from .results import timed

TOTAL_STEPS = 1000  # the schedule's length: the step's program does not depend on it


def model_config(preset_name: str, **changes) -> ModelConfig:
    """A preset with a mask token (the last id, if it has none) and `changes` (dtype, attention, remat, …;
    None leaves the preset's value)."""
    cfg = preset(preset_name)
    mask = cfg.mask_token_id if cfg.mask_token_id is not None else cfg.vocab_size - 1
    return cfg.replace(mask_token_id=mask, **{k: v for k, v in changes.items() if v is not None})


def abstract_batch(mesh, shapes: dict) -> dict:
    """{key: ShapeDtypeStruct on the mesh's batch sharding} from {key: (shape, dtype)}."""
    sharding = shd.batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for k, (shape, dtype) in shapes.items()}


def token_shapes(rows: int, length: int) -> dict:
    """The (shape, dtype) of each key of a packed prompt/answer batch (`train.loop.BATCH_KEYS`)."""
    return {k: ((rows, length), bool if k == "answer_mask" else jnp.int32) for k in BATCH_KEYS}


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
        return abstract_batch(self.mesh, token_shapes(rows, length))


def step_setup(cfg: ModelConfig, mesh, slot_size: int = 8, seed: int = 0) -> StepSetup:
    zc = ZaryaConfig(slot_size_set=(slot_size,), slot_step_borders=(1.0,))
    objective = zarya_objective(cfg, zc)
    steps = build_steps(objective, OptimConfig(lr=1e-4, warmup_steps=0), TOTAL_STEPS, lambda k: init_params(cfg, k),
                        mesh, BATCH_KEYS, jax.random.PRNGKey(seed))
    return StepSetup(cfg, mesh, steps.cache.train(slot_size), abstract_like(steps.abstract_state, steps.shardings),
                     steps.init, objective.forward_passes)


def random_batch(cfg: ModelConfig, rows: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of random tokens, one example each: a quarter prompt, the rest answer."""
    rng = np.random.default_rng(seed)
    return {"tokens": rng.integers(0, min(cfg.vocab_size, 256), (rows, length)).astype(np.int32),
            "segment_ids": np.ones((rows, length), np.int32),
            "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy(),
            "answer_mask": np.broadcast_to(np.arange(length) >= length // 4, (rows, length)).copy()}


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """One timed train step: `steps` steps (after one compile) of `preset` at `batch` rows × `length` tokens on
    `mesh` (default: every device on the data axis); dtype/attention/remat None keep the preset's."""

    preset: str
    batch: int = 8
    length: int = 256
    steps: int = 3
    mesh: shd.MeshConfig | None = None
    dtype: str | None = None
    slot_size: int = 8
    seed: int = 0
    attention: str | None = None
    remat: bool | None = None


def measure(s: StepSettings) -> dict:
    """Times the train step of `s` (StepSettings); returns a dict of numbers (a row of `train.json`)."""
    cfg = model_config(s.preset, dtype=s.dtype, attention=s.attention, remat=s.remat)
    setup = step_setup(cfg, shd.make_mesh(s.mesh or shd.MeshConfig()), s.slot_size, s.seed)
    mesh = setup.mesh
    state = setup.init(jax.random.PRNGKey(s.seed))
    data = shd.global_batch(random_batch(cfg, s.batch, s.length, s.seed), mesh)

    def run_steps(n):
        nonlocal state
        for _ in range(n):
            state, m = setup.step(state, None, data)
        return jax.block_until_ready(m)

    _, compile_s = timed(lambda: run_steps(1))
    m, total_s = timed(lambda: run_steps(s.steps))
    step_s = total_s / s.steps
    tokens = s.batch * s.length
    flops = train_flops_per_token(cfg, s.length, setup.forward_passes) * tokens
    peak = device_peak(mesh.devices.flatten().tolist())
    return {"preset": s.preset, "params_m": cfg.num_params() / 1e6, "dtype": cfg.dtype, "batch": s.batch,
            "length": s.length, "devices": int(mesh.devices.size), "mesh": dict(mesh.shape),
            "attention": cfg.attention, "remat": cfg.remat,
            "compile_s": compile_s, "step_s": step_s, "tokens_per_s": tokens / step_s,
            "model_tflops_per_s": flops / step_s / 1e12, "mfu": flops / step_s / peak.flops, "peak_note": peak.note,
            "loss": float(m["loss"])}


def _scaling_side(preset: str, batch: int, length: int, steps: int, device_counts: list[int], axis: str) -> list:
    """The scaling child: the step on 1 … N of this process's virtual devices along `axis`."""
    out = []
    for n in device_counts:
        mesh = shd.MeshConfig(**{"data": 1, "fsdp": 1, "tensor": 1, axis: n, "num_devices": n})
        out.append(measure(StepSettings(preset, batch, length, steps, mesh=mesh)))
    return out


SIDES = {"scaling": _scaling_side}


def scaling(s: StepSettings, device_counts, axis: str = "data") -> list[dict]:
    """`measure` on 1…N virtual CPU devices (a data-parallel, fsdp or tensor mesh), in a child process; the
    preset's dtype and attention."""
    kwargs = dict(preset=s.preset, batch=s.batch, length=s.length, steps=s.steps,
                  device_counts=list(device_counts), axis=axis)
    return cpu_worker(__name__, "scaling", kwargs, max(device_counts))


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """`bench train`: every preset of `presets` timed (`measure`), then `scaling_preset` on each device count of
    `scaling` along the `axis` mesh axis (none: no scaling table)."""

    presets: tuple[str, ...] = ("tiny", "100m")
    batch: int = 8
    length: int = 256
    steps: int = 3
    dtype: str | None = None
    scaling: tuple[int, ...] = (1, 2, 4, 8)
    scaling_preset: str = "tiny"
    axis: str = "data"


def run(s: TrainSettings) -> tuple[dict, str]:
    """(results: {'presets': rows, 'scaling': rows}, Markdown)."""
    rows = [measure(StepSettings(p, s.batch, s.length, s.steps, dtype=s.dtype)) for p in s.presets]
    scale = (scaling(StepSettings(s.scaling_preset, s.batch, s.length, s.steps), s.scaling, s.axis)
             if s.scaling else [])
    return {"presets": rows, "scaling": scale}, markdown(rows, scale, s)


def markdown(rows: list[dict], scale: list[dict], s: TrainSettings) -> str:
    md = ["| preset | params (M) | dtype | batch×len | devices | compile s | step s | tokens/s | MFU (est.) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['preset']} | {r['params_m']:.1f} | {r['dtype']} | {r['batch']}×{r['length']} | {r['devices']} | "
                  f"{r['compile_s']:.1f} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['mfu']:.2%} |")
    if rows:
        md.append(f"\nMFU peak: {rows[0]['peak_note']}")
    if scale:
        md += ["", f"Scaling ({s.scaling_preset}, {s.axis} axis, {s.batch}×{s.length}):", "",
               "| devices | step s | tokens/s | vs 1 device |", "|---|---|---|---|"]
        base = scale[0]["step_s"]
        for r in scale:
            md.append(f"| {r['devices']} | {r['step_s']:.4f} | {r['tokens_per_s']:.0f} | {base / r['step_s']:.2f}× |")
    return "\n".join(md)


if __name__ == "__main__":
    sys.exit(side_main(SIDES))
