"""Forward pass: the jitted JAX forward vs Hugging Face transformers' PyTorch Qwen3, same weights.

The HF model is built from a seed (random weights) and its weights copied into the JAX params
(`zarya_jax.testing.random_hf_model`). Each side is timed in a process of its own while the other is
idle (`python -m zarya_jax.bench.forward --side jax|hf`, launched by `measure`), alternating
JAX, HF, JAX, HF … for `rounds`; each child warms up and times `repeats` calls per batch size, and
the table reports the median over every timed call of every round (the minimum is in the JSON). The
JAX child also checks its logits against HF's (computed before any JAX forward of that batch). The HF
baseline is HF at its best: every attention implementation in `hf_attention` (eager, sdpa) with
every PyTorch thread count in `hf_threads` (default: as many as XLA uses, i.e. every core this process
may run on, and 1) is timed under `torch.inference_mode`, and the fastest is the baseline. The HF side
stays on the CPU.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig
from ..model import forward
from ..testing import random_hf_model, random_torch_model
from .baseline import (HF_ATTENTION, SideRunner, alternate, cpu_threads, from_json, hf_setups, hf_threads, side_main,
                       to_json, worker)
from .results import markdown_table, pooled, timed, timings


@dataclasses.dataclass(frozen=True)
class ForwardSettings:
    """A random Qwen3 of this shape (MLP `ffw`, default 3 × hidden; fp32) at `seq` tokens per row, timed at each
    batch size; with `hf`, against HF in each (`hf_attention` × `hf_threads`, None: `baseline.hf_threads`)."""

    layers: int = 4
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 4
    ffw: int | None = None
    vocab: int = 32768
    seq: int = 512
    batch_sizes: tuple[int, ...] = (4,)
    repeats: int = 5
    seed: int = 0
    hf: bool = True
    rounds: int = 3
    hf_attention: tuple[str, ...] = HF_ATTENTION
    hf_threads: tuple[int, ...] | None = None

    @property
    def model(self) -> ModelConfig:
        """The random model (fp32)."""
        ffw = self.ffw or 3 * self.hidden
        return ModelConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=ffw, num_layers=self.layers,
                           num_heads=self.heads, num_kv_heads=self.kv_heads, head_dim=self.hidden // self.heads,
                           max_position_embeddings=4096)

    def batches(self):
        """The same random token batches in every process: [(batch size, int64 array (b, seq))]."""
        rng = np.random.default_rng(self.seed)
        return [(b, rng.integers(0, self.vocab, size=(b, self.seq), dtype=np.int64)) for b in self.batch_sizes]


def jax_side(settings: dict, check: bool = True) -> dict:
    """Per batch size of `settings` (`ForwardSettings` as JSON): compile seconds, `repeats` timed jitted
    forwards and (`check`) the largest logit difference to HF's eager forward on the same weights."""
    import torch  # the reference logits (torch is a test/benchmark dependency only)

    s = from_json(ForwardSettings, settings)
    config = s.model
    model, params = random_hf_model(config, s.seed)
    fwd = jax.jit(lambda p, t: forward(p, config, t))
    rows = []
    for b, tokens in s.batches():
        ref = None
        if check:
            with torch.inference_mode():
                ref = model(torch.from_numpy(tokens)).logits.float().numpy()
        jt = jnp.asarray(tokens, jnp.int32)
        jax_fn = lambda: fwd(params, jt).block_until_ready()  # noqa: E731
        logits, compile_s = timed(jax_fn)
        row = {"batch": b, "compile_s": compile_s, "times": timings(jax_fn, s.repeats)}
        if ref is not None:
            row["max_abs_logit_diff"] = float(np.max(np.abs(np.asarray(logits) - ref)))
        rows.append(row)
    return {"backend": jax.default_backend(), "devices": str(jax.devices()), "rows": rows}


def hf_side(settings: dict) -> dict:
    """Per batch size and configuration (`hf_setups`: attention implementation × PyTorch threads, `hf_threads`
    resolved): `repeats` timed HF forwards (after two warm-ups) under `torch.inference_mode`. No JAX array is
    made here."""
    import torch

    s = from_json(ForwardSettings, settings)
    models = {a: random_torch_model(s.model, s.seed, attn_implementation=a) for a in s.hf_attention}
    rows = []
    with torch.inference_mode():
        for b, tokens in s.batches():
            tt = torch.from_numpy(tokens)
            times = {}
            for name, a, t in hf_setups(s.hf_attention, s.hf_threads):
                torch.set_num_threads(t)
                call = lambda: models[a](tt)  # noqa: E731,B023 (used in this iteration)
                call(), call()  # warm-up
                times[name] = timings(call, s.repeats)
            rows.append({"batch": b, "times": times})
    return {"torch": torch.__version__, "rows": rows}


SIDES = {"jax": jax_side, "hf": hf_side}


def measure(s: ForwardSettings, run_side: SideRunner = worker) -> dict:
    """Median forward wall time of the jitted JAX model and (`s.hf`) HF's PyTorch model at its best, same
    weights, each side run by `run_side` (default: a process of its own, module doc). Without `hf`, the JAX
    side runs in this process."""
    s = dataclasses.replace(s, ffw=s.ffw or 3 * s.hidden, hf_threads=hf_threads(s.hf_threads))
    threads, rounds = list(s.hf_threads), s.rounds
    if s.hf:
        runs = alternate(__name__, {side: {"settings": to_json(s)} for side in SIDES}, rounds, run_side)
    else:
        runs = {"jax": [jax_side(to_json(s), check=False)], "hf": []}
        rounds = 1
    rows = []
    for i, b in enumerate(s.batch_sizes):
        jax_rows = [r["rows"][i] for r in runs["jax"]]
        j = pooled([r["times"] for r in jax_rows])
        row = {"batch": b, "seq": s.seq, "tokens": b * s.seq,
               "jax_compile_s": statistics.median(r["compile_s"] for r in jax_rows),
               "jax_s": j["median_s"], "jax_min_s": j["min_s"], "jax_tokens_per_s": b * s.seq / j["median_s"]}
        if runs["hf"]:
            per = {a: pooled([r["rows"][i]["times"][a] for r in runs["hf"]]) for a in runs["hf"][0]["rows"][i]["times"]}
            best = min(per, key=lambda a: per[a]["median_s"])
            row["hf_configs_s"] = {a: per[a]["median_s"] for a in per}
            row.update({"hf_baseline": f"forward, {best}", "hf_s": per[best]["median_s"],
                        "hf_min_s": per[best]["min_s"], "hf_tokens_per_s": b * s.seq / per[best]["median_s"],
                        "speedup_vs_hf": per[best]["median_s"] / j["median_s"],
                        "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in jax_rows)})
        rows.append(row)
    first = runs["jax"][0]
    return {"benchmark": "forward", "backend": first["backend"], "devices": first["devices"],
            "jax_threads": cpu_threads(), "cpu_count": os.cpu_count(),
            "timing": {"rounds": rounds, "repeats_per_round": s.repeats, "separate_processes": s.hf,
                       "statistic": "median over every timed call of every round (min in *_min_s)"},
            "config": {"layers": s.layers, "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads,
                       "ffw": s.ffw, "vocab": s.vocab, "seq": s.seq, "dtype": "float32",
                       "repeats": s.repeats, "rounds": rounds,
                       "hf_attention": list(s.hf_attention) if s.hf else [], "hf_threads": threads if s.hf else []},
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


def run(s: ForwardSettings, run_side: SideRunner = worker) -> tuple[dict, str]:
    results = measure(s, run_side)
    return results, markdown(results)


if __name__ == "__main__":
    sys.exit(side_main(SIDES))
