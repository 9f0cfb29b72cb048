"""Forward pass: the jitted JAX forward vs Hugging Face transformers' PyTorch Qwen3, same weights.

The HF model is built first (random weights), its weights are copied into the JAX params
(`zarya_jax.nn.hf_params`), the logits are compared, and both forwards are timed alternately (median
of `--repeats`), so the ratio comes from one run on one machine. The HF side stays on the CPU.
"""
from __future__ import annotations

import argparse
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from zarya_jax.config import ModelConfig
from zarya_jax.model import forward
from zarya_jax.testing import random_hf_model

from .harness import check_heads, check_positive, csv_ints, markdown_table, timed, timings


def bench_forward(layers=4, hidden=512, heads=8, kv_heads=4, ffw=None, vocab=32768, seq=512,
                  batch_sizes=(4,), repeats=5, seed=0, hf=True) -> dict:
    """Median forward wall time of the jitted JAX model and (on CPU) HF's PyTorch model, same weights."""
    import torch  # the PyTorch baseline (torch is a test/benchmark dependency only)

    ffw = ffw or 3 * hidden
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffw, num_layers=layers,
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                         max_position_embeddings=4096)
    model, params = random_hf_model(config, seed)
    fwd = jax.jit(lambda p, t: forward(p, config, t))
    rows = []
    rng = np.random.default_rng(seed)
    for b in batch_sizes:
        tokens = rng.integers(0, vocab, size=(b, seq), dtype=np.int64)
        jt = jnp.asarray(tokens, jnp.int32)
        jax_fn = lambda: fwd(params, jt).block_until_ready()  # noqa: E731
        logits, compile_s = timed(jax_fn)
        row = {"batch": b, "seq": seq, "tokens": b * seq, "jax_compile_s": compile_s}
        jax_times = timings(jax_fn, repeats)
        row["jax_s"] = statistics.median(jax_times)
        row["jax_tokens_per_s"] = b * seq / row["jax_s"]
        if hf:
            tt = torch.from_numpy(tokens)
            with torch.inference_mode():
                ref = model(tt).logits.float().numpy()
                row["max_abs_logit_diff"] = float(np.max(np.abs(np.asarray(logits) - ref)))
                hf_fn = lambda: model(tt)  # noqa: E731
                hf_fn()  # warm-up
                # Interleave so that machine load (shared cores) hits both sides alike.
                hf_times, jax_times2 = [], []
                for _ in range(repeats):
                    hf_times += timings(hf_fn, 1)
                    jax_times2 += timings(jax_fn, 1)
            row["hf_s"] = statistics.median(hf_times)
            row["jax_s"] = statistics.median(jax_times + jax_times2)
            row["jax_tokens_per_s"] = b * seq / row["jax_s"]
            row["hf_tokens_per_s"] = b * seq / row["hf_s"]
            row["speedup_vs_hf"] = row["hf_s"] / row["jax_s"]
        rows.append(row)
    return {"benchmark": "forward", "backend": jax.default_backend(), "devices": str(jax.devices()),
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "config": {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffw": ffw,
                       "vocab": vocab, "seq": seq, "dtype": "float32", "repeats": repeats},
            "rows": rows}


def markdown(results: dict) -> str:
    c = results["config"]
    head = (f"Forward, {c['layers']} layers, hidden {c['hidden']}, vocab {c['vocab']}, seq {c['seq']}, fp32, "
            f"backend {results['backend']}, median of {c['repeats']}\n\n")
    cols = ["batch", "tokens", "jax_s", "hf_s", "jax_tokens_per_s", "hf_tokens_per_s", "speedup_vs_hf",
            "max_abs_logit_diff"]
    return head + markdown_table(results["rows"], cols)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffw", type=int, default=None, help="MLP width (default 3 × hidden)")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch-sizes", type=csv_ints, default=[4], help="comma-separated, e.g. 1,4,16,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")


def run(args) -> tuple[dict, str]:
    check_positive(args, ("layers", "hidden", "heads", "kv_heads", "vocab", "seq", "repeats"))
    check_heads(args.hidden, args.heads, args.kv_heads)
    results = bench_forward(args.layers, args.hidden, args.heads, args.kv_heads, args.ffw, args.vocab, args.seq,
                            args.batch_sizes, args.repeats, args.seed, hf=not args.no_hf)
    return results, markdown(results)
