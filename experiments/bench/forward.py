"""Forward pass: the jitted JAX forward vs Hugging Face transformers' PyTorch Qwen3, same weights.

    python -m experiments.bench forward [--batch-sizes 1,4 --seq 512 --layers 4 --hidden 512 --rounds 3]

The HF model is built from a seed (random weights) and its weights copied into the JAX params
(`zarya_jax.testing.random_hf_model`). Each side is timed in a process of its own while the other is
idle (`python -m experiments.bench.forward --side jax|hf`, launched by this command), alternating
JAX, HF, JAX, HF … for `--rounds`; each child warms up and times `--repeats` calls per batch size, and
the table reports the median over every timed call of every round (the minimum is in the JSON). The
JAX child also checks its logits against HF's (computed before any JAX forward of that batch). The HF
baseline is HF at its best: every attention implementation in `--hf-attention` (eager, sdpa) with
every PyTorch thread count in `--hf-threads` (default: as many as XLA uses, i.e. every core this process
may run on, and 1) is timed under `torch.inference_mode`, and the fastest is the baseline. The HF side
stays on the CPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from zarya_jax.config import ModelConfig
from zarya_jax.model import forward
from zarya_jax.testing import random_hf_model, random_torch_model

from .harness import (HF_ATTENTION, add_baseline_arguments, alternate, check_heads, check_positive, cpu_threads,
                      csv_ints, hf_attention, hf_setups, hf_threads, markdown_table, pooled, side_main, timed,
                      timings)



def _config(layers, hidden, heads, kv_heads, ffw, vocab) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffw, num_layers=layers,
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads, max_position_embeddings=4096)


def _batches(seed, vocab, seq, batch_sizes):
    """The same random token batches in every process: [(batch size, int64 array (b, seq))]."""
    rng = np.random.default_rng(seed)
    return [(b, rng.integers(0, vocab, size=(b, seq), dtype=np.int64)) for b in batch_sizes]


def jax_side(layers, hidden, heads, kv_heads, ffw, vocab, seq, batch_sizes, repeats, seed, check=True) -> dict:
    """Per batch size: compile seconds, `repeats` timed jitted forwards and (`check`) the largest logit
    difference to HF's eager forward on the same weights."""
    import torch  # the reference logits (torch is a test/benchmark dependency only)

    config = _config(layers, hidden, heads, kv_heads, ffw, vocab)
    model, params = random_hf_model(config, seed)
    fwd = jax.jit(lambda p, t: forward(p, config, t))
    rows = []
    for b, tokens in _batches(seed, vocab, seq, batch_sizes):
        ref = None
        if check:
            with torch.inference_mode():
                ref = model(torch.from_numpy(tokens)).logits.float().numpy()
        jt = jnp.asarray(tokens, jnp.int32)
        jax_fn = lambda: fwd(params, jt).block_until_ready()  # noqa: E731
        logits, compile_s = timed(jax_fn)
        row = {"batch": b, "compile_s": compile_s, "times": timings(jax_fn, repeats)}
        if ref is not None:
            row["max_abs_logit_diff"] = float(np.max(np.abs(np.asarray(logits) - ref)))
        rows.append(row)
    return {"backend": jax.default_backend(), "devices": str(jax.devices()), "rows": rows}


def hf_side(layers, hidden, heads, kv_heads, ffw, vocab, seq, batch_sizes, repeats, seed,
            attention=HF_ATTENTION, threads=(1,)) -> dict:
    """Per batch size and configuration (`hf_setups`: attention implementation × PyTorch threads):
    `repeats` timed HF forwards (after two warm-ups) under `torch.inference_mode`. No JAX array is made here."""
    import torch

    config = _config(layers, hidden, heads, kv_heads, ffw, vocab)
    models = {a: random_torch_model(config, seed, attn_implementation=a) for a in attention}
    rows = []
    with torch.inference_mode():
        for b, tokens in _batches(seed, vocab, seq, batch_sizes):
            tt = torch.from_numpy(tokens)
            times = {}
            for name, a, t in hf_setups(attention, threads):
                torch.set_num_threads(t)
                call = lambda: models[a](tt)  # noqa: E731,B023 (used in this iteration)
                call(), call()  # warm-up
                times[name] = timings(call, repeats)
            rows.append({"batch": b, "times": times})
    return {"torch": torch.__version__, "rows": rows}


SIDES = {"jax": jax_side, "hf": hf_side}


def bench_forward(layers=4, hidden=512, heads=8, kv_heads=4, ffw=None, vocab=32768, seq=512,
                  batch_sizes=(4,), repeats=5, seed=0, hf=True, rounds=3, attention=HF_ATTENTION,
                  threads=None) -> dict:
    """Median forward wall time of the jitted JAX model and (on CPU) HF's PyTorch model at its best, same
    weights, each timed in its own process (module doc). Without `hf`, the JAX side runs in this process."""
    ffw = ffw or 3 * hidden
    kwargs = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffw=ffw, vocab=vocab, seq=seq,
                  batch_sizes=list(batch_sizes), repeats=repeats, seed=seed)
    if hf:
        runs = alternate("experiments.bench.forward", {"jax": kwargs, "hf": {**kwargs, "attention": list(attention),
                                                                     "threads": list(hf_threads(threads))}},
                         rounds)
    else:
        runs = {"jax": [jax_side(**kwargs, check=False)], "hf": []}
        rounds = 1
    rows = []
    for i, b in enumerate(batch_sizes):
        jax_rows = [r["rows"][i] for r in runs["jax"]]
        j = pooled([r["times"] for r in jax_rows])
        row = {"batch": b, "seq": seq, "tokens": b * seq,
               "jax_compile_s": statistics.median(r["compile_s"] for r in jax_rows),
               "jax_s": j["median_s"], "jax_min_s": j["min_s"], "jax_tokens_per_s": b * seq / j["median_s"]}
        if runs["hf"]:
            per = {a: pooled([r["rows"][i]["times"][a] for r in runs["hf"]]) for a in runs["hf"][0]["rows"][i]["times"]}
            best = min(per, key=lambda a: per[a]["median_s"])
            row["hf_configs_s"] = {a: per[a]["median_s"] for a in per}
            row.update({"hf_baseline": f"forward, {best}", "hf_s": per[best]["median_s"],
                        "hf_min_s": per[best]["min_s"], "hf_tokens_per_s": b * seq / per[best]["median_s"],
                        "speedup_vs_hf": per[best]["median_s"] / j["median_s"],
                        "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in jax_rows)})
        rows.append(row)
    first = runs["jax"][0]
    return {"benchmark": "forward", "backend": first["backend"], "devices": first["devices"],
            "jax_threads": cpu_threads(), "cpu_count": os.cpu_count(),
            "timing": {"rounds": rounds, "repeats_per_round": repeats, "separate_processes": bool(hf),
                       "statistic": "median over every timed call of every round (min in *_min_s)"},
            "config": {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffw": ffw,
                       "vocab": vocab, "seq": seq, "dtype": "float32", "repeats": repeats, "rounds": rounds,
                       "hf_attention": list(attention) if hf else [],
                       "hf_threads": list(hf_threads(threads)) if hf else []},
            "rows": rows}


def markdown(results: dict) -> str:
    c, t = results["config"], results["timing"]
    head = (f"Forward, {c['layers']} layers, hidden {c['hidden']}, vocab {c['vocab']}, seq {c['seq']}, fp32, "
            f"backend {results['backend']}; {_method(t)}\n\n")
    cols = ["batch", "tokens", "jax_s", "hf_s", "hf_baseline", "jax_tokens_per_s", "hf_tokens_per_s",
            "speedup_vs_hf", "max_abs_logit_diff"]
    return head + markdown_table(results["rows"], cols)


def _method(timing: dict) -> str:
    if not timing["separate_processes"]:
        return f"JAX only, median of {timing['repeats_per_round']} calls"
    return (f"each side in a process of its own, the other idle, alternated over {timing['rounds']} rounds of "
            f"{timing['repeats_per_round']} calls (median of all); HF at its fastest attention and thread count")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffw", type=int, default=None, help="MLP width (default 3 × hidden)")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch-sizes", type=csv_ints, default=[4], help="comma-separated, e.g. 1,4,16,64")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per batch size in each child process")
    add_baseline_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")


def run(args) -> tuple[dict, str]:
    check_positive(args, ("layers", "hidden", "heads", "kv_heads", "vocab", "seq", "repeats", "rounds"))
    check_heads(args.hidden, args.heads, args.kv_heads)
    results = bench_forward(args.layers, args.hidden, args.heads, args.kv_heads, args.ffw, args.vocab, args.seq,
                            args.batch_sizes, args.repeats, args.seed, hf=not args.no_hf, rounds=args.rounds,
                            attention=hf_attention(args.hf_attention), threads=args.hf_threads)
    return results, markdown(results)


if __name__ == "__main__":
    sys.exit(side_main(SIDES))
