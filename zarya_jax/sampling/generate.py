"""The one inference entry point (SPEC §4): validate, pad/bucket the prompts, run one compiled program.

Each mode is one `jax.jit` with the model config, the generation config and `debug` static, so a
program is compiled once per (batch size, prompt bucket, model config, generation config) and a call
with new prompts of the same bucket reuses it. Mode B's thresholds (`slot_threshold`,
`token_threshold`) are passed as traced scalars instead, so sweeping them reuses one program.
`TRACE_COUNTS[mode]` counts traces (for tests).
"""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from . import ar, mdm, slotted
from .config import GenerationConfig, GenerationOutput
from .prompts import pad_prompts

TRACE_COUNTS: collections.Counter = collections.Counter()
DYNAMIC_FIELDS = ("slot_threshold", "token_threshold")
_RUNNERS = {"ar": ar.run, "ar_uncached": ar.run_uncached, "mdm": mdm.run, "slotted": slotted.run}


def _make_jitted(name: str):
    runner = _RUNNERS[name]

    def traced(params, tokens, lengths, key, dyn, *, config, gcfg, debug):
        TRACE_COUNTS[name] += 1  # runs only while tracing
        return runner(params, tokens, lengths, key, config=config, gcfg=gcfg, debug=debug, dyn=dyn)

    return jax.jit(traced, static_argnames=("config", "gcfg", "debug"))


_JITTED = {name: _make_jitted(name) for name in _RUNNERS}


def generate(params, config, prompts, generation_config: GenerationConfig, key, *, lora_params=None, lora=None,
             debug: bool = False, use_cache: bool = True) -> GenerationOutput:
    """Generates continuations of `prompts` (list of B token-id lists) → `GenerationOutput`.

    Routes by `generation_config.resolved_mode`: "ar" (SPEC §4), "mdm" (mode A, §5), "slotted"
    (mode B, §6), "spec" (§7, `zarya_jax.sampling.spec.spec_generate`; `lora_params`/`lora`, the
    drafter adapter, are used by this mode only: the other modes run the base weights). `use_cache=False` runs the AR baseline without a KV cache (mode "ar" only);
    `debug=True` adds per-pass logits to `stats["trace"]` (modes ar/mdm/slotted). Raises ValueError on
    bad input before anything is compiled.
    """
    gc = generation_config
    if not isinstance(gc, GenerationConfig):
        raise ValueError(f"generation_config: expected a GenerationConfig, got {type(gc).__name__}")
    gc.validate(config, prompts)
    mode = gc.resolved_mode
    if not use_cache and mode != "ar":
        raise ValueError(f"use_cache=False is only available for mode 'ar', not {mode!r}")
    if mode == "spec":
        from .spec import spec_generate  # the speculative sampler lives in its own module

        return spec_generate(params, config, prompts, gc, key, lora_params=lora_params, lora=lora)
    eos, pad = ar.special_ids(config, gc)
    tokens, lengths = pad_prompts(prompts, gc.prompt_bucket, pad)
    name = mode if use_cache else "ar_uncached"
    dyn = {f: jnp.float32(getattr(gc, f)) for f in DYNAMIC_FIELDS}
    static_gc = gc.replace(**{f: 0.0 for f in DYNAMIC_FIELDS})  # traced instead: no recompile per value
    raw = _JITTED[name](params, jnp.asarray(tokens), jnp.asarray(lengths), key, dyn, config=config, gcfg=static_gc,
                        debug=debug)
    raw = jax.device_get(raw)
    out_lengths = np.asarray(raw["lengths"], np.int32)
    nfe = np.asarray(raw["num_forward_passes"], np.int32)
    tpf = (out_lengths / np.maximum(nfe, 1)).astype(np.float32)
    stats = {"mode": mode, "loop_passes": int(raw["loop_passes"]),
             "mean_tokens_per_forward": float(tpf.mean()), "prompt_width": int(tokens.shape[1])}
    if mode == "mdm":
        ptoks, ppos = mdm.physical_layout(tokens, lengths, np.asarray(raw["tokens"]), out_lengths, raw["order"])
        stats.update(order=np.asarray(raw["order"]), num_diffusion=np.asarray(raw["num_diffusion"]),
                     physical_tokens=ptoks, physical_positions=ppos)
    if mode == "slotted":
        ptoks, ppos = _cut_physical(np.asarray(raw["physical_tokens"]), np.asarray(raw["physical_positions"]),
                                    lengths + out_lengths)
        stats.update(physical_tokens=ptoks, physical_positions=ppos, plans=np.asarray(raw["plans"]),
                     num_blocks=int(raw["num_blocks"]), block_size=int(raw["block_size"]))
    if debug and "trace" in raw:
        stats["trace"] = raw["trace"]
        stats["raw_physical"] = {k: raw[k] for k in ("physical_tokens", "physical_positions") if k in raw}
    return GenerationOutput(tokens=np.asarray(raw["tokens"], np.int32), lengths=out_lengths,
                            num_forward_passes=nfe, tokens_per_forward=tpf, stats=stats)


def _cut_physical(toks: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keeps the physical rows whose logical position is < end[b] (drops text after EOS), −1 after."""
    out_t = np.full_like(toks, -1)
    out_p = np.full_like(pos, -1)
    for i in range(toks.shape[0]):
        keep = (pos[i] >= 0) & (pos[i] < end[i])
        n = int(keep.sum())
        out_t[i, :n] = toks[i, keep]
        out_p[i, :n] = pos[i, keep]
    return out_t, out_p
