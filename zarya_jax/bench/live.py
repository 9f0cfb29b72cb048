"""The live cache, measured: what a decoding pass costs against how much cache is allocated, and a whole decode.

A decode loop allocates its KV cache once, for the prompt and the whole budget (Uno's 1,024 + 8,192 rows), and
its passes run while only part of it is live. Side by side in one process, for each `cache_blocks` value
(`ModelConfig.cache_block`: 256 reads the live blocks only, `nn.attention.live`; 0 reads the whole allocation):

- **passes**: one cached pass of `window` rows at `batch` (`sampling.passes.pass_costs`) against `live` committed
  rows, in a cache allocated for its live rows and in one allocated `factors` times that; the ratio of each
  allocation's cost to the live-sized one is what a static cache costs beyond its live rows (1.0 = nothing).
- **decode**: a whole AR `generate()` of `new` tokens after a `prompt`-token prompt (batch `decode_batch`, the
  cache allocated for prompt + new), ms per token, beside what its live lengths require: the mean of the
  pass costs at the live context sampled at `decode_points` points of the decode, each in a cache allocated for
  just that context (a static cache that cost nothing beyond its live rows would decode at that rate).

The model is random and attention-heavy by default (narrow MLP, small vocabulary, every head a KV head), so the
cache, not the weights, sets a pass's cost. Timings are this machine's: report the ratios, measured in one run.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ..config import ModelConfig
from ..model import init_params
from ..sampling import GenerationConfig, generate
from ..sampling.passes import pass_costs
from ..timing import once_s
from .results import markdown_table


@dataclasses.dataclass(frozen=True)
class LiveSettings:
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    ffw: int = 256
    vocab: int = 512
    batch: int = 4
    window: int = 4
    live: int = 1024
    factors: tuple[int, ...] = (8,)
    cache_blocks: tuple[int, ...] = (256, 0)
    repeats: int = 3
    decode_batch: int = 1
    prompt: int = 1024
    new: int = 8192
    decode_points: int = 5
    decode_layers: int = 2
    seed: int = 0

    def model(self, cache_block: int, layers: int | None = None) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.ffw,
                           num_layers=layers or self.layers, num_heads=self.heads, num_kv_heads=self.kv_heads,
                           head_dim=self.head_dim, max_position_embeddings=self.prompt + self.new + 64,
                           cache_block=cache_block)


def _pass_ms(params, cfg, s: LiveSettings, batch: int, context: int, allocated: int) -> float:
    row = pass_costs(params, cfg, [batch], [s.window if batch == s.batch else 1], context, s.repeats,
                     allocated=allocated)[0]
    if row["ms_per_pass"] is None:  # still at the timer's floor after its remeasurements: never a cost
        raise RuntimeError(f"bench live: the pass at {allocated or context} allocated rows failed to measure "
                           f"({row['failed']}); rerun on a quieter machine or with --repeats raised")
    return row["ms_per_pass"]


def passes(s: LiveSettings) -> list[dict]:
    """Per cache_block: a pass against `live` rows in a live-sized cache and in each `factors`× allocation."""
    rows = []
    for block in s.cache_blocks:
        cfg = s.model(block)
        params = init_params(cfg, jax.random.PRNGKey(s.seed))
        base = _pass_ms(params, cfg, s, s.batch, s.live, 0)
        rows.append({"cache_block": block, "allocated": s.live + s.window, "ms_per_pass": base, "vs_live_sized": 1.0})
        for f in s.factors:
            ms = _pass_ms(params, cfg, s, s.batch, s.live, f * s.live)
            rows.append({"cache_block": block, "allocated": f * s.live, "ms_per_pass": ms, "vs_live_sized": ms / base})
    return rows


def decode(s: LiveSettings) -> list[dict]:
    """Per cache_block: a whole AR decode's ms per token beside the mean live-sized pass cost over its contexts."""
    rows = []
    rng = np.random.default_rng(s.seed)
    prompts = rng.integers(0, s.vocab, size=(s.decode_batch, s.prompt)).tolist()
    gc = GenerationConfig(mode="ar", max_new_tokens=s.new, stop_at_eos=False)
    contexts = np.linspace(s.prompt, s.prompt + s.new - 1, s.decode_points).astype(int).tolist()
    for block in s.cache_blocks:
        cfg = s.model(block, s.decode_layers)
        params = init_params(cfg, jax.random.PRNGKey(s.seed))
        call = lambda: generate(params, cfg, prompts, gc, jax.random.PRNGKey(0)).tokens  # noqa: E731
        call()  # compiles
        best = min(once_s(call) for _ in range(s.repeats))
        needed = float(np.mean([_pass_ms(params, cfg, s, s.decode_batch, c, 0) for c in contexts]))
        ms = 1e3 * best / s.new
        rows.append({"cache_block": block, "prompt": s.prompt, "new": s.new, "allocated": s.prompt + s.new,
                     "ms_per_token": ms, "live_pass_ms": needed, "vs_live_cost": ms / needed})
    return rows


def run(s: LiveSettings) -> tuple[dict, str]:
    results = {"settings": dataclasses.asdict(s), "passes": passes(s), "decode": decode(s) if s.new else []}
    return results, markdown(results)


def markdown(results: dict) -> str:
    s = results["settings"]
    md = [f"One cached pass of {s['window']} rows at batch {s['batch']} against {s['live']} live rows "
          "(ms per pass; vs_live_sized: its cost over the same pass in a cache allocated for its live rows):", "",
          markdown_table(results["passes"], ["cache_block", "allocated", "ms_per_pass", "vs_live_sized"])]
    if results["decode"]:
        md += ["", f"A whole AR decode of {s['new']} tokens after {s['prompt']} at batch {s['decode_batch']} "
               "(ms per token; live_pass_ms: the mean pass cost over its live contexts, each in a live-sized "
               "cache; vs_live_cost: their ratio):", "",
               markdown_table(results["decode"], ["cache_block", "allocated", "ms_per_token", "live_pass_ms",
                                                  "vs_live_cost"])]
    return "\n".join(md)
