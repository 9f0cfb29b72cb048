"""Knobs chosen for time: per batch size, the fastest lossless decoding configuration, plain AR included
(docs/decoding.md#knobs-chosen-for-time).

Tokens per forward pass is what a checkpoint's drafts buy; what a pass costs is the device's, and it
depends on the pass's rows and the batch. So, after the validation frontier:
1. the pass-cost curve c(b, W) on the device in use (`sampling.passes.pass_costs`: ms of a cached pass of
   W rows at batch b), at the windows the candidates' cycles run (`sampling.passes.cycle_windows`); a
   point at the timer's floor or out of order is remeasured, and one that still fails is never used
   (`passes.failed_points`: a candidate needing it is not priced at that batch);
2. each lossless frontier point's predicted speed-up over AR at batch b: its tokens per forward over AR's,
   times AR's pass cost over its mean pass cost: (tpf / tpf_AR) · c(b, 1) / mean over its passes of c(b, W);
3. per batch size, AR, the `confirm` points predicted fastest and each lossless mode's point predicted
   fastest (`to_time`) are timed on the validation prompts at that batch, `repeats` rounds in which they
   take turns; a candidate's speed-up in a round is its tokens/s over AR's in that round. A candidate
   replaces AR only if it beats AR by at least `margin` in every round (`beats_ar`): on a busy machine
   one lucky round is within the noise, a win in each of several side-by-side rounds is not. Among AR
   and those, the greatest median speed-up is chosen. The prediction ignores what a cycle does besides its passes
   (sampling, acceptance, the cache commit, the loop: the AR loop's step costs more than its one-row
   pass, a fused cycle more than its window) and the prefill, and what it leaves out differs by mode; the
   measurement does not, and timing every mode's best keeps one mode's optimism from crowding out the
   others. AR is always a candidate, so the choice is never slower than AR on validation, and a
   configuration that won by less than the margin in some round is not chosen.

`SpeedChoice` holds the curve, every candidate's prediction (and measurement where timed) and the choice
per batch size. Saved as `eval/speed.json`, it is what `experiments.generate --mode auto --speed FILE`
decodes with: `SpeedChoice.mode_for(batch)` is the choice at the calibrated batch size nearest to the
batch. `time_on_test` times each choice against AR on the test prompts, side by side, for the report.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys

import jax
import numpy as np

from ..config import ConfigError
from ..files import atomic_write_json
from ..inference import Inference
from ..sampling import GenerationConfig
from ..sampling import modes as modes_lib
from ..sampling import passes
from ..sampling.mode import Mode
from . import evaluate as evaluate_lib
from .evaluate import EvalConfig, generation_config, render_records
from .results import FrontierPoint, from_json, to_json


@dataclasses.dataclass(frozen=True)
class SpeedConfig:
    """The `speed` section: which batch sizes get a configuration chosen for time, and how it is measured.

    enabled: choose per batch size after the frontier (needs the frontier: the candidates are its
      lossless points).
    batches: the batch sizes to calibrate at.
    confirm: the lossless points predicted fastest that are timed at each batch size, besides AR and each
      lossless mode's point predicted fastest.
    examples: validation prompts timed per candidate (rounded down to a multiple of the batch, at least
      one batch).
    repeats: timed rounds, the candidates taking turns in each (their best tokens/s is reported; the
      speed-up over AR is read per round); an untimed decode before the first compiles.
    margin: the fraction by which a candidate must beat AR in every round to replace it (0.05: at least
      1.05× AR's tokens/s in each; 0: any win in every round).
    """

    enabled: bool = True
    batches: tuple[int, ...] = (1, 8, 25)
    confirm: int = 3
    examples: int = 50
    repeats: int = 3
    margin: float = 0.05

    def __post_init__(self):
        object.__setattr__(self, "batches", tuple(self.batches))
        if not self.batches or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batches):
            raise ConfigError(f"speed.batches={list(self.batches)}: expected one or more batch sizes ≥ 1")
        for name in ("confirm", "examples", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"speed.{name}={value!r}: expected an integer ≥ 1")
        m = self.margin
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m < 1.0:
            raise ConfigError(f"speed.margin={m!r}: expected a fraction of AR's tokens/s in [0, 1)")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One lossless configuration at one batch size: its validation tokens per forward, its predicted
    speed-up over AR from the pass-cost curve and, when timed, its best tokens/s and AR's on validation
    and its speed-up over AR in each timed round (`round_speedups`: tokens/s over AR's in that round)."""

    mode: str
    knobs: dict
    point: str
    tokens_per_forward: float
    predicted_speedup: float
    tokens_per_s: float | None = None
    ar_tokens_per_s: float | None = None
    round_speedups: list[float] | None = None

    @property
    def speedup(self) -> float | None:
        """The measured speed-up over AR: the median of the rounds' (a table saved without them: best
        tokens/s over AR's best); None when not timed."""
        if self.round_speedups:
            return float(np.median(self.round_speedups))
        return None if self.tokens_per_s is None or not self.ar_tokens_per_s else self.tokens_per_s / self.ar_tokens_per_s

    def beats_ar(self, margin: float) -> bool:
        """Timed, and at least (1 + margin)× AR's tokens/s in every round (module doc, step 3)."""
        return bool(self.round_speedups) and min(self.round_speedups) >= 1.0 + margin

    def mode_object(self) -> Mode:
        return modes_lib.mode(self.mode, **self.knobs)

    def to_json(self) -> dict:
        return to_json(self)


@dataclasses.dataclass(frozen=True)
class BatchChoice:
    """The configuration chosen at one batch size (`chosen`), every candidate with its prediction, and on
    test (`time_on_test`) the chosen configuration's tokens/s next to AR's, timed side by side."""

    batch: int
    chosen: Candidate
    candidates: list[Candidate]
    test_tokens_per_s: float | None = None
    test_ar_tokens_per_s: float | None = None

    @property
    def test_speedup(self) -> float | None:
        if self.test_tokens_per_s is None or not self.test_ar_tokens_per_s:
            return None
        return self.test_tokens_per_s / self.test_ar_tokens_per_s

    def to_json(self) -> dict:
        return {**to_json(self), "candidates": [c.to_json() for c in self.candidates],
                "test_speedup": self.test_speedup}

    @classmethod
    def from_json(cls, data: dict) -> "BatchChoice":
        data = {k: v for k, v in data.items() if k != "test_speedup"}
        data["chosen"] = from_json(Candidate, data.get("chosen"))
        data["candidates"] = [from_json(Candidate, c) for c in data.get("candidates", [])]
        return from_json(cls, data)


@dataclasses.dataclass(frozen=True)
class SpeedChoice:
    """Per calibrated batch size the fastest lossless configuration, with the device it was measured on,
    the pass-cost curve the prediction used ({batch, window, ms_per_pass, …} rows) and the margin a
    candidate had to beat AR by in every round."""

    device: str
    costs: list[dict]
    choices: list[BatchChoice]
    max_new_tokens: int
    margin: float = 0.0

    def mode_for(self, batch: int) -> tuple[Mode, BatchChoice]:
        """The mode (with its knobs) chosen at the calibrated batch size nearest to `batch` (in ratio; a tie
        goes to the smaller), and that choice."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch={batch!r}: expected an integer ≥ 1")
        near = min(self.choices, key=lambda c: (abs(math.log(c.batch / batch)), c.batch))
        return near.chosen.mode_object(), near

    def config_for(self, batch: int, **shared) -> GenerationConfig:
        """The `GenerationConfig` that decodes a batch of `batch` prompts with `mode_for(batch)`'s mode, at
        the calibrated `max_new_tokens` unless `shared` (the shared sampling fields) says otherwise."""
        return GenerationConfig(mode=self.mode_for(batch)[0], **{"max_new_tokens": self.max_new_tokens, **shared})

    def to_json(self) -> dict:
        return {"device": self.device, "costs": self.costs, "choices": [c.to_json() for c in self.choices],
                "max_new_tokens": self.max_new_tokens, "margin": self.margin}

    @classmethod
    def from_json(cls, data: dict) -> "SpeedChoice":
        if not isinstance(data, dict):
            raise ValueError(f"SpeedChoice.from_json: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        data["choices"] = [BatchChoice.from_json(c) for c in data.get("choices", [])]
        return from_json(cls, data)

    def save(self, path: str) -> None:
        atomic_write_json(path, self.to_json())

    @classmethod
    def load(cls, path: str) -> "SpeedChoice":
        """A saved choice (`save`, an experiment's `eval/speed.json`); ValueError naming the file otherwise."""
        try:
            with open(path) as f:
                return cls.from_json(json.load(f))
        except OSError as e:
            raise ValueError(f"speed table {path!r}: cannot read it ({e.strerror})") from None
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"speed table {path!r}: not a saved SpeedChoice ({e})") from None


def device_name() -> str:
    """The device the curve was measured on, e.g. "cpu", "gpu (NVIDIA H200)"."""
    d = jax.devices()[0]
    return d.platform if d.device_kind.lower() == d.platform else f"{d.platform} ({d.device_kind})"


def costed(points: list[FrontierPoint], max_new_tokens: int) -> list[tuple[FrontierPoint, tuple[int, ...]]]:
    """AR's and the lossless points whose cycle the pass-cost curve prices, with their cycles' windows."""
    out = []
    for p in points:
        if p.mode != "ar" and not modes_lib.MODES[p.mode].lossless:
            continue
        windows = passes.cycle_windows(generation_config(p.mode, max_new_tokens, {p.mode: p.knobs}))
        if windows is not None:
            out.append((p, windows))
    return out


def predicted_speedup(point: FrontierPoint, windows: tuple[int, ...], ar_tpf: float, cost: dict, batch: int) -> float:
    """(tpf / tpf_AR) · c(b, 1) / mean over the cycle's passes of c(b, W) (module doc, step 2)."""
    mean = sum(cost[batch, w] for w in windows) / len(windows)
    return point.tokens_per_forward / ar_tpf * cost[batch, 1] / mean


def predict(points: list[FrontierPoint], costs: list[dict], batch: int, max_new_tokens: int) -> list[Candidate]:
    """Every costed lossless point as a `Candidate` at `batch`, AR first, then by predicted speed-up. A failed
    curve point (`passes.failed_points`) is never used: a point whose cycle needs one at `batch`, or
    needs AR's (window 1, every prediction's numerator), is left out, so neither priced nor timed; AR
    is 1× by definition and always a candidate."""
    cost = {(r["batch"], r["window"]): r["ms_per_pass"] for r in costs}
    failed = passes.failed_points(costs)
    priced = costed(points, max_new_tokens)
    ar = next(p for p, _ in priced if p.mode == "ar")
    cands = [Candidate(p.mode, dict(p.knobs), p.point, p.tokens_per_forward,
                       1.0 if p is ar else predicted_speedup(p, w, ar.tokens_per_forward, cost, batch))
             for p, w in priced if p is ar or not any((batch, x) in failed for x in (1, *w))]
    return sorted(cands, key=lambda c: (c.mode != "ar", -c.predicted_speedup))


def to_time(cands: list[Candidate], confirm: int) -> list[Candidate]:
    """The candidates `predict` ranked that are timed: AR, the `confirm` predicted fastest, and each mode's
    predicted fastest point (module doc, step 3), in that order."""
    timed = cands[:1 + confirm]
    for c in cands[1 + confirm:]:
        if all(t.mode != c.mode for t in timed):
            timed.append(c)
    return timed


def curve(model: Inference, points: list[FrontierPoint], prompts: list[list[int]], sc: SpeedConfig,
          max_new_tokens: int, progress: bool = False) -> list[dict]:
    """The pass-cost curve at the calibrated batch sizes and the windows of the candidates' cycles, the cache
    holding a typical context (the mean prompt plus half the budget). progress: a line on stderr per
    (batch, window), each a compiled program."""
    windows = sorted({1} | {w for _, ws in costed(points, max_new_tokens) for w in ws})
    context = int(np.mean([len(p) for p in prompts])) + max_new_tokens // 2
    if progress:
        print(f"pass-cost curve on {device_name()}: {len(sc.batches)} batch sizes × {len(windows)} windows",
              file=sys.stderr, flush=True)

    def said(row):
        n = row["measurements"]
        if "failed" in row:  # found failed: remeasured next, or (no ms left) failed for good
            line = (f"failed after {n} measurement{'s' * (n > 1)}, "
                    f"{'remeasuring' if row['ms_per_pass'] is not None else 'not used'}: {row['failed']}")
        else:
            line = (f"batch {row['batch']}, window {row['window']}: {row['ms_per_pass']:.3f} ms per pass"
                    + (f" (measurement {n})" if n > 1 else ""))
        print(f"  {line}", file=sys.stderr, flush=True)

    return passes.pass_costs(model.params, model.config, sc.batches, windows, context, sc.repeats,
                             on_row=said if progress else None)


def race(model: Inference, prompts: list[list[int]], cands: list[Candidate], max_new_tokens: int, batch: int,
         repeats: int, seed: int = 0, label: str | None = None) -> list[list[float]]:
    """Each candidate's tokens/s in each of `repeats` rounds of decoding `prompts` at `batch`, the
    candidates taking turns within a round (`evaluate.race`, whose progress `label` it is: None, no
    progress); the first round compiles each program in an untimed decode first."""
    gens = [(c.mode, generation_config(c.mode, max_new_tokens, {c.mode: c.knobs})) for c in cands]
    rounds = [[d.tokens_per_s for d in evaluate_lib.race(model, prompts, gens, batch, 1, jax.random.PRNGKey(seed),
                                                         label, warmup=r == 0)] for r in range(repeats)]
    return [list(per) for per in zip(*rounds)]


def measured(cands: list[Candidate], tps: list[list[float]]) -> list[Candidate]:
    """`cands` (AR first) with their timings: `race`'s per-round tokens/s, AR's in the same rounds."""
    ar = tps[0]
    return [dataclasses.replace(c, tokens_per_s=max(t), ar_tokens_per_s=max(ar),
                                round_speedups=[x / a for x, a in zip(t, ar)]) for c, t in zip(cands, tps)]


def pick(timed: list[Candidate], margin: float) -> Candidate:
    """AR (`timed[0]`) unless a candidate beats it by `margin` in every round; then, of those, the
    greatest median speed-up (module doc, step 3)."""
    return max([timed[0]] + [c for c in timed[1:] if c.beats_ar(margin)], key=lambda c: c.speedup)


def timed_prompts(prompts: list[list[int]], batch: int, examples: int) -> list[list[int]]:
    """The first `examples` prompts, a whole number of batches (at least one batch, reusing prompts if
    there are fewer)."""
    n = max(batch, examples // batch * batch)
    return [prompts[i % len(prompts)] for i in range(n)]


def choose(model: Inference, points: list[FrontierPoint], val_records: list[dict], ev: EvalConfig,
           sc: SpeedConfig, progress: bool = False) -> SpeedChoice:
    """Per batch size of `sc`, the fastest lossless configuration among AR and the frontier's lossless
    `points` (module doc): predicted from the pass-cost curve, AR and the `sc.confirm` best predicted
    timed on validation, the fastest measured chosen. progress: each program's compile and each timed
    decode on stderr (on an accelerator a program can take seconds to compile)."""
    prompts = render_records(val_records, model.tokenizer, model.prompt_format, ev.answer, ev.answer_regex or None)[1]
    if not any(p.mode == "ar" for p in points):
        raise ConfigError("speed: choosing for time compares against AR: add 'ar' to eval.modes")
    costs = curve(model, points, prompts, sc, ev.max_new_tokens, progress)
    choices = []
    for b in sc.batches:
        cands = predict(points, costs, b, ev.max_new_tokens)
        timed = to_time(cands, sc.confirm)
        tps = race(model, timed_prompts(prompts, b, sc.examples), timed, ev.max_new_tokens, b, sc.repeats, ev.seed,
                   f"at batch {b} (validation)" if progress else None)
        done = measured(timed, tps)
        ranked = done + [c for c in cands if c not in timed]
        choices.append(BatchChoice(batch=b, chosen=pick(done, sc.margin), candidates=ranked))
    return SpeedChoice(device=device_name(), costs=costs, choices=choices, max_new_tokens=ev.max_new_tokens,
                       margin=sc.margin)


def time_on_test(model: Inference, choice: SpeedChoice, records: list[dict], ev: EvalConfig,
                 sc: SpeedConfig, progress: bool = False) -> SpeedChoice:
    """Each batch size's chosen configuration and AR timed on the test prompts at that batch, taking turns
    (`race`), best of `sc.repeats` each (progress: as `choose`'s)."""
    prompts = render_records(records, model.tokenizer, model.prompt_format, ev.answer, ev.answer_regex or None)[1]
    out = []
    for c in choice.choices:
        ar = next(x for x in c.candidates if x.mode == "ar")
        pair = [ar] if c.chosen.mode == "ar" else [ar, c.chosen]
        tps = race(model, timed_prompts(prompts, c.batch, sc.examples), pair, ev.max_new_tokens, c.batch,
                   sc.repeats, ev.seed, f"at batch {c.batch} (test)" if progress else None)
        out.append(dataclasses.replace(c, test_tokens_per_s=max(tps[-1]), test_ar_tokens_per_s=max(tps[0])))
    return dataclasses.replace(choice, choices=out)


def markdown(choice: SpeedChoice) -> str:
    """The report's table: per batch size the chosen configuration, its predicted and validation speed-up
    and its tokens/s on test against AR's."""
    def x(v):
        return "–" if v is None else f"{v:.2f}×"

    lines = ["| batch | chosen | tokens / forward | predicted vs AR | validation vs AR | tokens / s on test "
             "(AR) | test vs AR |", "|---|---|---|---|---|---|---|"]
    for c in choice.choices:
        ch = c.chosen
        test = "–" if c.test_tokens_per_s is None else f"{c.test_tokens_per_s:.0f} ({c.test_ar_tokens_per_s:.0f})"
        lines.append(f"| {c.batch} | {ch.mode} {ch.point or ''} | {ch.tokens_per_forward:.2f} | "
                     f"{x(ch.predicted_speedup)} | {x(ch.speedup)} | {test} | {x(c.test_speedup)} |")
    return "\n".join(lines + failed_lines(choice.costs))


def failed_lines(costs: list[dict]) -> list[str]:
    """Lines naming each failed point of the curve and why (none if none failed): not used in any prediction."""
    failed = passes.failed_points(costs)
    if not failed:
        return []
    return ["", "Pass-cost curve points that failed (not used; a candidate needing one was not priced at that "
            "batch, and where window 1 failed only AR was):", ""] + [f"- {why}" for why in failed.values()]


def candidates_markdown(choice: SpeedChoice) -> str:
    """Every timed candidate per batch size: its tokens per forward, predicted and measured (validation:
    the median and each round's) speed-up over AR; the chosen one marked."""
    lines = ["| batch | candidate | tokens / forward | predicted vs AR | tokens / s on validation | validation vs AR "
             "| per round |", "|---|---|---|---|---|---|---|"]
    for c in choice.choices:
        for x in c.candidates:
            if x.tokens_per_s is None:
                continue
            mark = " **(chosen)**" if x == c.chosen else ""
            lines.append(f"| {c.batch} | {x.mode} {x.point or ''}{mark} | {x.tokens_per_forward:.2f} | "
                         f"{x.predicted_speedup:.2f}× | {x.tokens_per_s:.0f} | {x.speedup:.2f}× | "
                         f"{' '.join(f'{r:.2f}' for r in x.round_speedups or [])} |")
    return "\n".join(lines)
