"""The device check: on the chip in hand, in minutes, what decoding measures beside what the compiler predicts.

    python -m experiments.bench check        # one GPU or TPU chip, ≤ 8 minutes (--budget-s)

Per preset (qwen3-0.6b, qwen3-1.7b; random weights in bf16):
1. **curve**: the pass-cost curve c(b, W) measured (`sampling.passes.pass_costs`, against `context` committed
   rows) beside the one the compiler predicts for this chip (`bench.predict.compiler_curve`: the same XLA that
   compiles for a `gpu:`/`tpu:` target from a CPU host, here compiling for the local device; the roofline of
   its counts at the chip's data-sheet bandwidth and peak), and measured ÷ predicted;
2. **decode**: AR tokens/s beside the HBM roofline (`bench.device.decode_speed`), and a two-pass and a fused
   self-speculative cycle's cost in AR steps, measured (random weights: each cycle yields about one token,
   so its ms per pass is the cycle's cost) beside predicted (the sum of its passes' predicted ms ÷ AR's).

Then, for each quickstart workdir present (`workdirs`; trained on any host), **race**: AR and the points the
frontier chose raced on validation and test at each batch (`experiment.calibrate.calibrate`, points "chosen"),
the measured speed-up beside two predictions — from the curve measured here (`eval.speed.predict`) and from
the compiler's curve (`bench.predict.price`) with the workdir's acceptance.

Parts left when `budget_s` is spent are recorded as skipped. `predict_target` predicts for a named target
instead of the local device (the CPU smoke run, which has no chip table, uses a TPU topology).
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax

from .. import model as model_lib
from ..config import ConfigError
from ..eval import speed as speed_lib
from ..sampling import GenerationConfig, passes
from ..train import sharding as shd
from ..train.metrics import hbm_bandwidth
from . import predict
from . import roofline as rl
from .device import decode_modes, decode_speed
from .results import markdown_table
from .train import model_config


@dataclasses.dataclass(frozen=True)
class CheckSettings:
    presets: tuple[str, ...] = ("qwen3-0.6b", "qwen3-1.7b")
    batches: tuple[int, ...] = (1, 64)
    windows: tuple[int, ...] = (1, 4, 16, 64)
    context: int = 1024
    new_tokens: int = 128
    draft_length: int = 4
    fused_k: int = 4
    repeats: int = 3
    workdirs: tuple[str, ...] = ("runs/quickstart", "runs/quickstart_ar")
    race_batches: tuple[int, ...] = (1, 25)
    predict_target: str = ""  # "": the local device
    dtype: str = "bfloat16"
    budget_s: float = 420.0


RACE_PROMPT = 32  # prompt rows the compiler's race prediction assumes: the embedded task's prompts are shorter
SMOKE = {"presets": ("tiny",), "batches": (2,), "windows": (1, 2), "context": 32, "new_tokens": 8, "repeats": 1,
         "draft_length": 2, "fused_k": 1, "workdirs": (), "predict_target": "tpu:v5e:2x2", "dtype": "float32"}


def run(s: CheckSettings) -> tuple[dict, str]:
    """(results: per preset its curve and decode rows, per workdir its race, and what the budget skipped; Markdown)."""
    start = time.perf_counter()
    local = jax.devices()[0]
    one = shd.MeshConfig(data=1, fsdp=1, tensor=1, num_devices=1)
    if s.predict_target:
        mesh, chip = predict.target_mesh(s.predict_target, one)
    else:
        mesh = shd.make_mesh(one, (local,))
        chip = rl.Chip.of(local)
    bandwidth, note = hbm_bandwidth(local)
    results = {"device": local.device_kind, "platform": local.platform,
               "predicted_for": chip.kind if chip else local.device_kind,
               "chip": None if chip is None else dataclasses.asdict(chip), "bandwidth_note": note,
               "label": predict.LABEL, "presets": [], "races": [], "skipped": []}

    def due(part: str) -> bool:
        if time.perf_counter() - start > s.budget_s:
            results["skipped"].append(part)
            return False
        return True

    for name in s.presets:
        if due(f"{name} curve"):
            results["presets"].append(_preset(s, name, mesh, chip, bandwidth, due))
    for workdir in s.workdirs:
        if os.path.isfile(os.path.join(workdir, "report.json")) and due(f"race {workdir}"):
            results["races"].append(_race(s, workdir, mesh, chip))
    results["seconds"] = time.perf_counter() - start
    return results, markdown(results)


def _preset(s: CheckSettings, name: str, mesh, chip, bandwidth, due) -> dict:
    cfg = model_config(name, dtype=s.dtype, param_dtype=s.dtype)
    params = jax.jit(model_lib.init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    measured = passes.pass_costs(params, cfg, s.batches, s.windows, s.context, s.repeats)
    cycles = {m: passes.cycle_windows(GenerationConfig(mode=k))
              for m, k in decode_modes(s.draft_length, s.fused_k).items()}
    windows = sorted(set(s.windows) | {w for ws in cycles.values() for w in ws})
    predicted, why = {}, None
    if chip is not None:
        try:
            predicted = {(r["batch"], r["window"]): r["ms_per_pass"] for r in predict.compiler_curve(
                cfg, mesh, chip, s.batches, windows, rl.live_rows(s.context, cfg.cache_block))}
        except ConfigError as e:  # e.g. no counts here and no libtpu for the stand-in: the measurements still run
            why = str(e)
    curve = [{**{k: r[k] for k in ("batch", "window", "ms_per_pass")},
              "predicted_ms": predicted.get((r["batch"], r["window"])),
              "measured_vs_predicted": _ratio(r["ms_per_pass"], predicted.get((r["batch"], r["window"])))}
             for r in measured]
    decode = []
    for b in s.batches:
        ar_ms = None
        for mode, knobs in decode_modes(s.draft_length, s.fused_k).items():
            if not due(f"{name} decode {mode} batch {b}"):
                continue
            row = decode_speed(cfg, params, b, s.context, s.new_tokens, s.repeats, bandwidth, knobs)
            ar_ms = row["ms_per_pass"] if mode == "ar" else ar_ms
            cost = [predicted.get((b, w)) for w in cycles[mode]]
            decode.append({**row, "cycle_in_ar_steps": _ratio(row["ms_per_pass"], ar_ms),
                           "predicted_cycle_in_ar_steps": None if None in cost or (b, 1) not in predicted
                           else sum(cost) / predicted[b, 1]})
    return {"preset": name, "curve": curve, "decode": decode, "not_predicted": why}


def _race(s: CheckSettings, workdir: str, mesh, chip) -> dict:
    from .. import overrides  # the experiment layer, for a workdir's model and report
    from ..experiment.calibrate import calibrate, read_report
    from ..experiment.config import ExperimentConfig

    report = read_report(workdir)
    choice = calibrate(workdir, speed_lib.SpeedConfig(batches=s.race_batches), points="chosen")
    compiler = {}
    if chip is not None:
        config = overrides.build(ExperimentConfig, report.config)
        new = config.eval.max_new_tokens
        _, per_batch = predict.price(config.model, mesh, chip, predict.workdir_points(report), s.race_batches,
                                     RACE_PROMPT, new)
        compiler = {(b["batch"], c["mode"], c["knobs"]): c["predicted_vs_ar"] for b in per_batch
                    for c in b["candidates"]}
    rows = [{"batch": c.batch, "mode": x.mode, "knobs": x.point or "", "measured_vs_ar": x.speedup,
             "predicted_from_measured_curve": x.predicted_speedup,
             "predicted_by_compiler": compiler.get((c.batch, x.mode, x.point or "")),
             "test_vs_ar": c.test_speedup if x == c.chosen else None}
            for c in choice.choices for x in c.candidates if x.tokens_per_s is not None]
    return {"workdir": workdir, "rows": rows}


def _ratio(a, b):
    return None if a is None or not b else a / b


def markdown(results: dict) -> str:
    md = [f"Device check on {results['device']} ({results['platform']}); predicted for {results['predicted_for']} "
          f"({results['label']}); memory: {results['bandwidth_note']}", ""]
    for p in results["presets"]:
        md += [f"## {p['preset']}: pass-cost curve, measured beside predicted", ""]
        if p.get("not_predicted"):
            md += [f"Not predicted: {p['not_predicted']}", ""]
        md += [markdown_table(p["curve"], ["batch", "window", "ms_per_pass", "predicted_ms", "measured_vs_predicted"]),
               f"## {p['preset']}: decode (random weights, so a cycle yields about one token)", "",
               markdown_table(p["decode"], ["mode", "batch", "tokens_per_s", "ms_per_pass", "roofline_tokens_per_s",
                                            "fraction_of_roofline", "cycle_in_ar_steps",
                                            "predicted_cycle_in_ar_steps"])]
    for r in results["races"]:
        md += [f"## {r['workdir']}: the race, measured beside predicted", "",
               markdown_table(r["rows"], ["batch", "mode", "knobs", "measured_vs_ar", "predicted_from_measured_curve",
                                          "predicted_by_compiler", "test_vs_ar"])]
    if results["skipped"]:
        md.append(f"Skipped (time budget): {', '.join(results['skipped'])}")
    return "\n".join(md)

