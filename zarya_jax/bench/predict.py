"""Each lossless mode's speed-up predicted for a target before a chip is booked (docs/decoding.md#predicted-for-a-target).

    run(PredictSettings(target="tpu:v5e:4x4", preset="qwen3-1.7b", batches=(1, 64), prompt=1024, new=8192),
        points=workdir_points("runs/quickstart"))        # or alpha_points(0.8)

1. The pass-cost curve c(b, W) from the target's compiler at the preset's real shape (`compiler_curve`):
   every pass a candidate's cycle runs (`sampling.passes.cycle_windows`), at each batch, against the mean
   live context of a `prompt` + `new` decode, costed by `bench.aot.pass_counts` and priced at the roofline
   (`bench.roofline`: max(bytes ÷ HBM bandwidth, FLOPs ÷ peak) per chip, the chip's data-sheet figures).
2. The acceptance: each lossless frontier point's tokens per forward measured in a workdir
   (`workdir_points`: the experiment's validation frontier), or a given acceptance rate α
   (`alpha_points`: a cycle of F drafts yields (1 − α^(F+1)) ÷ (1 − α) tokens in expectation).
3. The same pricing as this device's measured curve gets (`eval.speed.predict`): a point's speed-up over AR
   is (tpf ÷ tpf_AR) · c(b, 1) ÷ the mean of c(b, W) over its cycle's passes; per batch the knobs predicted
   fastest are chosen (AR unless a point beats it).

It is the compiler's cost model, never a measurement: what a cycle does besides its passes (acceptance,
sampling, the loop) and what the chip loses to launches and collectives are not in it, and a workdir's
acceptance was measured at its own answers' lengths, not at `new`.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import target as target_lib
from ..config import ConfigError
from ..eval import speed as speed_lib
from ..eval.evaluate import generation_config
from ..eval.results import FrontierPoint
from ..sampling import modes as modes_lib
from ..sampling import passes
from ..train import sharding as shd
from . import aot
from . import roofline as rl
from .results import markdown_table
from .train import model_config

DRAFT_LENGTHS = (2, 4, 8)  # the draft lengths an α prediction prices, per lossless mode
LABEL = "predicted by the target compiler's cost model, not measured"


@dataclasses.dataclass(frozen=True)
class PredictSettings:
    """A target (`zarya_jax.target`), a preset in the compute dtype, the batch sizes, a decode of `prompt` +
    `new` tokens per row, on `mesh` (default: the batch over every chip)."""

    target: str = "tpu:v5e:4x4"
    preset: str = "qwen3-1.7b"
    batches: tuple[int, ...] = (1, 64)
    prompt: int = 1024
    new: int = 8192
    mesh: shd.MeshConfig = shd.MeshConfig(data=1, fsdp=-1, tensor=1)

    def check(self) -> None:
        """ConfigError naming the first bad setting (before anything compiles)."""
        target_lib.parse(self.target)
        model_config(self.preset)
        if not self.batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise ConfigError(f"--batches {','.join(map(str, self.batches))}: expected positive integers")
        for name in ("prompt", "new"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name}={getattr(self, name)}: expected a positive integer")


def expected_tokens(alpha: float, drafts: int) -> float:
    """Tokens a cycle of `drafts` drafts yields in expectation when each is accepted with probability α
    (independently, until the first rejection; the correction or bonus token always): (1 − α^(F+1)) ÷ (1 − α)."""
    return drafts + 1.0 if alpha == 1 else (1 - alpha ** (drafts + 1)) / (1 - alpha)


def check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or not 0 <= alpha < 1:
        raise ConfigError(f"--alpha={alpha!r}: expected an acceptance rate in [0, 1)")


def alpha_points(alpha: float, draft_lengths: tuple[int, ...] = DRAFT_LENGTHS, new: int = 64) -> list[FrontierPoint]:
    """AR and every lossless mode whose cycle the curve prices, at each draft length, with the tokens per
    forward a per-draft acceptance rate α gives (`expected_tokens` ÷ the cycle's passes)."""
    check_alpha(alpha)
    out = [_point("ar", {}, 1.0)]
    for name, cls in modes_lib.MODES.items():
        if not cls.lossless or name == "ar":
            continue
        for f in draft_lengths:
            cycle = passes.cycle_windows(generation_config(name, new, {name: {"draft_length": f}}))
            if cycle is not None:
                out.append(_point(name, {"draft_length": f}, expected_tokens(alpha, f) / len(cycle)))
    return out


def _point(mode: str, knobs: dict, tpf: float) -> FrontierPoint:
    label = " ".join(f"{k}={v}" for k, v in knobs.items())
    return FrontierPoint(mode=mode, label=f"{mode} {label}".strip(), knobs=knobs, point=label, accuracy=float("nan"),
                         tokens_per_forward=tpf, tokens_per_s=0.0, examples=0, correct=[])


def workdir_points(report, chosen: bool = False) -> list[FrontierPoint]:
    """AR and the lossless points of an experiment's validation frontier (`experiment.calibrate.read_report`'s
    report), with their measured tokens per forward (`chosen`: only the point the frontier chose per mode);
    ConfigError when it has none to price."""
    frontier = report.frontier
    if frontier is None or not frontier.points:
        raise ConfigError("the workdir's report has no validation frontier (frontier.enabled=false), so no "
                          "acceptance was measured there: run the experiment with its frontier, or give --alpha")
    points = list(frontier.chosen.values()) if chosen else frontier.points
    points = [p for p in points if p.mode == "ar" or modes_lib.MODES[p.mode].lossless]
    if not any(p.mode == "ar" for p in points):
        raise ConfigError("the workdir's frontier has no AR point to compare against: add 'ar' to eval.modes")
    return points


# Whose compiler counts a pass where the target's gives no counts (a GPU): v5p's 95 GiB per chip hold what a
# GPU's 80–192 GiB hold at the shapes decoded here, so the stand-in compiles what the GPU would run.
STAND_IN = "tpu:v5p:2x2x4"


def stand_in(mesh_config: shd.MeshConfig, chips: int):
    """A mesh of `chips` chips of `STAND_IN`, the counting mesh for a target whose compiler gives no counts:
    XLA:GPU gives no cost analysis when it compiles for a GPU topology without a GPU. A decode pass's bytes
    are its weights and K/V whichever compiler fuses it, and its FLOPs its matmuls'."""
    devices = target_lib.devices(STAND_IN)
    if chips > len(devices):
        raise ConfigError(f"a target of {chips} GPUs: its passes are counted by the TPU compiler on {STAND_IN}'s "
                          f"{len(devices)} chips, which is fewer")
    return shd.make_mesh(mesh_config, devices[:chips])


def target_mesh(target: str, mesh_config: shd.MeshConfig):
    """(the mesh whose compiler counts the target's passes, the target's `Chip`): a TPU target's own devices;
    a GPU target's count on `stand_in`, priced at the GPU's data-sheet figures (no CUDA plugin needed)."""
    platform, _ = target_lib.parse(target)
    if platform == "gpu":
        kind, count = target_lib.gpu_kind(target)
        return stand_in(mesh_config, count), rl.Chip.of_kind(kind)
    mesh = shd.make_mesh(mesh_config, target_lib.devices(target))
    return mesh, rl.Chip.of(mesh.devices.flat[0])


def counts_or_stand_in(mesh):
    """`mesh` when its compiler gives counts (a TPU, a real GPU), else a `stand_in` of its shape."""
    probe = jax.jit(lambda x: x @ x).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(mesh.devices.flat[:1]), ("x",)), jax.sharding.PartitionSpec())))
    try:
        rl.counts(probe.compile())
        return mesh
    except rl.NoCostAnalysis:
        return stand_in(shd.MeshConfig(**{a: mesh.shape.get(a, 1) for a in shd.MESH_AXES}), mesh.devices.size)


def compiler_curve(cfg, mesh, chip: rl.Chip | None, batches, windows, rows: int, log=None) -> list[dict]:
    """c(b, W) at the roofline of `chip` by the compiler's counts on `mesh` (`bench.aot.pass_counts`): rows of
    the shape `sampling.passes.pass_costs` measures ({batch, window, ms_per_pass, …}) plus gbytes, gflops,
    bound and `counted_on` (the chips whose compiler counted); the bytes priced are never fewer than the pass
    must read (`roofline.decode_hand_bytes`, `bytes_from` says which). A pass the compiler refuses (a batch or context
    the chips cannot hold) is a row with `failed`, the compiler's first line, and no cost: no candidate
    needing it is priced (`eval.speed.predict`)."""
    if chip is None:
        raise ConfigError(f"device kind {mesh.devices.flat[0].device_kind!r} has no bandwidth and peak in the "
                          "tables (train.metrics): predict for a TPU or GPU target")
    counted = counts_or_stand_in(mesh)
    out = []
    for b in batches:
        for w in windows:
            try:
                c = aot.pass_counts(cfg, counted, b, w, rows)
            except Exception as e:  # noqa: BLE001 - the compiler's refusal is this point's result
                lines = [line for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
                out.append({"batch": b, "window": w, "ms_per_pass": None,
                            "failed": f"batch {b}, window {w}: the compiler refused it ({lines[0][:200]})"})
                if log:
                    log(out[-1]["failed"])
                continue
            least = rl.decode_hand_bytes(cfg, mesh.devices.size, b, rows)  # what the pass must read per chip
            out.append({"batch": b, "window": w, "ms_per_pass": 1e3 * chip.seconds(c, least),
                        "gbytes": c.bytes / 1e9, "hand_gbytes": least / 1e9, "gflops": c.flops / 1e9,
                        "bound": chip.bound(c, least), "bytes_from": "counted" if c.bytes >= least else "hand",
                        "counted_on": counted.devices.flat[0].device_kind})
            if log:
                log(f"batch {b}, window {w}: {out[-1]['ms_per_pass']:.3f} ms per pass by the cost model "
                    f"({out[-1]['bound']}-bound)")
    return out


def price(cfg, mesh, chip, points: list[FrontierPoint], batches, prompt: int, new: int, log=None) -> tuple[list, list]:
    """(the compiler's curve, per batch {batch, chosen, candidates}) for model `cfg` on `mesh`: every priced
    candidate with its predicted speed-up and tokens/s, the one predicted fastest chosen (AR unless beaten)."""
    priced = speed_lib.costed(points, new)
    windows = sorted({1} | {w for _, ws in priced for w in ws})
    curve = compiler_curve(cfg, mesh, chip, batches, windows, rl.live_rows(prompt + new // 2, cfg.cache_block), log)
    per_batch = []
    for b in batches:
        ar = next(r for r in curve if r["batch"] == b and r["window"] == 1)
        if ar["ms_per_pass"] is None:  # AR's own pass refused: nothing at this batch can be priced
            per_batch.append({"batch": b, "chosen": None, "refused": ar["failed"], "candidates": []})
            continue
        ar_ms = ar["ms_per_pass"]
        rows = [{"batch": b, "mode": c.mode, "knobs": c.point or "", "tokens_per_forward": c.tokens_per_forward,
                 "predicted_vs_ar": c.predicted_speedup, "predicted_tokens_per_s": 1e3 * b / ar_ms * c.predicted_speedup}
                for c in speed_lib.predict(points, curve, b, new)]
        best = max(rows, key=lambda r: r["predicted_vs_ar"])
        per_batch.append({"batch": b, "chosen": f"{best['mode']} {best['knobs']}".strip(), "candidates": rows})
    return curve, per_batch


def run(s: PredictSettings, points: list[FrontierPoint], acceptance: str, log=None) -> tuple[dict, str]:
    """(results, Markdown): `price` for the settings' target and preset (in bf16). `acceptance` says where
    the points' tokens per forward come from."""
    s.check()
    mesh, chip = target_mesh(s.target, s.mesh)
    cfg = model_config(s.preset, param_dtype="bfloat16", dtype="bfloat16")
    curve, per_batch = price(cfg, mesh, chip, points, s.batches, s.prompt, s.new, log)
    results = {"target": s.target, "preset": s.preset, "mesh": "/".join(str(mesh.shape[a]) for a in shd.MESH_AXES),
               "prompt": s.prompt, "new": s.new, "live_rows": rl.live_rows(s.prompt + s.new // 2, cfg.cache_block),
               "acceptance": acceptance, "label": LABEL, "curve": curve, "batches": per_batch}
    return results, markdown(results)


def length_points(table: dict) -> dict[int, list[FrontierPoint]]:
    """Per answer budget of a `bench length` table (its `length.json`), each mode's point with the tokens per
    forward measured at that budget; ConfigError when it is not such a table or has no AR rows."""
    rows = table.get("rows") if isinstance(table, dict) else None
    if not rows or any(not {"max_new_tokens", "mode", "tokens_per_forward"} <= set(r) for r in rows):
        raise ConfigError("--length-table: expected a `bench length` result (length.json: rows of max_new_tokens, "
                          "mode, tokens_per_forward)")
    out: dict[int, list[FrontierPoint]] = {}
    for r in rows:
        knobs = dict(r.get("knobs") or {})
        out.setdefault(int(r["max_new_tokens"]), []).append(_point(r["mode"], knobs, float(r["tokens_per_forward"])))
    if any(all(p.mode != "ar" for p in pts) for pts in out.values()):
        raise ConfigError("--length-table: every answer budget needs its AR row")
    return out


def by_length(s: PredictSettings, table: dict, log=None) -> tuple[dict, str]:
    """(results, Markdown): per answer budget of a `bench length` table, each mode's speed-up over AR
    predicted on the target at that budget (a decode of `prompt` + the budget, the tokens per forward the
    table measured there) beside the speed-up the table measured on its own device."""
    s.check()
    mesh, chip = target_mesh(s.target, s.mesh)
    cfg = model_config(s.preset, param_dtype="bfloat16", dtype="bfloat16")
    measured = {(int(r["max_new_tokens"]), r["mode"]): r for r in table["rows"]}
    rows = []
    for budget, points in sorted(length_points(table).items()):
        _, per_batch = price(cfg, mesh, chip, points, s.batches, s.prompt, budget, log)
        for b in per_batch:
            for c in b["candidates"]:
                m = measured[budget, c["mode"]]
                rows.append({"max_new_tokens": budget, "mean_tokens": m.get("mean_tokens"), "batch": b["batch"],
                             "mode": c["mode"], "knobs": c["knobs"], "tokens_per_forward": c["tokens_per_forward"],
                             "predicted_vs_ar": c["predicted_vs_ar"], "measured_vs_ar": m.get("speedup")})
    results = {"target": s.target, "preset": s.preset, "prompt": s.prompt, "label": LABEL,
               "measured_on": table.get("device"), "rows": rows}
    md = [f"# Speed-up against answer length on {s.target} ({s.preset}, prompt {s.prompt}): {LABEL}; measured "
          f"beside it on {table.get('device')}, the table's own device", "",
          markdown_table(rows, ["max_new_tokens", "mean_tokens", "batch", "mode", "knobs", "tokens_per_forward",
                                "predicted_vs_ar", "measured_vs_ar"])]
    return results, "\n".join(md)


def markdown(results: dict) -> str:
    md = [f"# Predicted for {results['target']} ({results['preset']}, mesh {results['mesh']}, {results['prompt']} + "
          f"{results['new']} tokens per row): {results['label']}", "",
          f"Acceptance: {results['acceptance']}. Pass-cost curve at {results['live_rows']} live cache rows:", "",
          markdown_table(results["curve"], ["batch", "window", "ms_per_pass", "gbytes", "hand_gbytes", "bytes_from",
                                            "gflops", "bound", "counted_on", "failed"])]
    for b in results["batches"]:
        if b["chosen"] is None:
            md += [f"Batch {b['batch']}: not priced: {b['refused']}", ""]
            continue
        md += [f"Batch {b['batch']}: predicted fastest **{b['chosen']}**", "",
               markdown_table(b["candidates"], ["mode", "knobs", "tokens_per_forward", "predicted_vs_ar",
                                                "predicted_tokens_per_s"])]
    return "\n".join(md)
