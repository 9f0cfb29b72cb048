"""One RL step's rollouts: G completions per prompt through `generate()`, scored, laid out for the loss,
with the sampler's speed statistics.

Statistics (per RL step, host floats): `rollout_s` (wall time of the `generate` call, its compile
included on the first step), `tokens_per_forward` (generated tokens / forward passes, the prefill
included, summed over the rows: 1 for AR, whose prefill yields the first token), `completion_tokens` (mean per row), `active_rows` (mean fraction of the rows still
generating over the decode passes: 1 when every row runs to the end; a low value means most passes
were spent on a few long rows, where speculation pays), and for the spec arms `accepted_per_cycle`
(mean drafted tokens kept per drafting cycle, c0 included), `draft_cycles` and
`acceptance_pos{j}` (P(draft j accepted | examined)).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from ..config import PromptFormat
from ..sampling import GenerationConfig, generate
from . import grpo, rewards


@dataclasses.dataclass
class Rollouts:
    """rows: the N = P·G prompt ids (prompt-major); batch: `grpo.rollout_batch`'s arrays plus
    'advantages' [N]; rewards [N]; texts: the completions; stats: see the module doc."""

    rows: list[list[int]]
    batch: dict
    rewards: np.ndarray
    texts: list[str]
    stats: dict


def active_fraction(passes_per_row: np.ndarray) -> float:
    """Mean over the decode passes of the fraction of rows still running, from each row's pass count
    (a row runs in the first passes of the batched loop, until it finishes)."""
    passes = np.asarray(passes_per_row, np.int64)
    total = int(passes.max()) if passes.size else 0
    return float(passes.sum() / (total * passes.size)) if total else 0.0


def width_bucket(n: int, bucket: int = 16) -> int:
    return -(-n // bucket) * bucket


def sample(params, config, records: list[dict], prompts: list[list[int]], gcfg: GenerationConfig, key,
           tokenizer, reward_fns, num_generations: int, *, fmt=PromptFormat(), lora_params=None,
           lora=None) -> Rollouts:
    """Rollouts of `prompts` (ids of `records`, read with the prompt format `fmt`), `num_generations`
    each, scored by `reward_fns`; stats also hold `answer_accuracy` (the exact-match rate)."""
    rows = [p for p in prompts for _ in range(num_generations)]
    row_records = [r for r in records for _ in range(num_generations)]
    t0 = time.perf_counter()
    out = generate(params, config, rows, gcfg, key, **({"lora_params": lora_params, "lora": lora}
                                                        if getattr(gcfg.mode, "drafter", None) == "lora" else {}))
    rollout_s = time.perf_counter() - t0
    texts = [tokenizer.decode([int(t) for t in toks[:n]]) for toks, n in zip(out.tokens, out.lengths)]
    r = rewards.score(row_records, texts, reward_fns)
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    # the sampler's padded prompt width: the loss compiles once per prompt bucket, not per longest prompt
    batch = grpo.rollout_batch(rows, out, pad, width=out.stats["prompt_width"] + gcfg.max_new_tokens)
    batch["advantages"] = grpo.group_advantages(r, num_generations)
    stats = rollout_stats(out, rollout_s)
    stats["answer_accuracy"] = float(np.mean([rewards.answer_reward(rec, t, fmt) for rec, t in zip(row_records, texts)]))
    return Rollouts(rows, batch, r, texts, stats)


def rollout_stats(out, rollout_s: float) -> dict:
    st = out.stats
    decode = np.asarray(out.num_forward_passes) - 1  # the prefill is not a decode pass
    stats = {"rollout_s": rollout_s, "completion_tokens": float(np.mean(out.lengths)),
             "tokens_per_forward": float(np.sum(out.lengths)) / max(int(np.sum(out.num_forward_passes)), 1),
             "active_rows": active_fraction(decode)}
    if "draft_cycles" in st:  # a speculative mode
        stats["draft_cycles"] = float(st["draft_cycles"])
    if stats.get("draft_cycles"):  # no drafting cycle (draft_when_active_below): nothing to rate
        stats["accepted_per_cycle"] = st["accepted_per_cycle"]
        for j, a in enumerate(st["acceptance_by_position"]):
            stats[f"acceptance_pos{j}"] = float(a)
    return stats


def greedy_exact_match(params, config, tokenizer, records: list[dict], prompts: list[list[int]], max_new_tokens: int,
                       fmt, eos_token_id: int | None = None) -> float:
    """The held-out exact match of greedy AR decoding (the policy's own answers)."""
    if not prompts:
        return float("nan")
    gc = GenerationConfig(mode="ar", max_new_tokens=max_new_tokens, temperature=0.0, eos_token_id=eos_token_id)
    out = generate(params, config, prompts, gc, jax.random.PRNGKey(0))
    texts = [tokenizer.decode([int(t) for t in toks[:n]]) for toks, n in zip(out.tokens, out.lengths)]
    return float(np.mean([rewards.answer_reward(r, t, fmt) for r, t in zip(records, texts)]))
