"""One accelerator, minutes: the numbers that decide how a pod hour is spent.

1. **train**: tokens/s and MFU of the real train step (`bench.train.measure`: Zarya slotted loss, AdamW, fp32
   master weights, state donated) for `preset` (qwen3-0.6b) in bf16 at `seq` 2048 × `train_batch` rows,
   random weights and tokens, `attention` (auto: cuDNN flash attention on a GPU, splash on a TPU), remat on;
   the mean step time over `steps` after the compile. MFU = model FLOPs (6N + attention, as in training logs)
   ÷ the device's bf16 peak (`train.metrics.PEAK_FLOPS`).
2. **window**: the cost of one cached forward pass (`sampling.passes.pass_costs`: `decode_pass`, cache donated) against
   its window size W in `windows` (1 … 64 rows) at each batch size, against `context` committed cache rows:
   ms per pass and the ratio to W = 1 — the curve that turns tokens per forward pass (what
   `experiments.evaluate` reports per mode) into wall-clock speed, and the curve `zarya_jax.eval.speed`
   chooses each batch size's fastest lossless configuration by.
3. **decode**: AR decode tokens/s (`generate(mode="ar")`, greedy, `new_tokens` per row after a
   `context`-token prompt, compile excluded, best of `repeats`) at each batch size, next to the HBM
   roofline: a decode pass must read every weight once plus the rows' KV cache, so it takes at least
   (weight bytes + mean cache bytes) ÷ bandwidth (`train.metrics.HBM_BANDWIDTH`, or `bandwidth`), and
   the roofline is batch ÷ that time. In the same run, two-pass self-speculation (`draft_length` F)
   and fused self-speculation (one pass per cycle, `fused_k` K) decode the same prompts: their tokens/s
   and ms per pass next to AR's. The weights are random, so drafts are rejected and a cycle yields about
   one token: the rows measure what a cycle costs against an AR step (`pass_vs_ar`); a trained model's
   tokens/s is about its tokens per forward (`experiments.evaluate`) ÷ ms per pass.

Parts left when `budget_s` is spent are recorded as skipped.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from .. import model as model_lib
from ..sampling import GenerationConfig, generate, passes
from ..sampling.mode import Mode
from ..sampling.modes import mode as mode_of
from ..train import sharding as shd
from ..train.metrics import hbm_bandwidth
from .results import markdown_table
from .train import StepSettings, measure, model_config


@dataclasses.dataclass(frozen=True)
class DeviceSettings:
    """`bench device` on one chip (`SMOKE`: the same code in seconds on a CPU with the tiny preset)."""

    preset: str = "qwen3-0.6b"
    dtype: str = "bfloat16"
    attention: str = "auto"
    seq: int = 2048
    train_batch: int = 16
    steps: int = 10
    windows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    batches: tuple[int, ...] = (1, 64)
    context: int = 1024
    new_tokens: int = 256
    draft_length: int = 8
    fused_k: int = 4
    repeats: int = 3
    bandwidth: float = 0.0  # memory bytes/s; 0: the device table
    budget_s: float = 450.0
    smoke: bool = False

    def check(self) -> None:
        for name in ("seq", "train_batch", "steps", "context", "new_tokens", "repeats", "draft_length", "fused_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: expected a positive integer")
        model_config(self.preset, dtype=self.dtype, attention=self.attention)  # a bad name is a ConfigError here


SMOKE = {"preset": "tiny", "seq": 128, "train_batch": 4, "steps": 2, "windows": (1, 4), "batches": (2,),
         "context": 32, "new_tokens": 8, "repeats": 1, "dtype": "float32"}


def smoke(s: DeviceSettings) -> DeviceSettings:
    """`s` with the smoke run's sizes (`SMOKE`) and `smoke` set."""
    return dataclasses.replace(s, smoke=True, **SMOKE)


def weight_bytes(cfg) -> int:
    """Bytes one forward pass reads from the weights in the compute dtype (the tied head reads the embedding)."""
    return cfg.num_params() * jnp.dtype(cfg.jnp_dtype).itemsize


def cache_bytes_per_row(cfg, rows: float) -> float:
    """Bytes of K and V for `rows` cached tokens of one sequence."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * rows * jnp.dtype(cfg.jnp_dtype).itemsize


def roofline_tokens_per_s(cfg, batch: int, prompt: int, new_tokens: int, bandwidth: float) -> float:
    """AR decode at the memory roofline: each pass reads the weights once and each row's cache (on
    average prompt + new_tokens / 2 rows), and yields one token per row."""
    bytes_per_pass = weight_bytes(cfg) + batch * cache_bytes_per_row(cfg, prompt + new_tokens / 2)
    return batch / (bytes_per_pass / bandwidth)


def decode_modes(draft_length: int, fused_k: int) -> dict[str, Mode]:
    """The decode part's modes, by name, with their knobs."""
    return {"ar": mode_of("ar"), "spec-self": mode_of("spec-self", draft_length=draft_length),
            "spec-self-fused": mode_of("spec-self-fused", draft_length=fused_k)}


def decode_speed(cfg, params, batch: int, prompt: int, new_tokens: int, repeats: int, bandwidth,
                 knobs: Mode | None = None) -> dict:
    """Decode tokens/s of one mode (`knobs`: the mode with its knobs, default AR)."""
    knobs = knobs or mode_of("ar")
    mode = knobs.name
    gc = GenerationConfig(mode=knobs, max_new_tokens=new_tokens, stop_at_eos=False, prompt_bucket=prompt)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, min(cfg.vocab_size, 256), prompt).tolist() for _ in range(batch)]
    generate(params, cfg, prompts, gc, jax.random.PRNGKey(0))  # compile
    seconds, tokens, loop_passes = min(_timed_generate(params, cfg, prompts, gc) for _ in range(repeats))
    tps = tokens / seconds
    row = {"mode": mode, "batch": batch, "prompt": prompt, "new_tokens": new_tokens, "seconds": seconds,
           "tokens_per_s": tps, "passes": loop_passes, "ms_per_pass": 1e3 * seconds / loop_passes}
    if bandwidth and mode == "ar":
        roof = roofline_tokens_per_s(cfg, batch, prompt, new_tokens, bandwidth)
        row.update(roofline_tokens_per_s=roof, fraction_of_roofline=tps / roof)
    return row


def _timed_generate(params, cfg, prompts, gc) -> tuple[float, int, int]:
    """(seconds, generated tokens, passes of the compiled loop) of one `generate` call (it returns host
    arrays: the work is done)."""
    t0 = time.perf_counter()
    out = generate(params, cfg, prompts, gc, jax.random.PRNGKey(1))
    return time.perf_counter() - t0, int(out.lengths.sum()), out.stats["loop_passes"]


def run(s: DeviceSettings) -> tuple[dict, str]:
    """(results: the three parts and what the budget skipped, Markdown)."""
    s.check()
    start = time.perf_counter()
    device = jax.devices()[0]
    bandwidth, bw_note = hbm_bandwidth(device, s.bandwidth)
    results = {"device": device.device_kind, "platform": device.platform, "device_count": jax.device_count(),
               "preset": s.preset, "dtype": s.dtype, "bandwidth_note": bw_note, "smoke": s.smoke, "skipped": []}

    def due(part: str) -> bool:
        if time.perf_counter() - start > s.budget_s:
            results["skipped"].append(part)
            return False
        return True

    one_device = shd.MeshConfig(data=1, fsdp=1, tensor=1, num_devices=1)
    if due("train"):
        results["train"] = measure(StepSettings(s.preset, s.train_batch, s.seq, s.steps, mesh=one_device,
                                                dtype=s.dtype, attention=s.attention, remat=True))
    cfg = model_config(s.preset, dtype=s.dtype, param_dtype=s.dtype)  # inference: weights in the compute dtype
    params = functools.cache(lambda: jax.jit(model_lib.init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0)))
    if due("window"):
        results["window"] = passes.pass_costs(params(), cfg, s.batches, s.windows, s.context, s.repeats)
    results["decode"] = []
    for b in s.batches:
        ar_ms = None
        for mode, knobs in decode_modes(s.draft_length, s.fused_k).items():
            if due(f"decode {mode} batch {b}"):
                row = decode_speed(cfg, params(), b, s.context, s.new_tokens, s.repeats, bandwidth, knobs)
                ar_ms = row["ms_per_pass"] if mode == "ar" else ar_ms
                row["pass_vs_ar"] = row["ms_per_pass"] / ar_ms if ar_ms else None
                results["decode"].append(row)
    results["seconds"] = time.perf_counter() - start
    return results, markdown(results)


def markdown(results: dict) -> str:
    md = [f"Device: {results['device']} ({results['platform']}); {results['preset']}, {results['dtype']}; memory: "
          f"{results['bandwidth_note']}", ""]
    if "train" in results:
        t = results["train"]
        md.append(f"Train step ({t['batch']}×{t['length']}, attention {t['attention']}): {t['tokens_per_s']:.0f} "
                  f"tokens/s, MFU {t['mfu']:.1%} ({t['peak_note']}); compile {t['compile_s']:.0f} s\n")
    if "window" in results:
        md += ["Cached forward pass vs window:", "", markdown_table(results["window"], [
            "batch", "window", "ms_per_pass", "vs_window_1", "ms_per_token_row"])]
    if results["decode"]:
        md += ["Decode (AR, two-pass and fused self-speculation; random weights, so a cycle yields ~1 token):", "",
               markdown_table(results["decode"], ["mode", "batch", "prompt", "new_tokens", "tokens_per_s", "ms_per_pass",
                                                  "pass_vs_ar", "roofline_tokens_per_s", "fraction_of_roofline"])]
    if results["skipped"]:
        md.append(f"Skipped (time budget): {', '.join(results['skipped'])}")
    return "\n".join(md)
