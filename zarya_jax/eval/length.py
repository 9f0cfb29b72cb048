"""Speed-up against answer length: AR and each lossless mode decoding the same prompts at a series of
budgets (`max_new_tokens` caps, e.g. 32, 64, 128, 256), timed side by side.

Why: a call's time is its prefill plus its decode steps. On the embedded task's terse answers (about 22
tokens) the prefill is a third of a batch-1 call, so a speculative mode that makes 1.4× fewer passes per
token shows at most 1.14× end to end; with answers of hundreds of tokens (`tasks`' `long` task) the
decode dominates and the per-cycle gain shows. This measures how the end-to-end speed-up grows with the
tokens decoded per call, on the device in use.

Per budget, AR and every mode take turns decoding the prompts (`evaluate.race`: the same machine load
for all of them, the best of `repeats` rounds each, the first round compiling each program untimed).
A row per (budget, mode): the mean tokens decoded per prompt (the answer length, at most the budget),
tokens per forward pass, tokens/s against AR's in the same race, the speed-up, and whether its outputs
equal AR's token for token (a lossless mode's must). A prompt whose answer ends before the budget
decodes fewer tokens: the mean length column says how long the answers that were timed really were.
"""
from __future__ import annotations

import dataclasses
import jax

from ..sampling import modes as modes_lib
from . import evaluate as evaluate_lib
from .evaluate import generation_config
from .results import to_json

CAPS = (32, 64, 128, 256)  # the default budgets (max_new_tokens)


@dataclasses.dataclass(frozen=True)
class LengthRow:
    """One mode at one budget: the mean tokens decoded per prompt, tokens per forward, its tokens/s and
    AR's in the same race, whether its outputs equal AR's (None for AR itself) and the knobs it decoded
    with."""

    max_new_tokens: int
    mode: str
    examples: int
    mean_tokens: float
    tokens_per_forward: float
    tokens_per_s: float
    ar_tokens_per_s: float
    ar_equal: bool | None
    knobs: dict

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.ar_tokens_per_s if self.ar_tokens_per_s else float("nan")

    def to_json(self) -> dict:
        return {**to_json(self), "speedup": self.speedup}


def check_modes(knobs: dict[str, dict]) -> None:
    """Every mode of `knobs` ({mode: its knobs}) lossless: their speed-up is comparable because their
    outputs are AR's (ValueError naming the others)."""
    lossy = [m for m in knobs if m not in modes_lib.MODES or not modes_lib.MODES[m].lossless]
    if lossy:
        lossless = [n for n, cls in modes_lib.MODES.items() if cls.lossless]
        raise ValueError(f"mode(s) {lossy}: not lossless; speed-up against answer length compares AR with the "
                         f"lossless modes {lossless}")


def length_table(model, prompts: list[list[int]], knobs: dict[str, dict], caps=CAPS, *, batch: int = 1,
                 repeats: int = 2, seed: int = 0, label: bool = False) -> list[LengthRow]:
    """Per budget of `caps`, AR and each mode of `knobs` ({mode: its knobs}, lossless) racing on `prompts`
    at `batch` (module doc); AR's row first at each budget. label: progress bars on stderr."""
    check_modes(knobs)
    if not prompts:
        raise ValueError("no prompts to decode")
    if not caps or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in caps):
        raise ValueError(f"budgets {list(caps)}: expected one or more max_new_tokens ≥ 1")
    n = max(batch, len(prompts) // batch * batch)  # whole batches (`speed.timed_prompts`' rule)
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    rows = []
    for cap in caps:
        gens = [("ar", generation_config("ar", cap, {}))]
        gens += [(m, generation_config(m, cap, {m: k})) for m, k in knobs.items()]
        outs = evaluate_lib.race(model, prompts, gens, batch, repeats, jax.random.PRNGKey(seed),
                                 f"at {cap} tokens" if label else None)
        ar = outs[0]
        for (mode, _), out in zip(gens, outs):
            rows.append(LengthRow(max_new_tokens=cap, mode=mode, examples=len(prompts),
                            mean_tokens=out.tokens / len(prompts), tokens_per_forward=out.tokens_per_forward,
                            tokens_per_s=out.tokens_per_s, ar_tokens_per_s=ar.tokens_per_s,
                            ar_equal=None if mode == "ar" else out.ids == ar.ids,
                            knobs={} if mode == "ar" else dict(knobs[mode])))
    return rows


def markdown(rows: list[LengthRow]) -> str:
    """The table: per budget and mode the answer length decoded, tokens per forward, tokens/s (AR's), the
    measured speed-up, AR-equal outputs."""
    lines = ["| max new tokens | mean tokens decoded | mode | tokens / forward | tokens / s (AR) | speed-up vs AR "
             "| outputs = AR |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        equal = "–" if r.ar_equal is None else ("yes" if r.ar_equal else "**no**")
        lines.append(f"| {r.max_new_tokens} | {r.mean_tokens:.0f} | {r.mode} | {r.tokens_per_forward:.2f} | "
                     f"{r.tokens_per_s:.0f} ({r.ar_tokens_per_s:.0f}) | {r.speedup:.2f}× | {equal} |")
    return "\n".join(lines)
