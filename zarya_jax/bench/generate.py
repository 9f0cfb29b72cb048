"""Generation throughput: AR, mode A, mode B (tokens/s, tokens per forward), JAX vs HF, cached vs uncached.

On a tiny random Qwen3 (built with transformers, weights copied into the JAX params) or on a
checkpoint (`ckpt`; the HF comparison then needs `hf=False`). Per batch size and mode: compile
time, median wall time of the timed calls, generated tokens/s and mean tokens per forward pass, and
for AR the JAX decode without a KV cache (one full causal pass per token). Rows never stop at EOS, so
every mode generates the same number of tokens.

The AR row is compared with Hugging Face at its best on the same CPU and weights: transformers' greedy
`generate` and HF's own forward loop with its KV cache (`cache`, formerly `past_key_values`; greedy,
under `torch.inference_mode`), each with every attention implementation in `hf_attention` and every
PyTorch thread count in `hf_threads` (default: as many as XLA uses, and 1). The fastest is the
baseline, and the output says so when `generate` is far slower than the forward passes it is made of.
Each side runs in a process of its own while the other is idle (`python -m zarya_jax.bench.generate
--side jax|hf`), alternating JAX, HF, … for `rounds`; each child compiles (or warms up) and times
`repeats` calls, and the table reports the median over every timed call of every round.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys

import jax
import numpy as np

from .. import checkpoint
from ..config import ModelConfig
from ..sampling import GenerationConfig, generate
from ..sampling.modes import mode as mode_of
from ..testing import random_hf_model, random_torch_model
from .baseline import (HF_ATTENTION, SideRunner, alternate, cpu_threads, from_json, hf_setups, hf_threads, side_main,
                       to_json, worker)
from .results import markdown_table, pooled, timed, timings

FAR = 2.0  # a baseline this many times slower than its own forward loop is reported as such
MODES = ("ar", "mdm", "slotted")  # the decoders timed here (Ψ-Spec: `bench.spec`)
# O(1) logits, so that greedy decoding is not a tie between near-equal logits.
INIT = {"initializer_range": 0.2}


@dataclasses.dataclass(frozen=True)
class GenerateSettings:
    """Each mode of `modes` (a subset of `MODES`, with their knobs) at each batch size, on the random model of
    this shape or on `ckpt`; with `hf`, AR against HF in each (`hf_attention` × `hf_threads`)."""

    batch_sizes: tuple[int, ...] = (1, 8, 32)
    modes: tuple[str, ...] = MODES
    max_new_tokens: int = 32
    prompt_len: int = 16
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 264  # the mask token is vocab − 5
    slot_size: int = 4
    serial_num_blocks: int = 2
    steps: int = 0  # mode A's T
    repeats: int = 3
    seed: int = 0
    ckpt: str | None = None
    hf: bool = True
    uncached: bool = True
    verify: bool = True
    rounds: int = 3
    hf_attention: tuple[str, ...] = HF_ATTENTION
    hf_threads: tuple[int, ...] | None = None

    def check(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"--modes {','.join(self.modes)!r}: expected a comma-separated subset of "
                             f"{','.join(MODES)}")
        if self.ckpt is None and self.vocab < 16:
            raise ValueError(f"--vocab={self.vocab}: expected ≥ 16 (special tokens sit at the top of the vocabulary)")
        if self.ckpt is not None and self.hf:
            raise ValueError("--ckpt: the HF comparison needs the random model; pass --no-hf with --ckpt")


def random_config(layers, hidden, heads, kv_heads, vocab) -> ModelConfig:
    """The random model's config: special tokens at the top of the vocabulary."""
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=4096, mask_token_id=vocab - 5, eos_token_id=vocab - 6,
                       pad_token_id=vocab - 8)


def prompts(seed, vocab, prompt_len, batch_sizes) -> list[list[list[int]]]:
    """The same random prompts in every process, one batch per batch size."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, min(vocab, 256), size=(b, prompt_len)).tolist() for b in batch_sizes]


def jax_side(settings: dict) -> dict:
    """Per batch size and mode of `settings` (`GenerateSettings` as JSON; and the cache-free AR decode):
    compile seconds, `repeats` timed calls, tokens per forward pass; the AR row also carries its greedy tokens
    (for the comparison with HF)."""
    s = from_json(GenerateSettings, settings)
    if s.ckpt is not None:
        params, config = checkpoint.load(s.ckpt, verify=s.verify)
    else:
        config = random_config(s.layers, s.hidden, s.heads, s.kv_heads, s.vocab)
        _, params = random_hf_model(config, s.seed, **INIT)
    knobs = {"ar": {}, "mdm": {"steps": s.steps},
             "slotted": {"slot_size": s.slot_size, "serial_num_blocks": s.serial_num_blocks}}
    rows = []
    for b, batch in zip(s.batch_sizes, prompts(s.seed, config.vocab_size, s.prompt_len, s.batch_sizes)):
        for mode in s.modes:
            gc = GenerationConfig(mode=mode_of(mode, **knobs[mode]), max_new_tokens=s.max_new_tokens,
                                  temperature=0.0, stop_at_eos=False, prompt_bucket=s.prompt_len)
            variants = [("cached", True)] + ([("uncached", False)] if mode == "ar" and s.uncached else [])
            for label, use_cache in variants:
                def call(k, use_cache=use_cache, gc=gc):
                    out = generate(params, config, batch, gc, k, use_cache=use_cache)
                    jax.block_until_ready(out.tokens)
                    return out

                out, compile_s = timed(lambda: call(jax.random.PRNGKey(0)))
                times = []
                for r in range(s.repeats):
                    out, dt = timed(lambda r=r: call(jax.random.PRNGKey(r + 1)))
                    times.append(dt)
                row = {"batch": b, "mode": mode if use_cache else "ar (no cache)", "new_tokens": int(out.lengths.sum()),
                       "compile_s": compile_s, "times": times,
                       "tokens_per_forward": float(out.tokens_per_forward.mean()),
                       "forward_passes_per_row": float(out.num_forward_passes.mean())}
                if mode == "ar" and use_cache:
                    row["tokens"] = np.asarray(out.tokens).tolist()
                rows.append(row)
    return {"backend": jax.default_backend(), "layers": config.num_layers, "hidden": config.hidden_size,
            "vocab": config.vocab_size, "dtype": config.dtype, "rows": rows}


def hf_side(settings: dict) -> dict:
    """Per batch size of `settings` (`GenerateSettings` as JSON, `hf_threads` resolved), for `generate` and for
    the plain forward loop in each configuration (`hf_setups`: attention implementation × PyTorch threads):
    the greedy tokens and `repeats` timed calls (after a warm-up). No JAX array is made here."""
    import torch  # the PyTorch baseline (torch is a test/benchmark dependency only)

    s = from_json(GenerateSettings, settings)
    config = random_config(s.layers, s.hidden, s.heads, s.kv_heads, s.vocab)
    models = {a: random_torch_model(config, s.seed, attn_implementation=a, **INIT) for a in s.hf_attention}
    rows = []
    for b, batch in zip(s.batch_sizes, prompts(s.seed, s.vocab, s.prompt_len, s.batch_sizes)):
        ids = torch.tensor(batch)
        runs = {}
        for name, a, t in hf_setups(s.hf_attention, s.hf_threads):
            torch.set_num_threads(t)
            for way, fn in (("generate", hf_generate), ("forward loop", hf_loop)):
                call = lambda: fn(models[a], ids, s.max_new_tokens, config)  # noqa: E731,B023 (used in this iteration)
                tokens = call()  # warm-up
                runs[f"{way}, {name}"] = {"tokens": tokens.tolist(), "times": timings(call, s.repeats)}
        rows.append({"batch": b, "runs": runs})
    return {"torch": torch.__version__, "rows": rows}


def hf_generate(model, ids, max_new_tokens, config):
    """transformers' greedy `generate`: exactly `max_new_tokens` new tokens, the mask token suppressed."""
    import torch

    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=config.pad_token_id,
                             suppress_tokens=[config.mask_token_id])
    return out[:, ids.shape[1]:]


def hf_loop(model, ids, max_new_tokens, config):
    """HF's plain greedy decode: one prefill, then one forward per token on its KV cache (`cache`, formerly
    `past_key_values`), the mask token suppressed as the JAX sampler does; only the last position's logits
    are computed."""
    import torch

    new = []
    with torch.inference_mode():
        out = model(ids, use_cache=True, logits_to_keep=1)
        for i in range(max_new_tokens):
            logits = out.logits[:, -1]
            logits[:, config.mask_token_id] = -torch.inf
            tok = logits.argmax(-1, keepdim=True)
            new.append(tok)
            if i + 1 < max_new_tokens:
                out = model(tok, cache=out.cache, use_cache=True, logits_to_keep=1)
    return torch.cat(new, 1)


SIDES = {"jax": jax_side, "hf": hf_side}


def measure(s: GenerateSettings, run_side: SideRunner = worker) -> dict:
    """Runs the benchmark (module doc), each side by `run_side` (default: a process of its own); returns
    {'config': …, 'timing': …, 'notes': […], 'rows': [one dict per (batch, mode)]}. Without `hf` the JAX side
    runs in this process."""
    s.check()
    s = dataclasses.replace(s, hf_threads=hf_threads(s.hf_threads))
    threads, rounds = list(s.hf_threads), s.rounds
    if s.hf:
        runs = alternate(__name__, {side: {"settings": to_json(s)} for side in SIDES}, rounds, run_side)
    else:
        runs, rounds = {"jax": [jax_side(to_json(s))], "hf": []}, 1
    rows, notes = [], []
    for i, first in enumerate(runs["jax"][0]["rows"]):
        per_round = [r["rows"][i] for r in runs["jax"]]
        t = pooled([r["times"] for r in per_round])
        row = {k: first[k] for k in ("batch", "mode", "new_tokens", "tokens_per_forward", "forward_passes_per_row")}
        row.update({"compile_s": statistics.median(r["compile_s"] for r in per_round), "wall_s": t["median_s"],
                    "min_s": t["min_s"], "tokens_per_s": first["new_tokens"] / t["median_s"]})
        if first["mode"] == "ar" and runs["hf"]:
            hf_rows = [next(r for r in h["rows"] if r["batch"] == first["batch"]) for h in runs["hf"]]
            row.update(baseline(first, hf_rows, t["median_s"], notes))
        rows.append(row)
    cached = {r["batch"]: r for r in rows if r["mode"] == "ar"}
    for r in rows:
        if r["mode"] == "ar (no cache)" and r["batch"] in cached:
            r["cached_speedup"] = r["wall_s"] / cached[r["batch"]]["wall_s"]
    c = runs["jax"][0]
    return {"benchmark": "generate", "backend": c["backend"], "cpu_count": os.cpu_count(),
            "jax_threads": cpu_threads(),
            "timing": {"rounds": rounds, "repeats_per_round": s.repeats, "separate_processes": s.hf,
                       "statistic": "median over every timed call of every round (min in min_s)"},
            "config": {"layers": c["layers"], "hidden": c["hidden"], "vocab": c["vocab"], "prompt_len": s.prompt_len,
                       "max_new_tokens": s.max_new_tokens, "slot_size": s.slot_size,
                       "serial_num_blocks": s.serial_num_blocks, "steps": s.steps, "repeats": s.repeats,
                       "rounds": rounds, "hf_attention": list(s.hf_attention) if s.hf else [],
                       "hf_threads": threads if s.hf else [], "ckpt": s.ckpt, "dtype": c["dtype"]},
            "notes": notes, "rows": rows}


def baseline(jax_row: dict, hf_rows: list[dict], jax_s: float, notes: list[str]) -> dict:
    """The AR row's comparison with every HF configuration (pooled over rounds); the fastest is the baseline.
    Appends a note to `notes` when `generate` is `FAR` times slower than HF's own forward loop."""
    tokens = np.asarray(jax_row["tokens"])
    n = tokens.size
    per = {name: pooled([r["runs"][name]["times"] for r in hf_rows]) for name in hf_rows[0]["runs"]}
    fastest = lambda way: min((k for k in per if k.startswith(way)), key=lambda k: per[k]["median_s"])  # noqa: E731
    gen, loop, base = fastest("generate"), fastest("forward loop"), fastest("")
    out = {"hf_baseline": base, "hf_wall_s": per[base]["median_s"], "hf_min_s": per[base]["min_s"],
           "hf_tokens_per_s": n / per[base]["median_s"], "speedup_vs_hf": per[base]["median_s"] / jax_s,
           "hf_generate_tokens_per_s": n / per[gen]["median_s"], "speedup_vs_hf_generate": per[gen]["median_s"] / jax_s,
           "hf_loop_tokens_per_s": n / per[loop]["median_s"],
           "greedy_match_hf": float(np.mean(np.asarray(hf_rows[0]["runs"][base]["tokens"]) == tokens)),
           "hf_configs_s": {k: v["median_s"] for k, v in per.items()}}
    ratio = per[gen]["median_s"] / per[loop]["median_s"]
    if ratio >= FAR:
        notes.append(f"batch {jax_row['batch']}: HF's best `generate` ({gen}) takes {per[gen]['median_s']:.3g} s for "
                     f"{n} tokens, {ratio:.1f}× its own forward loop ({loop}, {per[loop]['median_s']:.3g} s): "
                     f"generate is far below its parts; the baseline is {base}")
    return out


def markdown(results: dict) -> str:
    c, t = results["config"], results["timing"]
    method = (f"each side in a process of its own, the other idle, alternated over {t['rounds']} rounds of "
              f"{t['repeats_per_round']} calls (median of all); HF at the fastest of its generate and its forward "
              "loop, attention implementations and thread counts" if t["separate_processes"]
              else f"median of {t['repeats_per_round']} calls")
    head = (f"Generation, {c['layers']} layers, hidden {c['hidden']}, vocab {c['vocab']}, prompt {c['prompt_len']}, "
            f"{c['max_new_tokens']} new tokens, greedy, backend {results['backend']}; {method}\n\n")
    cols = ["batch", "mode", "new_tokens", "compile_s", "wall_s", "tokens_per_s", "tokens_per_forward",
            "hf_baseline", "hf_tokens_per_s", "speedup_vs_hf", "hf_generate_tokens_per_s", "speedup_vs_hf_generate",
            "greedy_match_hf", "cached_speedup"]
    notes = "".join(f"\n- {n}" for n in results["notes"])
    return head + markdown_table(results["rows"], cols) + (f"\nNotes:{notes}\n" if notes else "")


def run(s: GenerateSettings, run_side: SideRunner = worker) -> tuple[dict, str]:
    results = measure(s, run_side)
    return results, markdown(results)


if __name__ == "__main__":
    sys.exit(side_main(SIDES))
