"""Evaluation: every decoding mode on a set of prompt/answer records (the library half of
`python -m experiments.evaluate`, also used by the quickstart and sweeps).

Modes: `ar` (autoregressive baseline), `mdm` (mode A, docs/algorithms.md §5), `slotted` (mode B, docs/algorithms.md §6),
`spec-self` (lossless Zarya self-speculation, docs/algorithms.md §7), `spec-lora` (Uno's LoRA drafter), `spec-model`
(an independent draft model, classic speculative sampling, docs/algorithms.md §7.6), `spec-self-fused` and
`spec-lora-fused` (the same drafters in one forward pass per cycle, docs/algorithms.md §7.5). Per mode:
exact-match accuracy (`answers`), wall-clock generated tokens/s (compile time excluded and reported
apart), tokens per forward pass and the speed-up over `ar`. Mode names and each mode's knobs come from
the registry (`sampling.modes.MODES`): `MODE.FIELD` sets a field of that mode's dataclass or a shared
sampling field, `*.FIELD` a shared field for every mode (`parse_knobs`, `ModeKnobs`), typed by
`zarya_jax.overrides`.
Records are rendered by `zarya_jax.data.render` with the checkpoint's recorded `PromptFormat`
(`zarya_jax.inference`), so the prompt ids are those the model was trained on.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import sys
import time

import jax
import numpy as np
from tqdm import tqdm

from .. import overrides as ov
from ..config import ConfigError, PromptFormat, missing_mask_token
from ..data import render
from ..data.records import where
from ..files import atomic_directory, atomic_write
from ..inference import Inference
from ..sampling import GenerationConfig, generate
from ..sampling import modes as modes_lib
from ..sampling.prompts import bucket_length
from ..sampling.spec import pool_acceptance
from . import answers
from .results import Decoded, ModeResult, Prediction

MODES = tuple(modes_lib.MODES)  # the eight decoding modes, by their one name (`sampling.modes`)
MODE_LABELS = {name: cls.label for name, cls in modes_lib.MODES.items()}  # how reports name each mode
SPEC_MODES = tuple(n for n, cls in modes_lib.MODES.items() if cls.lossless)  # held to AR's outputs
# the modes that draft with Uno's LoRA adapter, and with a separate draft model
ADAPTER_MODES = tuple(n for n, cls in modes_lib.MODES.items() if getattr(cls, "drafter", None) == "lora")
DRAFT_MODEL_MODES = tuple(n for n, cls in modes_lib.MODES.items() if getattr(cls, "drafter", None) == "model")

# The sampling fields every mode shares (`GenerationConfig` less its mode): `*.FIELD` knobs.
SHARED_TYPES = {k: t for k, t in ov.field_types(GenerationConfig).items() if k != "mode"}


def knob_types(mode: str) -> dict[str, type]:
    """{field: type} of what `MODE.FIELD` may set: the mode dataclass's own fields, then the shared ones."""
    return {**ov.field_types(modes_lib.MODES[mode]), **SHARED_TYPES}


@functools.cache
def _sparse_knobs(mode: str):
    """A typed partial set of one mode's knobs (every field optional, None = not set)."""
    cls = modes_lib.MODES[mode]
    full = dataclasses.make_dataclass(f"{cls.__name__}Knobs", list(knob_types(mode).items()), frozen=True,
                                      namespace={"unknown_field": staticmethod(
                                          lambda key, field: ConfigError(no_knob(key, mode, field)))})
    return ov.sparse(full)


def _knobs_as_dict(self) -> dict[str, dict]:
    """{mode: {field: value}} of the knobs set, the form `evaluate` takes."""
    return {ov.external_name(f): ov.set_fields(getattr(self, f.name)) for f in dataclasses.fields(self)}


# Decoding knobs per mode (`eval.knobs.<mode>.<field>`), one section per registered mode, made from the
# registry: a field added to a mode's dataclass is a knob here with nothing else to change.
ModeKnobs = dataclasses.make_dataclass(
    "ModeKnobs", [(name.replace("-", "_"), _sparse_knobs(name),
                   dataclasses.field(default=_sparse_knobs(name)(), metadata={"key": name})) for name in MODES],
    frozen=True, namespace={"as_dict": _knobs_as_dict, "__module__": __name__, "unknown_field": staticmethod(
        lambda key, name: ConfigError(f"{key}: unknown mode {name.partition('.')[0]!r}; expected one of {MODES}")),
                            "__doc__": "Decoding knobs per mode (`eval.knobs.<mode>.<field>`): each mode's fields "
                                       "and the shared sampling fields, typed, None = not set."})


def mode_knobs(knobs: dict[str, dict]) -> "ModeKnobs":
    """A `ModeKnobs` from {mode: {field: value}} (typed; an unknown mode or field is a ConfigError)."""
    return ov.build(ModeKnobs, knobs)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """An evaluation: modes, decoding budget and batch, records (`limit`: first N, 0 = all), answer
    extraction, seed, per-mode knobs, `ckpt` (a checkpoint to evaluate instead of training one),
    `batch1_examples` (also time the first N records at batch 1; 0 = off) and `repeats` (the modes take
    turns this many times at each batch size timed, the best of each counting: `race`). Everything, each
    mode's knobs included, is checked when the config is built, so a bad value fails before any training."""

    modes: tuple[str, ...] = ("ar", "mdm", "slotted", "spec-self")
    max_new_tokens: int = 64
    batch_size: int = 1
    limit: int = 0
    answer: str = "final"
    answer_regex: str = ""
    seed: int = 0
    ckpt: str = ""
    knobs: ModeKnobs = ModeKnobs()
    batch1_examples: int = 0
    repeats: int = 2

    def __post_init__(self):
        parse_modes(",".join(self.modes))
        if self.batch1_examples < 0:
            raise ConfigError(f"eval.batch1_examples={self.batch1_examples}: expected ≥ 0")
        if self.repeats < 1:
            raise ConfigError(f"eval.repeats={self.repeats}: expected ≥ 1")
        if self.answer not in answers.METHODS:
            raise ConfigError(f"eval.answer={self.answer!r}: expected one of {answers.METHODS}")
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"eval.{name}={getattr(self, name)}: expected ≥ 1")
        if self.limit < 0:
            raise ConfigError(f"eval.limit={self.limit}: expected ≥ 0 (0 = every record)")
        check_answer(self.answer, self.answer_regex or None, "eval.answer_regex")
        for mode, knobs in self.knobs.as_dict().items():  # every mode's knobs are its own; the modes run, in range
            try:
                gen = generation_config(mode, self.max_new_tokens, {mode: knobs})
                if mode in self.modes:
                    gen.validate()
            except ValueError as e:
                raise ConfigError(f"eval.knobs.{mode}: {e}") from None


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ConfigError(f"--modes {text!r}: unknown mode(s) {bad}; expected a comma-separated subset of {MODES}")
    repeated = sorted({m for m in modes if modes.count(m) > 1})
    if repeated:  # a mode twice would be evaluated twice and compared with itself
        raise ConfigError(f"--modes {text!r}: mode(s) {repeated} given more than once; expected each mode once")
    return modes


def check_answer(method: str, pattern: str | None, flag: str = "--answer-regex") -> None:
    """`--answer regex` needs a pattern that compiles (ConfigError naming it otherwise)."""
    if method == "regex" and not pattern:
        raise ConfigError(f"answer extraction 'regex' needs a pattern ({flag})")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"{flag} {pattern!r} is not a valid regular expression: {e}") from None


def parse_knobs(items: list[str]) -> dict[str, dict]:
    """`["slotted.slot_size=4", "*.temperature=0"]` -> {"slotted": {"slot_size": 4}, "*": {"temperature": 0}}:
    `MODE.FIELD=VALUE` items (a field of that mode's dataclass or a shared sampling field) and
    `*.FIELD=VALUE` (or `FIELD=VALUE`: a shared field, for every mode), each value YAML, typed against the
    field."""
    knobs: dict[str, dict] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--knob {item!r}: expected MODE.FIELD=VALUE or '*.FIELD=VALUE', "
                              "e.g. slotted.slot_size=4")
        key, value = ov.parse(item, "--knob")
        mode, _, field = key.rpartition(".")
        mode = mode or "*"
        if mode != "*" and mode not in MODES:
            raise ConfigError(f"--knob {item!r}: unknown mode {mode!r}; expected one of {MODES} or '*'")
        types = _scope_types(mode, field)
        knobs.setdefault(mode, {})[field] = ov.coerce(key, value, types[field])
    return knobs


def _scope_types(scope: str, field: str) -> dict[str, type]:
    """The knob types of `scope` (a mode, or "*": the shared fields); a ConfigError naming what `scope`
    has when `field` is not among them (never silently ignored)."""
    types = SHARED_TYPES if scope == "*" else knob_types(scope)
    if field in types:
        return types
    if scope == "*":
        owners = [m for m in MODES if field in ov.field_types(modes_lib.MODES[m])]
        where = f"; it is a field of mode(s) {owners}: give it as MODE.{field}" if owners else close_names(field, types)
        raise ConfigError(f"knob *.{field}: not a shared sampling field{where}. Shared fields: {list(SHARED_TYPES)}")
    raise ConfigError(no_knob(f"knob {scope}.{field}", scope, field))


def no_knob(where: str, mode: str, field: str) -> str:
    """`no_field` for a knob (`--knob`, `eval.knobs.<mode>.<field>`): a mode's own fields and the shared ones."""
    return no_field(where, mode, field, knob_types(mode)) + f", and the shared ones {list(SHARED_TYPES)}"


def no_field(where: str, mode: str, field: str, candidates=None) -> str:
    """'WHERE: mode M has no field F (did you mean …?); its fields are […]' — for a knob or a grid key;
    the closest of `candidates` (default: the mode's fields) are suggested."""
    own = ov.field_types(modes_lib.MODES[mode])
    hint = close_names(field, own if candidates is None else candidates)
    return f"{where}: mode {mode!r} has no field {field!r}{hint}; its fields are {list(own)}"


def close_names(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=3)
    return f" (did you mean {close}?)" if close else ""


def generation_config(mode: str, max_new_tokens: int, knobs: dict[str, dict] | None = None) -> GenerationConfig:
    """The `GenerationConfig` of mode `mode` (greedy, `max_new_tokens`) with `knobs` ({mode or "*":
    {field: value}}) applied: the shared "*" ones, then the mode's own; a field the mode does not have
    is a ConfigError naming its fields."""
    values = {}
    for scope in ("*", mode):
        for k, v in (knobs or {}).get(scope, {}).items():
            values[k] = ov.coerce(f"{scope}.{k}", v, _scope_types(scope, k)[k])
    base = GenerationConfig(mode=mode, max_new_tokens=max_new_tokens, temperature=0.0)
    try:
        return base.with_knobs(**values)
    except ValueError as e:
        raise ConfigError(f"mode {mode}: {e}") from None


def check_mode_knobs(modes, knobs: dict[str, dict]) -> None:
    """Every knob against the modes it is for, before any model is loaded: knobs only for known modes
    (or "*"), and each of `modes`' knobs a field of that mode."""
    unknown = [m for m in knobs if m != "*" and m not in MODES]
    if unknown:
        raise ConfigError(f"knobs for unknown mode(s) {unknown}; expected modes among {MODES} or '*'")
    for mode in modes:
        generation_config(mode, 1, knobs)


def check_mask_token(gens: dict[str, GenerationConfig], model_config, ckpt: str) -> None:
    """A ConfigError naming the checkpoint and the remedy when a mode of `gens` ({mode: config}) needs a
    mask token that the checkpoint's model has none of; checked from its config, before any work."""
    if model_config.mask_token_id is not None:
        return
    modes = [m for m, gen in gens.items() if gen.mode.needs_mask_token]
    if modes:
        what = f"mode {modes[0]} needs" if len(modes) == 1 else f"modes {', '.join(modes)} need"
        raise ConfigError(missing_mask_token(what, f"the checkpoint {ckpt!r}", otherwise="evaluate it with --modes ar"))


def _pad_batch(items: list, size: int) -> list:
    """Fills a short last batch with copies of its first item so every call has one shape."""
    return items + [items[0]] * (size - len(items))


def _stat(out, name, rows):
    value = getattr(out, name, None)
    if value is None:
        value = (getattr(out, "stats", None) or {}).get(name)
    if value is None:
        return None
    value = np.asarray(value)
    return value[:rows] if value.ndim else np.full((rows,), float(value))


class Progress:
    """What a user waiting on one mode sees on stderr: `compiling mode slotted… 12.3 s` while its first
    batches compile (one program per prompt bucket), then a bar `eval MODE` that advances after every
    batch of the timed pass."""

    def __init__(self, name: str, total: int, stream=None):
        self.name, self.total, self.stream, self.bar = name, total, stream or sys.stderr, None

    def compiling(self, programs: int) -> None:
        what = f" ({programs} prompt lengths)" if programs > 1 else ""
        print(f"compiling mode {self.name}{what}…", end="", file=self.stream, flush=True)

    def compiled(self, seconds: float) -> None:
        print(f" {seconds:.1f} s", file=self.stream, flush=True)

    def __call__(self, done: int) -> None:
        if self.bar is None:  # drawn at 0 when made
            self.bar = tqdm(total=self.total, desc=f"eval {self.name}", unit="ex", leave=False, file=self.stream)
        if done:
            self.bar.n = done
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def evaluate_mode(params, config, tokenizer, prompts: list[list[int]], gen_config, key, batch_size: int,
                  lora_params=None, lora=None, progress: Progress | None = None, warmup: bool = True,
                  draft: dict | None = None) -> Decoded:
    """Generates for all prompts in batches of `batch_size`; returns their `Decoded` texts, token ids,
    lengths, passes and timings. `draft`: `generate`'s draft-model keyword arguments (`Inference.draft_kwargs`).
    `progress`: told when the compile starts and ends, and after every timed batch.

    With `warmup` one batch per prompt bucket is run once untimed (compilation); the timed pass covers
    every batch.
    Pass warmup=False when the program is already compiled (same compile key, e.g. a threshold sweep).
    """
    def call(batch, k):
        kwargs = {} if lora_params is None else {"lora_params": lora_params, "lora": lora}
        kwargs.update(draft or {})
        out = generate(params, config, batch, gen_config, k, **kwargs)
        jax.block_until_ready(out.tokens)
        return out

    starts = list(range(0, len(prompts), batch_size))
    # Keys are made before the clock starts: the first fold_in compiles, which is not decoding time.
    keys = [jax.random.fold_in(key, i) for i in starts]
    t0 = time.perf_counter()
    if warmup:  # one untimed call per prompt bucket the batches fall into (one compiled program each)
        widths = {}
        for i in starts:
            chunk = prompts[i:i + batch_size]
            widths.setdefault(bucket_length(max(len(p) for p in chunk), gen_config.prompt_bucket), chunk)
        if progress:
            progress.compiling(len(widths))
        for chunk in widths.values():
            call(_pad_batch(chunk, batch_size), keys[0])
    compile_s = time.perf_counter() - t0
    if warmup and progress:
        progress.compiled(compile_s)
    if progress:
        progress(0)
    texts, ids, lengths, passes, diffusion, spec_counts = [], [], [], [], [], []
    t0 = time.perf_counter()
    for i, k in zip(starts, keys):
        chunk = prompts[i:i + batch_size]
        out = call(_pad_batch(chunk, batch_size), k)
        tokens = np.asarray(out.tokens)
        n = len(chunk)
        lens = np.asarray(out.lengths)[:n]
        for row in range(n):
            ids.append(tokens[row, : int(lens[row])].tolist())
            texts.append(tokenizer.decode(ids[-1]))
        lengths += [int(x) for x in lens]
        fp = _stat(out, "num_forward_passes", n)
        passes += [int(x) for x in fp] if fp is not None else [0] * n
        order, n_d = _stat(out, "order", n), _stat(out, "num_diffusion", n)
        if order is not None and n_d is not None:  # mode A: which offsets its diffusion phase decoded
            diffusion += [sorted(int(o) for o in order[r, :int(n_d[r])]) for r in range(n)]
        if "counts" in out.stats:  # speculative modes: acceptance counts, pooled below
            spec_counts.append(out.stats["counts"])
        if progress:
            progress(min(i + batch_size, len(prompts)))
    wall = time.perf_counter() - t0
    total_tokens = int(sum(lengths))
    # A batched pass advances every row, so a batch's passes count once: tokens per forward is the
    # number of generated tokens per row divided by that row's passes, averaged over rows.
    tpf = [l / p for l, p in zip(lengths, passes) if p > 0]
    return Decoded(texts=texts, ids=ids, lengths=lengths, forward_passes=passes, wall_s=wall, compile_s=compile_s,
                   tokens=total_tokens, tokens_per_s=total_tokens / wall if wall > 0 else float("nan"),
                   tokens_per_forward=float(np.mean(tpf)) if tpf else float("nan"),
                   diffusion_offsets=diffusion or None,
                   acceptance=pool_acceptance(spec_counts) if spec_counts else None)


def decode(model: Inference, mode: str, prompts: list[list[int]], gen: GenerationConfig, key, batch: int, *,
           label: str = "", warmup: bool = True) -> Decoded:
    """`evaluate_mode` of `mode` with the model's drafter (adapter or draft model) where the mode reads one;
    a progress bar named `label` unless it is empty."""
    bar = Progress(label, len(prompts)) if label else None
    out = evaluate_mode(model.params, model.config, model.tokenizer, prompts, gen, key, batch,
                        model.adapter if mode in ADAPTER_MODES else None, model.lora, progress=bar, warmup=warmup,
                        draft=model.draft_kwargs if mode == "spec-model" else None)
    if bar:
        bar.close()
    return out


def race(model: Inference, prompts: list[list[int]], gens: list[tuple[str, GenerationConfig]], batch: int,
         repeats: int, key, label: str | None = None, warmup: bool = True) -> list[Decoded]:
    """Each (mode, config)'s fastest decode of `prompts` at `batch` over `repeats` rounds, the configurations
    taking turns within a round, so that all of them see the same machine whatever else it runs (one
    timed decode each, one after the other, favours whichever ran when the machine was quietest). Every
    round decodes the same outputs (the same key). With `warmup` the first round compiles each program
    in an untimed decode first; its `compile_s` is the one kept. label: a progress bar per decode, named
    after the mode and the label ("at batch 1" -> "ar at batch 1"); None: no bars."""
    best: list[Decoded | None] = [None] * len(gens)
    for r in range(repeats):
        for i, (mode, gen) in enumerate(gens):
            out = decode(model, mode, prompts, gen, key, batch,
                         label="" if label is None else f"{mode} {label}".strip(), warmup=warmup and r == 0)
            if best[i] is None:
                best[i] = out
            elif out.tokens_per_s > best[i].tokens_per_s:
                best[i] = dataclasses.replace(out, compile_s=best[i].compile_s)
    return best


def render_records(records: list[dict], tokenizer, prompt_format: PromptFormat, method: str,
                   pattern: str | None) -> tuple[list[tuple[str, str]], list[list[int]], list[str | None]]:
    """(prompt, answer) texts, prompt ids and the reference answers of `records`, rendered with
    `prompt_format` (`zarya_jax.data.render`); a record that does not render, or an empty prompt, is an
    error naming the record (`records.where`: FILE:LINE for records read from a file)."""
    pairs = []
    for i, record in enumerate(records):
        try:
            pairs.append(render.render(record, tokenizer, prompt_format))
        except ValueError as e:
            raise ValueError(f"{where(record, i)}: {e}") from None
    prompts = [tokenizer.encode(p) for p, _ in pairs]
    empty = [where(records[i], i) for i, p in enumerate(prompts) if not p]
    if empty:
        more = f" (and {len(empty) - 1} more, e.g. {empty[1]})" if len(empty) > 1 else ""
        raise ValueError(f"{empty[0]}: the prompt renders to no tokens{more}; expected a non-empty prompt")
    return pairs, prompts, [answers.reference(a, method, pattern) for _, a in pairs]


def evaluate(model: Inference, records: list[dict], ev: EvalConfig, *, knobs: dict | None = None,
             progress: bool = True, warmup: bool = True) -> tuple[list[ModeResult], list[Prediction]]:
    """Runs every mode of `ev` on the records (the first `ev.limit`; 0: all), rendered with the checkpoint's
    prompt format (`model.prompt_format`, `zarya_jax.data.render`). Returns one `ModeResult` per mode and
    one `Prediction` per mode and example.
    knobs: {mode or "*": {field: value}} (default `ev.knobs`), e.g. those a frontier chose; each result
    carries the knobs it decoded with.
    The modes take turns `ev.repeats` times and each one's best tokens/s counts (`race`).
    warmup=False skips the untimed compile run (for programs already compiled). `ev.batch1_examples` > 0
    also decodes the first N records one at a time and reports `tokens_per_s_batch1` (and the speed-up
    over AR at batch 1): on an accelerator decoding is memory-bound and a pass costs about the same
    whatever its rows, on a CPU it costs in proportion to them, so both batch sizes are worth reading.
    `ev` was validated when it was built; what is checked here needs the model and the records."""
    method, pattern = ev.answer, ev.answer_regex or None
    knobs = ev.knobs.as_dict() if knobs is None else knobs
    records = records[:ev.limit] if ev.limit else records
    lora_modes = [m for m in ev.modes if m in ADAPTER_MODES]
    if lora_modes and model.adapter is None:
        raise ValueError(f"mode {lora_modes[0]!r} needs a LoRA drafter adapter (--lora DIR)")
    if "spec-model" in ev.modes and model.draft_params is None:
        raise ValueError("mode 'spec-model' needs a draft model (--draft-ckpt DIR)")
    pairs, prompts, golds = render_records(records, model.tokenizer, model.prompt_format, method, pattern)
    # Every mode against the model and the prompts before any decoding (a missing mask token must not
    # surface only after the AR mode has run).
    check_mode_knobs(ev.modes, knobs)
    gens = {mode: generation_config(mode, ev.max_new_tokens, knobs) for mode in ev.modes}
    check_mask_token(gens, model.config, model.ckpt)
    for mode, gen in gens.items():
        try:
            gen.validate(model.config, prompts)
        except ValueError as e:
            raise ValueError(f"mode {mode}: {e}") from None
    summary, predictions = [], []
    key = jax.random.PRNGKey(ev.seed)
    decoded = race(model, prompts, [(m, gens[m]) for m in ev.modes], ev.batch_size, ev.repeats, key,
                   "" if progress else None, warmup)
    for mode, res in zip(ev.modes, decoded):
        gen = gens[mode]
        rows = []
        for i, text in enumerate(res.texts):
            pred = answers.extract(text, method, pattern)
            rows.append(Prediction(
                index=i, mode=mode, prompt=pairs[i][0], reference=pairs[i][1], prompt_ids=prompts[i], output=text,
                output_ids=res.ids[i], prediction=pred, gold=golds[i], correct=pred is not None and pred == golds[i],
                num_tokens=res.lengths[i], forward_passes=res.forward_passes[i],
                diffusion_offsets=None if res.diffusion_offsets is None else res.diffusion_offsets[i]))
        predictions += rows
        summary.append(ModeResult(
            mode=mode, label=MODE_LABELS[mode], examples=len(prompts),
            accuracy=sum(r.correct for r in rows) / len(prompts), tokens_per_forward=res.tokens_per_forward,
            tokens_per_s=res.tokens_per_s, generated_tokens=res.tokens, wall_s=res.wall_s, compile_s=res.compile_s,
            batch_size=ev.batch_size, generation_config=gen.as_dict(),
            knobs={**knobs.get("*", {}), **knobs.get(mode, {})},
            **(res.acceptance or {})))  # drafts kept per cycle (c0 included), and by draft position
    if ev.batch1_examples:
        # The modes take turns at batch 1 (`race`). Every prompt is padded to the widest one's bucket, as a
        # batch would be: one compiled program per mode instead of one per prompt bucket.
        timed = prompts[:ev.batch1_examples]
        width = max(len(p) for p in timed)
        ones = race(model, timed, [(m, gens[m].replace(prompt_bucket=bucket_length(width, gens[m].prompt_bucket)))
                                   for m in ev.modes], 1, ev.repeats, key, "at batch 1" if progress else None)
        summary = [dataclasses.replace(r, tokens_per_s_batch1=one.tokens_per_s, batch1_examples=len(one.lengths),
                                       compile_s_batch1=one.compile_s) for r, one in zip(summary, ones)]
    return _with_speedups(summary), predictions


def _with_speedups(summary: list[ModeResult]) -> list[ModeResult]:
    """Each result with its tokens/s over AR's, at the evaluation batch and at batch 1 where measured (None
    without AR)."""
    ar = next((r for r in summary if r.mode == "ar"), None)

    def over_ar(value, base):
        return value / base if value is not None and base else None

    return [dataclasses.replace(
        r, speedup_vs_ar=over_ar(r.tokens_per_s, ar and ar.tokens_per_s),
        speedup_vs_ar_batch1=over_ar(r.tokens_per_s_batch1, ar and ar.tokens_per_s_batch1)) for r in summary]


def summary_markdown(summary: list[ModeResult]) -> str:
    """One row per mode: accuracy, tokens per forward, tokens/s and speed-up at the evaluation batch
    (and at batch 1 when measured), the seconds its first batches took to compile (at batch 1 too:
    `compile_s`, `compile_s_batch1`), and the knobs when a result carries a `point` description."""
    b1 = any(r.tokens_per_s_batch1 is not None for r in summary)
    compiled = any(r.compile_s is not None for r in summary)
    knobs = any(r.point for r in summary)
    drafts = any(r.accepted_per_cycle is not None for r in summary)
    batch = summary[0].batch_size if summary else "B"
    head = ["mode"] + (["knobs"] if knobs else []) + ["exact match", "tokens / forward"]
    head += ["drafts accepted / cycle"] if drafts else []
    head += [f"tokens / s (batch {batch})", "speed-up vs AR"]
    head += ["tokens / s (batch 1)", "speed-up vs AR (batch 1)"] if b1 else []
    head += ["compile s"] if compiled else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def num(v, fmt, unit=""):
        return f"{v:{fmt}}{unit}" if v is not None else "–"

    for r in summary:
        cells = [r.label] + ([r.point or "–"] if knobs else [])
        cells += [f"{100 * r.accuracy:.1f}%", f"{r.tokens_per_forward:.2f}"]
        if drafts:  # drafts kept per cycle (Ψ-Spec's LoRA and self drafters count c0, drawn from the AR row)
            cells += [num(r.accepted_per_cycle, ".2f")]
        cells += [f"{r.tokens_per_s:.1f}", num(r.speedup_vs_ar, ".2f", "×")]
        if b1:
            cells += [num(r.tokens_per_s_batch1, ".1f"), num(r.speedup_vs_ar_batch1, ".2f", "×")]
        if compiled:
            times = [t for t in (r.compile_s, r.compile_s_batch1) if t is not None]
            cells += [" + ".join(f"{t:.1f}" for t in times) or "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: str, summary: list[ModeResult], predictions: list[Prediction], extra: dict | None = None,
                  markdown: str | None = None) -> None:
    """predictions.jsonl, summary.md (`markdown`, default the summary table) and, last, summary.json (the
    results' `to_json`, then `extra`) in `out_dir`, so that a summary.json is there only when the files
    beside it are its own. A new `out_dir` appears whole (written under a temporary name, renamed when
    complete); in an existing one the old summary.json is removed first and each file is replaced
    atomically. An error or a signal leaves no half-written file."""
    # Serialized first: a value that is not JSON fails before anything is touched.
    texts = {"predictions.jsonl": "".join(json.dumps(p.to_json()) + "\n" for p in predictions),
             "summary.md": summary_markdown(summary) if markdown is None else markdown,
             "summary.json": json.dumps({"modes": [r.to_json() for r in summary], **(extra or {})},
                                        indent=2)}  # last: the marker

    def write(directory: str) -> None:
        for name, text in texts.items():
            atomic_write(os.path.join(directory, name), text)

    if not os.path.lexists(out_dir):
        with atomic_directory(out_dir) as tmp:
            write(tmp)
        return
    if os.path.lexists(os.path.join(out_dir, "summary.json")):
        os.remove(os.path.join(out_dir, "summary.json"))
    write(out_dir)

