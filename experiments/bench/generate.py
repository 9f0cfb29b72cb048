"""Generation throughput: AR, mode A, mode B (tokens/s, tokens per forward), JAX vs HF, cached vs uncached.

    python -m experiments.bench generate [--batch-sizes 1,8,32 --max-new-tokens 32] [--ckpt CKPT --no-hf]

On a tiny random Qwen3 (built with transformers, weights copied into the JAX params) or on a
checkpoint (`--ckpt`; the HF comparison then needs `--no-hf`). Per batch size and mode: compile
time, median wall time of `--repeats` timed calls, generated tokens/s and mean tokens per forward
pass. The AR row also times transformers' PyTorch greedy `generate` on the same CPU and weights
(ratio measured in the same run, calls interleaved so machine load hits both alike) and the JAX AR
decode without a KV cache (one full causal pass per token). Rows never stop at EOS, so every mode
generates the same number of tokens.
"""
from __future__ import annotations

import argparse
import os
import statistics

import jax
import numpy as np

from zarya_jax import checkpoint
from zarya_jax.config import ModelConfig
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.testing import random_hf_model

from .harness import check_heads, check_positive, csv_ints, markdown_table, timed, timings


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
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt", default=None, help="benchmark this checkpoint instead of a random model")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' PyTorch generate")
    p.add_argument("--no-verify", action="store_true", help="load --ckpt without checking its checksums")
    p.add_argument("--no-uncached", action="store_true", help="skip the cache-free AR decode")


def _random_model(layers, hidden, heads, kv_heads, vocab, seed):
    """A random HF Qwen3 (O(1) logits: initializer_range 0.2), its config and params; specials on top."""
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_layers=layers,
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                         max_position_embeddings=4096, mask_token_id=vocab - 5, eos_token_id=vocab - 6,
                         pad_token_id=vocab - 8)
    hf, params = random_hf_model(config, seed, initializer_range=0.2)
    return hf, config, params


def bench(batch_sizes=(1, 8, 32), modes=("ar", "mdm", "slotted"), max_new_tokens=32, prompt_len=16, layers=2,
          hidden=128, heads=4, kv_heads=2, vocab=264, slot_size=4, serial_num_blocks=2, steps=0, repeats=3, seed=0,
          ckpt=None, hf=True, uncached=True, verify=True) -> dict:
    """Runs the benchmark; returns {'config': …, 'rows': [one dict per (batch, mode)]}."""
    hf_model = None
    if ckpt is not None:
        params, config = checkpoint.load(ckpt, verify=verify)
        if hf:
            raise ValueError("--ckpt: the HF comparison needs the random model; pass --no-hf with --ckpt")
    else:
        hf_model, config, params = _random_model(layers, hidden, heads, kv_heads, vocab, seed)
        if not hf:
            hf_model = None
    rng = np.random.default_rng(seed)
    knobs = {"ar": dict(mode="ar"), "mdm": dict(mode="mdm", steps=steps),
             "slotted": dict(mode="slotted", slot_size=slot_size, serial_num_blocks=serial_num_blocks)}
    rows = []
    for b in batch_sizes:
        prompts = rng.integers(0, min(config.vocab_size, 256), size=(b, prompt_len)).tolist()
        for mode in modes:
            gc = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, stop_at_eos=False,
                                  prompt_bucket=prompt_len, **knobs[mode])
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
                tokens = int(out.lengths.sum())
                wall = statistics.median(times)
                row = {"batch": b, "mode": mode if use_cache else "ar (no cache)", "new_tokens": tokens,
                       "compile_s": compile_s, "wall_s": wall, "tokens_per_s": tokens / wall,
                       "tokens_per_forward": float(out.tokens_per_forward.mean()),
                       "forward_passes_per_row": float(out.num_forward_passes.mean())}
                if mode == "ar" and use_cache and hf_model is not None:
                    row.update(_hf_compare(hf_model, prompts, max_new_tokens, out, call, repeats, config))
                rows.append(row)
        cached = {r["batch"]: r for r in rows if r["mode"] == "ar"}
        for r in rows:
            if r["mode"] == "ar (no cache)" and r["batch"] in cached:
                r["cached_speedup"] = r["wall_s"] / cached[r["batch"]]["wall_s"]
    return {"benchmark": "generate", "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
            "config": {"layers": config.num_layers, "hidden": config.hidden_size, "vocab": config.vocab_size,
                       "prompt_len": prompt_len, "max_new_tokens": max_new_tokens, "slot_size": slot_size,
                       "serial_num_blocks": serial_num_blocks, "steps": steps, "repeats": repeats,
                       "ckpt": ckpt, "dtype": config.dtype},
            "rows": rows}


def _hf_compare(hf_model, prompts, max_new_tokens, out, jax_call, repeats, config) -> dict:
    """Greedy transformers generate on the same prompts; JAX and HF calls interleaved."""
    import torch  # the PyTorch baseline (torch is a test/benchmark dependency only)

    ids = torch.tensor(prompts)

    def hf_call():
        with torch.inference_mode():
            return hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                     min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=config.pad_token_id,
                                     suppress_tokens=[config.mask_token_id])

    ref = hf_call()[:, len(prompts[0]):].numpy()
    hf_times, jax_times = [], []
    for r in range(repeats):
        hf_times += timings(hf_call, 1)
        jax_times += timings(lambda r=r: jax_call(jax.random.PRNGKey(100 + r)), 1)
    hf_s, jax_s = statistics.median(hf_times), statistics.median(jax_times)
    return {"hf_wall_s": hf_s, "hf_tokens_per_s": ref.size / hf_s, "speedup_vs_hf": hf_s / jax_s,
            "greedy_match_hf": float(np.mean(ref == np.asarray(out.tokens)))}


def markdown(results: dict) -> str:
    c = results["config"]
    head = (f"Generation, {c['layers']} layers, hidden {c['hidden']}, vocab {c['vocab']}, prompt {c['prompt_len']}, "
            f"{c['max_new_tokens']} new tokens, greedy, backend {results['backend']}, median of {c['repeats']}\n\n")
    cols = ["batch", "mode", "new_tokens", "compile_s", "wall_s", "tokens_per_s", "tokens_per_forward",
            "hf_tokens_per_s", "speedup_vs_hf", "greedy_match_hf", "cached_speedup"]
    return head + markdown_table(results["rows"], cols)


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench generate`: argparse namespace → (results, markdown)."""
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = [m for m in modes if m not in ("ar", "mdm", "slotted")]
    if bad or not modes:
        raise ValueError(f"--modes {args.modes!r}: expected a comma-separated subset of ar,mdm,slotted")
    check_positive(args, ("max_new_tokens", "prompt_len", "layers", "hidden", "heads", "kv_heads", "vocab",
                          "slot_size", "serial_num_blocks", "repeats"))
    check_heads(args.hidden, args.heads, args.kv_heads)
    if args.ckpt is None and args.vocab < 16:
        raise ValueError(f"--vocab={args.vocab}: expected ≥ 16 (special tokens sit at the top of the vocabulary)")
    results = bench(args.batch_sizes, modes, args.max_new_tokens, args.prompt_len, args.layers, args.hidden,
                    args.heads, args.kv_heads, args.vocab, args.slot_size, args.serial_num_blocks, args.steps,
                    args.repeats, args.seed, args.ckpt, hf=not args.no_hf, uncached=not args.no_uncached,
                    verify=not args.no_verify)
    return results, markdown(results)

