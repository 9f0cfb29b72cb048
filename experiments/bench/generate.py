"""Generation throughput: AR, mode A, mode B (tokens/s, tokens per forward), JAX vs HF, cached vs uncached.

    python -m experiments.bench generate [--batch-sizes 1,8,32 --max-new-tokens 32 --rounds 3]
    python -m experiments.bench generate --ckpt CKPT --no-hf

On a tiny random Qwen3 (built with transformers, weights copied into the JAX params) or on a
checkpoint (`--ckpt`; the HF comparison then needs `--no-hf`). Per batch size and mode: compile
time, median wall time of the timed calls, generated tokens/s and mean tokens per forward pass, and
for AR the JAX decode without a KV cache (one full causal pass per token). Rows never stop at EOS, so
every mode generates the same number of tokens.

The AR row is compared with Hugging Face at its best on the same CPU and weights: transformers' greedy
`generate` and HF's own forward loop with its KV cache (`cache`, formerly `past_key_values`; greedy,
under `torch.inference_mode`), each with every attention implementation in `--hf-attention` and every
PyTorch thread count in `--hf-threads` (default: as many as XLA uses, and 1). The fastest is the
baseline, and the output says so when `generate` is far slower than the forward passes it is made of.
Each side runs in a process of its own while the other is idle (`python -m experiments.bench.generate
--side jax|hf`), alternating JAX, HF, … for `--rounds`; each child compiles (or warms up) and times
`--repeats` calls, and the table reports the median over every timed call of every round.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import numpy as np

from zarya_jax import checkpoint
from zarya_jax.config import ModelConfig
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.sampling.modes import mode as mode_of
from zarya_jax.testing import random_hf_model, random_torch_model

from .harness import (HF_ATTENTION, add_baseline_arguments, alternate, check_heads, check_positive, cpu_threads,
                      csv_ints, hf_attention, hf_setups, hf_threads, markdown_table, pooled, side_main, timed,
                      timings)

FAR = 2.0  # a baseline this many times slower than its own forward loop is reported as such


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", type=csv_ints, default=[1, 8, 32])
    p.add_argument("--modes", default="ar,mdm,slotted", help="comma-separated subset of ar,mdm,slotted")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=264, help="random model vocab (the mask token is vocab − 5)")
    p.add_argument("--slot-size", type=int, default=4)
    p.add_argument("--serial-num-blocks", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="mode A's T")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per configuration in each child process")
    add_baseline_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt", default=None, help="benchmark this checkpoint instead of a random model")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' PyTorch generate")
    p.add_argument("--no-verify", action="store_true", help="load --ckpt without checking its checksums")
    p.add_argument("--no-uncached", action="store_true", help="skip the cache-free AR decode")


def _random_config(layers, hidden, heads, kv_heads, vocab) -> ModelConfig:
    """The random model's config: special tokens at the top of the vocabulary."""
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=4096, mask_token_id=vocab - 5, eos_token_id=vocab - 6,
                       pad_token_id=vocab - 8)


# O(1) logits, so that greedy decoding is not a tie between near-equal logits.
INIT = {"initializer_range": 0.2}


def _prompts(seed, vocab, prompt_len, batch_sizes) -> list[list[list[int]]]:
    """The same random prompts in every process, one batch per batch size."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, min(vocab, 256), size=(b, prompt_len)).tolist() for b in batch_sizes]


def jax_side(batch_sizes=(1, 8, 32), modes=("ar", "mdm", "slotted"), max_new_tokens=32, prompt_len=16, layers=2,
             hidden=128, heads=4, kv_heads=2, vocab=264, slot_size=4, serial_num_blocks=2, steps=0, repeats=3,
             seed=0, ckpt=None, uncached=True, verify=True) -> dict:
    """Per batch size and mode (and the cache-free AR decode): compile seconds, `repeats` timed calls, tokens
    per forward pass; the AR row also carries its greedy tokens (for the comparison with HF)."""
    if ckpt is not None:
        params, config = checkpoint.load(ckpt, verify=verify)
    else:
        config = _random_config(layers, hidden, heads, kv_heads, vocab)
        _, params = random_hf_model(config, seed, **INIT)
    knobs = {"ar": {}, "mdm": {"steps": steps},
             "slotted": {"slot_size": slot_size, "serial_num_blocks": serial_num_blocks}}
    rows = []
    for b, prompts in zip(batch_sizes, _prompts(seed, config.vocab_size, prompt_len, batch_sizes)):
        for mode in modes:
            gc = GenerationConfig(mode=mode_of(mode, **knobs[mode]), max_new_tokens=max_new_tokens, temperature=0.0,
                                  stop_at_eos=False, prompt_bucket=prompt_len)
            variants = [("cached", True)] + ([("uncached", False)] if mode == "ar" and uncached else [])
            for label, use_cache in variants:
                def call(k, use_cache=use_cache, gc=gc):
                    out = generate(params, config, prompts, gc, k, use_cache=use_cache)
                    jax.block_until_ready(out.tokens)
                    return out

                out, compile_s = timed(lambda: call(jax.random.PRNGKey(0)))
                times = []
                for r in range(repeats):
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


def hf_side(batch_sizes=(1, 8, 32), max_new_tokens=32, prompt_len=16, layers=2, hidden=128, heads=4, kv_heads=2,
            vocab=264, repeats=3, seed=0, attention=HF_ATTENTION, threads=(1,)) -> dict:
    """Per batch size, for `generate` and for the plain forward loop in each configuration (`hf_setups`:
    attention implementation × PyTorch threads): the greedy tokens and `repeats` timed calls (after a
    warm-up). No JAX array is made here."""
    import torch  # the PyTorch baseline (torch is a test/benchmark dependency only)

    config = _random_config(layers, hidden, heads, kv_heads, vocab)
    models = {a: random_torch_model(config, seed, attn_implementation=a, **INIT) for a in attention}
    rows = []
    for b, prompts in zip(batch_sizes, _prompts(seed, vocab, prompt_len, batch_sizes)):
        ids = torch.tensor(prompts)
        runs = {}
        for name, a, t in hf_setups(attention, threads):
            torch.set_num_threads(t)
            for way, fn in (("generate", _hf_generate), ("forward loop", _hf_loop)):
                call = lambda: fn(models[a], ids, max_new_tokens, config)  # noqa: E731,B023 (used in this iteration)
                tokens = call()  # warm-up
                runs[f"{way}, {name}"] = {"tokens": tokens.tolist(), "times": timings(call, repeats)}
        rows.append({"batch": b, "runs": runs})
    return {"torch": torch.__version__, "rows": rows}


def _hf_generate(model, ids, max_new_tokens, config):
    """transformers' greedy `generate`: exactly `max_new_tokens` new tokens, the mask token suppressed."""
    import torch

    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=config.pad_token_id,
                             suppress_tokens=[config.mask_token_id])
    return out[:, ids.shape[1]:]


def _hf_loop(model, ids, max_new_tokens, config):
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


def bench(batch_sizes=(1, 8, 32), modes=("ar", "mdm", "slotted"), max_new_tokens=32, prompt_len=16, layers=2,
          hidden=128, heads=4, kv_heads=2, vocab=264, slot_size=4, serial_num_blocks=2, steps=0, repeats=3, seed=0,
          ckpt=None, hf=True, uncached=True, verify=True, rounds=3, attention=HF_ATTENTION, threads=None) -> dict:
    """Runs the benchmark (module doc); returns {'config': …, 'timing': …, 'notes': […], 'rows': [one dict
    per (batch, mode)]}. Without `hf` the JAX side runs in this process."""
    if ckpt is not None and hf:
        raise ValueError("--ckpt: the HF comparison needs the random model; pass --no-hf with --ckpt")
    shape = dict(batch_sizes=list(batch_sizes), max_new_tokens=max_new_tokens, prompt_len=prompt_len, layers=layers,
                 hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab, repeats=repeats, seed=seed)
    jax_kwargs = dict(shape, modes=list(modes), slot_size=slot_size, serial_num_blocks=serial_num_blocks,
                      steps=steps, ckpt=ckpt, uncached=uncached, verify=verify)
    if hf:
        runs = alternate("experiments.bench.generate", {"jax": jax_kwargs, "hf": dict(shape, attention=list(attention),
                                                                              threads=list(hf_threads(threads)))},
                         rounds)
    else:
        runs, rounds = {"jax": [jax_side(**jax_kwargs)], "hf": []}, 1
    rows, notes = [], []
    for i, first in enumerate(runs["jax"][0]["rows"]):
        per_round = [r["rows"][i] for r in runs["jax"]]
        t = pooled([r["times"] for r in per_round])
        row = {k: first[k] for k in ("batch", "mode", "new_tokens", "tokens_per_forward", "forward_passes_per_row")}
        row.update({"compile_s": statistics.median(r["compile_s"] for r in per_round), "wall_s": t["median_s"],
                    "min_s": t["min_s"], "tokens_per_s": first["new_tokens"] / t["median_s"]})
        if first["mode"] == "ar" and runs["hf"]:
            hf_rows = [next(r for r in h["rows"] if r["batch"] == first["batch"]) for h in runs["hf"]]
            row.update(_baseline(first, hf_rows, t["median_s"], notes))
        rows.append(row)
    cached = {r["batch"]: r for r in rows if r["mode"] == "ar"}
    for r in rows:
        if r["mode"] == "ar (no cache)" and r["batch"] in cached:
            r["cached_speedup"] = r["wall_s"] / cached[r["batch"]]["wall_s"]
    c = runs["jax"][0]
    return {"benchmark": "generate", "backend": c["backend"], "cpu_count": os.cpu_count(),
            "jax_threads": cpu_threads(),
            "timing": {"rounds": rounds, "repeats_per_round": repeats, "separate_processes": bool(hf),
                       "statistic": "median over every timed call of every round (min in min_s)"},
            "config": {"layers": c["layers"], "hidden": c["hidden"], "vocab": c["vocab"], "prompt_len": prompt_len,
                       "max_new_tokens": max_new_tokens, "slot_size": slot_size,
                       "serial_num_blocks": serial_num_blocks, "steps": steps, "repeats": repeats, "rounds": rounds,
                       "hf_attention": list(attention) if hf else [],
                       "hf_threads": list(hf_threads(threads)) if hf else [],
                       "ckpt": ckpt, "dtype": c["dtype"]},
            "notes": notes, "rows": rows}


def _baseline(jax_row: dict, hf_rows: list[dict], jax_s: float, notes: list[str]) -> dict:
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


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench generate`: argparse namespace → (results, markdown)."""
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ("ar", "mdm", "slotted")]
    if bad or not modes:
        raise ValueError(f"--modes {args.modes!r}: expected a comma-separated subset of ar,mdm,slotted")
    check_positive(args, ("max_new_tokens", "prompt_len", "layers", "hidden", "heads", "kv_heads", "vocab",
                          "slot_size", "serial_num_blocks", "repeats", "rounds"))
    check_heads(args.hidden, args.heads, args.kv_heads)
    if args.ckpt is None and args.vocab < 16:
        raise ValueError(f"--vocab={args.vocab}: expected ≥ 16 (special tokens sit at the top of the vocabulary)")
    results = bench(args.batch_sizes, modes, args.max_new_tokens, args.prompt_len, args.layers, args.hidden,
                    args.heads, args.kv_heads, args.vocab, args.slot_size, args.serial_num_blocks, args.steps,
                    args.repeats, args.seed, args.ckpt, hf=not args.no_hf, uncached=not args.no_uncached,
                    verify=not args.no_verify, rounds=args.rounds, attention=hf_attention(args.hf_attention),
                    threads=args.hf_threads)
    return results, markdown(results)


if __name__ == "__main__":
    sys.exit(side_main(SIDES))

