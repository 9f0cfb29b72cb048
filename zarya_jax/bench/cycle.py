"""Where a two-pass Ψ-Spec cycle's time goes (docs/algorithms.md §7.3): the compiled cycle of `spec-lora` and
`spec-self` against the AR sampler's pass, on a checkpoint (`ckpt`, with `adapter` for `spec-lora`) or on random
weights of a preset (with a random LoRA adapter for `spec-lora`).

Per mode and draft length F, at one batch size, greedy:
- **loop**: ms per cycle of the real compiled loop, `spec.spec_decode` (no stop at EOS, so every cycle runs)
  called with its traced `max_cycles` at 1 and at the whole budget: the slope, Δ time ÷ Δ cycles run, leaves
  out the prefill and the call's overhead. AR's ms per pass is the same slope of its own compiled loop
  (`sampling.ar.run`) at 1 and at `new_tokens` tokens (one program each; the 1-token one runs no decode pass).
- **components**: each step of a cycle on its own, with the arguments and shapes the cycle gives it, built from the
  functions the cycle calls: `draft` (`spec.draft_pass`, with the adapter's matmuls for spec-lora), `verify`
  (`model.apply` over the F + 1 rows and `model.lm_head`), `accept` (the drafts drawn, `target`'s distribution of
  both passes, `spec.accept_drafts`), `emit` (`decoding.emit`) and `commit` (`kv_cache.commit`, in place as in the
  loop); and AR's one-row pass. Each runs jitted in a compiled loop of its own, timed by the same slope
  (`looped_ms`): called alone, a jitted model pass pays tens of µs per call on a CPU for dispatch and argument
  handling, more than the small steps cost. Its share of the loop's ms per cycle, and the remainder (loop − the sum:
  the loop's own work, the counters and the glue between the steps); each step also carries its own loop's
  per-iteration cost (µs), so the remainder is a lower bound.
- **derived**: the cycle's cost in AR passes (loop ms per cycle ÷ AR ms per pass), i.e. the tokens a cycle
  must yield to break even with AR, next to the tokens per cycle the model yields (`spec.summarize`) on
  `data`'s prompts decoded to completion (EOS or budget), else the timed budget run's (random weights: 2, the
  minimum: c0 and the correction).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import model as model_lib
from ..config import LoraConfig, ModelConfig, missing_mask_token
from ..data import render
from ..data.records import read_jsonl
from ..inference import load_for_inference
from ..lora import init_lora
from ..nn import kv_cache
from ..sampling import GenerationConfig, ar, decoding, generate, spec
from ..sampling.modes import mode as mode_of
from ..sampling.prompts import pad_prompts
from ..timing import loop_slope_ms, slope_ms
from .results import markdown_table
from .train import model_config

MODES = ("spec-lora", "spec-self")
COMPONENTS = ("draft", "verify", "accept", "emit", "commit")
LOOP_CALLS = 32  # iterations of a component's own loop in its long run (the short run has one), at least
MAX_LOOP_CALLS = 1 << 18
LOOP_S = 0.005  # … raised ×8 until the long run takes this much longer than the short one (µs steps above noise)


@dataclasses.dataclass(frozen=True)
class CycleSettings:
    """`bench cycle`: `modes` × `draft_lengths` at `batch` rows, greedy, `new_tokens` per row, best of `repeats`.
    ckpt (+ adapter for spec-lora) or random weights of `preset` (+ a random rank-`lora_rank` adapter); data: a
    JSONL of prompt records (rendered in the checkpoint's prompt format) for the prompts and the measured
    tokens per cycle (at most `max_prompts` of them), else random prompts of `prompt_length` tokens."""

    ckpt: str | None = None
    adapter: str | None = None
    data: str | None = None
    preset: str = "tiny"
    modes: tuple[str, ...] = MODES
    draft_lengths: tuple[int, ...] = (4, 8, 16)
    batch: int = 1
    prompt_length: int = 32
    new_tokens: int = 128
    repeats: int = 10
    max_prompts: int = 32
    lora_rank: int = 16
    seed: int = 0
    smoke: bool = False

    def check(self) -> None:
        """Raises ValueError naming the first bad value (as its command-line flag)."""
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"--modes={','.join(self.modes)!r}: expected a comma-separated subset of "
                             f"{','.join(MODES)}")
        for name in ("batch", "prompt_length", "new_tokens", "repeats", "max_prompts", "lora_rank"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}={v!r}: expected a positive integer")
        if not self.draft_lengths or any(isinstance(f, bool) or not isinstance(f, int) or f < 1
                                         for f in self.draft_lengths):
            raise ValueError(f"--draft-lengths={self.draft_lengths!r}: expected positive integers")
        need = 2 * (max(self.draft_lengths) + 1)  # a cycle yields at most F + 1 tokens: two cycles fit the budget
        if self.new_tokens < need:
            raise ValueError(f"--new-tokens={self.new_tokens}: expected ≥ {need} (2 × (largest draft length + 1)), "
                             "so that the loop runs at least two cycles")
        for name in ("adapter", "data"):
            if getattr(self, name) and not self.ckpt:
                raise ValueError(f"--{name} {getattr(self, name)!r} needs --ckpt (random weights take neither)")
        if self.ckpt and "spec-lora" in self.modes and not self.adapter:
            raise ValueError("with --ckpt, mode spec-lora (the LoRA drafter) needs --adapter, or use --modes spec-self")
        for name in ("ckpt", "adapter", "data"):
            path = getattr(self, name)
            if path and not os.path.exists(path):
                raise FileNotFoundError(f"--{name} {path!r} does not exist")
        if not self.ckpt:
            model_config(self.preset)  # an unknown preset is a ConfigError naming it


SMOKE = {"preset": "tiny", "draft_lengths": (4,), "prompt_length": 8, "new_tokens": 40, "repeats": 3}


def smoke(s: CycleSettings) -> CycleSettings:
    """`s` on random tiny weights with the smoke run's sizes (`SMOKE`): seconds on a CPU."""
    return dataclasses.replace(s, ckpt=None, adapter=None, data=None, smoke=True, **SMOKE)


@dataclasses.dataclass(frozen=True)
class Subject:
    """What a run profiles: the weights (the adapter or None) and the prompt pool (token ids)."""

    params: Any
    config: ModelConfig
    lora_params: Any
    lora: LoraConfig | None
    prompts: list[list[int]]
    setup: dict

    @functools.cached_property
    def run_weights(self) -> tuple[Any, Any]:
        """(params, adapter) as `generate`'s program runs them by default on this platform
        (`decoding.layer_weights`), for the loops and steps this module compiles itself."""
        return jax.jit(decoding.layer_weights)((self.params, self.lora_params))


def load(s: CycleSettings) -> Subject:
    """The checkpoint (+ adapter, + data prompts) of `s`, or random weights of its preset and random prompts."""
    rng = np.random.default_rng(s.seed)
    if not s.ckpt:
        config = model_config(s.preset, dtype="float32", param_dtype="float32")
        params = jax.jit(model_lib.init_params, static_argnums=0)(config, jax.random.PRNGKey(s.seed))
        lora = LoraConfig(rank=s.lora_rank, alpha=16.0 * s.lora_rank)
        lora_params = init_lora(config, lora, jax.random.PRNGKey(s.seed + 1)) if "spec-lora" in s.modes else None
        prompts = [rng.integers(0, min(config.vocab_size, 256), s.prompt_length).tolist() for _ in range(s.batch)]
        return Subject(params, config, lora_params, lora if lora_params is not None else None, prompts,
                       {"model": f"random weights of preset {s.preset!r}",
                        "prompts": f"{s.batch} random prompts of {s.prompt_length} tokens"})
    loaded = load_for_inference(s.ckpt, adapter=s.adapter if "spec-lora" in s.modes else None)
    if "spec-self" in s.modes and loaded.config.mask_token_id is None:
        raise ValueError(missing_mask_token("mode 'spec-self' needs", otherwise="use --modes spec-lora"))
    setup = {"model": os.path.abspath(s.ckpt), "adapter": os.path.abspath(s.adapter) if s.adapter else None}
    if s.data:
        tok, fmt = loaded.tokenizer, loaded.prompt_format
        records = read_jsonl(s.data, fmt, need_answer=False)[: s.max_prompts]
        # as `Sampler.encode`: each prompt rendered in the checkpoint's prompt format
        prompts = [tok.encode(render.render(r, tok, fmt, need_answer=False)[0]) for r in records]
        setup["prompts"] = f"{len(prompts)} prompts of {os.path.abspath(s.data)}"
    else:
        prompts = [rng.integers(0, min(loaded.config.vocab_size, 256), s.prompt_length).tolist()
                   for _ in range(s.batch)]
        setup["prompts"] = f"{s.batch} random prompts of {s.prompt_length} tokens"
    return Subject(loaded.params, loaded.config, loaded.adapter, loaded.lora, prompts, setup)


# --------------------------------------------------------------------------- timing
def touch(x: jax.Array, flag: jax.Array) -> jax.Array:
    """`x` with its first element rewritten unless `flag` (never true when run): the same values, but a new
    value to the compiler, so a loop cannot hoist what is computed from it (one element: costs nothing)."""
    idx = (0,) * x.ndim
    return x.at[idx].set(jnp.where(flag, jnp.zeros((), x.dtype), x[idx]))


def retouch(args: tuple, out) -> tuple:
    """The next iteration's arguments: each touched by isnan(Σ out), which reads every output element, so the
    compiler drops none of the step's work."""
    flag = jnp.isnan(sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(out)))
    return jax.tree.map(lambda x: touch(x, flag), args)


@dataclasses.dataclass(frozen=True)
class Step:
    """One component of a cycle: fn(*weights, *args); feed(args, output) → the next iteration's args."""

    fn: Callable
    weights: tuple
    args: tuple
    feed: Callable = retouch


@functools.cache
def loop_program(fn: Callable, feed: Callable) -> Callable:
    """jit of `n` calls of fn(*weights, *args) in one while loop, each call's args fed by the previous one's
    (`Step.feed`), returning the args; cached per (fn, feed), so a step both modes share compiles once."""

    def loop(weights, args, n):
        def body(c):
            i, a = c
            return i + 1, feed(a, fn(*weights, *a))

        return jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.int32(0), args))[1]

    return jax.jit(loop)


def looped_ms(step: Step, repeats: int) -> float:
    """ms per call of `step` in a compiled loop of its own, timed as the cycle's loop is (`timing.loop_slope_ms`:
    the slope between 1 and 1 + n iterations, n from `LOOP_CALLS` up until the difference is `LOOP_S`): no
    dispatch or argument handling per call, which on a CPU costs a model pass called alone tens of µs; the
    weights are arguments, as in the cycle (not constants of the program)."""
    program = loop_program(step.fn, step.feed)
    return loop_slope_ms(lambda n: program(step.weights, step.args, jnp.int32(n)), repeats, LOOP_CALLS, LOOP_S,
                         MAX_LOOP_CALLS)


def padded(subject: Subject, b: int, gc: GenerationConfig) -> tuple[jax.Array, jax.Array]:
    """The first `b` prompts of the pool (cycled) as the decoders get them: right-padded tokens [b, P], lengths."""
    prompts = [subject.prompts[i % len(subject.prompts)] for i in range(b)]
    tokens, lengths = pad_prompts(prompts, gc.prompt_bucket, decoding.special_ids(subject.config, gc)[1])
    return jnp.asarray(tokens), jnp.asarray(lengths)


def adapter_of(subject: Subject, gc: GenerationConfig, run: bool = False) -> tuple[Any, LoraConfig | None]:
    """(lora_params, lora) as `generate` passes them (run: as its program runs them, `Subject.run_weights`):
    the adapter for the LoRA drafter only."""
    if gc.mode.drafter != "lora":
        return None, None
    return subject.run_weights[1] if run else subject.lora_params, subject.lora


# --------------------------------------------------------------------------- the loops
def spec_loop_ms(subject: Subject, gc: GenerationConfig, tokens, lengths, repeats: int) -> tuple[float, dict]:
    """(ms per cycle, `spec.summarize` of the whole budget's run) of `spec.spec_decode`: one program for both
    budgets (`max_cycles` is traced)."""
    lora_params, lora = adapter_of(subject, gc, run=True)

    def run(cycles: int):
        return spec.spec_decode(subject.run_weights[0], lora_params, tokens, lengths, jax.random.PRNGKey(0),
                                jnp.int32(cycles), config=subject.config, gcfg=gc, lora=lora)

    ms, _, raw = slope_ms(run, lambda out, _: int(np.max(jax.device_get(out["row_cycles"]))), 1,
                          gc.max_new_tokens, repeats)
    return ms, spec.summarize(jax.device_get(raw))


def ar_loop_ms(subject: Subject, gc: GenerationConfig, tokens, lengths, repeats: int) -> tuple[float, int]:
    """(ms per pass, passes of the whole budget) of AR's compiled loop (`ar.run`) at 1 and `max_new_tokens` tokens."""
    programs = {g: jax.jit(functools.partial(ar.run, config=subject.config, gcfg=gc.replace(max_new_tokens=g)))
                for g in (1, gc.max_new_tokens)}

    def run(g: int):
        return programs[g](subject.run_weights[0], tokens, lengths, jax.random.PRNGKey(0))

    return slope_ms(run, lambda out, _: int(out["loop_passes"]), 1, gc.max_new_tokens, repeats)[:2]


# --------------------------------------------------------------------------- the components
@functools.cache
def draft_step(cfg: ModelConfig, gc: GenerationConfig, lora: LoraConfig | None) -> Callable:
    """Step 1 of a cycle, the draft pass (`spec.draft_pass`: the mode's drafter); its K/V is unused by the
    cycle, so XLA drops it there and here alike."""

    def draft(params, lora_params, cache, seed, n, key):
        return spec.draft_pass(params, lora_params, cache, seed, n, key, config=cfg, draft_length=gc.mode.draft_length,
                               drafter=gc.mode.drafter, lora=lora)[0]

    return draft


@functools.cache
def later_steps(cfg: ModelConfig, gc: GenerationConfig) -> dict[str, Callable]:
    """The cycle's steps after the draft pass (`spec.spec_cycle`), built from the functions the cycle calls, and
    each jitted as "NAME_jit"; they read F and the sampling knobs, not the drafter (`steps`). "propose" (the
    drafts alone) gives the verify pass its input."""
    idx_o = jnp.arange(gc.mode.draft_length + 1, dtype=jnp.int32)[None, :]
    dist, draw = spec.target(cfg, gc)
    qdist, _ = spec.proposal(cfg, gc)
    eos = decoding.special_ids(cfg, gc)[0]

    def verify(params, cache, seed, drafts, n):
        hidden, kv = model_lib.apply(params, cfg, jnp.concatenate([seed[:, None], drafts], axis=1),
                                     (n - 1)[:, None] + idx_o, cache=cache, return_hidden=True)
        return model_lib.lm_head(params, cfg, hidden[:, 1:]), kv

    def propose(logits_d, presence, k_draw):  # greedy: the drafts are `draw`'s (`spec._drafts`)
        return draw(k_draw, logits_d, None if presence is None else presence[:, None, :])

    def accept(logits_d, logits_v, presence, k_draw, k_acc):
        pres_d = None if presence is None else presence[:, None, :]
        drafts = propose(logits_d, presence, k_draw)
        p = dist(logits_v, spec.presence_rows(presence, drafts))
        m, nxt = spec.accept_drafts(p, qdist(logits_d[:, 1:], pres_d), drafts[:, 1:], k_acc,
                                    greedy=gc.temperature == 0)
        return drafts, m, nxt

    def emit(out, logprobs, g, active, new, count, ar_logits):
        return decoding.emit(out, logprobs, g, active, new, count, ar_logits, eos, config=cfg, gcfg=gc)

    fns = {"verify": verify, "propose": propose, "accept": accept, "emit": emit}
    return {**fns, **{f"{name}_jit": jax.jit(fn) for name, fn in fns.items()}}


def steps(cfg: ModelConfig, gc: GenerationConfig, lora: LoraConfig | None) -> dict[str, Callable]:
    """The steps of one cycle, by name, with "NAME_jit" for a jitted one. The steps after the draft read only F
    and the sampling knobs: built for spec-self's mode at this F, one program serves both modes."""
    shared = gc.replace(mode=spec.SpecSelf(draft_length=gc.mode.draft_length))
    draft = draft_step(cfg, gc, lora)
    return {"draft": draft, "draft_jit": jitted(draft), **later_steps(cfg, shared)}


@functools.cache
def jitted(fn: Callable) -> Callable:
    return jax.jit(fn)


def commit(cache, window_kv, keep, length):
    """The loop's commit (`kv_cache.commit`); `length` is the cache's length before it, for `recommit`."""
    return kv_cache.commit(cache, window_kv, keep)


def recommit(args: tuple, out: dict) -> tuple:
    """The commit's next args: the committed cache, as in the loop, at its old length (the same rows every time)."""
    return ({**out, "length": args[3]}, *args[1:])


@functools.cache
def prefill_program(cfg: ModelConfig, cache_len: int, cache_dtype: str, fn: Callable) -> Callable:
    """jit of the prefill `fn` (`spec.prefill_but_last` or `decoding.prefill`) into a cache of `cache_len` rows."""
    return jax.jit(functools.partial(fn, config=cfg, cache_len=cache_len, cache_dtype=cache_dtype))


def cycle_steps(subject: Subject, gc: GenerationConfig, tokens, lengths) -> dict[str, Step]:
    """name (`COMPONENTS`) → that step of a cycle with its real arguments: the state a decode starts from
    (`spec.prefill_but_last`, `spec.loop_state`), each step run once here to give the next its input."""
    cfg, p, F = subject.config, subject.run_weights[0], gc.mode.draft_length
    lora_params, lora = adapter_of(subject, gc, run=True)
    fns = steps(cfg, gc, lora)
    prefill = prefill_program(cfg, spec.cache_rows(gc, tokens.shape[1]), gc.kv_cache_dtype, spec.prefill_but_last)
    cache, seed = prefill(p, prompts=tokens, lengths=lengths)
    s = spec.loop_state(tokens, lengths, cfg, gc, F)
    k_noise, k_draw, k_acc = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), 0), 3)
    logits_d = fns["draft_jit"](p, lora_params, cache, seed, lengths, k_noise)
    logits_v, kv_v = fns["verify_jit"](p, cache, seed, fns["propose_jit"](logits_d, s["presence"], k_draw), lengths)
    drafts, m, nxt = fns["accept_jit"](logits_d, logits_v, s["presence"], k_draw, k_acc)
    active, b, idx_o = ~s["done"], tokens.shape[0], jnp.arange(F + 1, dtype=jnp.int32)[None, :]
    new = jnp.where(idx_o <= m[:, None], jnp.concatenate([drafts, jnp.zeros((b, 1), jnp.int32)], axis=1), nxt[:, None])
    keep = (idx_o <= (m + 1)[:, None]) & active[:, None]
    return {"draft": Step(fns["draft"], (p, lora_params), (cache, seed, lengths, k_noise)),
            "verify": Step(fns["verify"], (p,), (cache, seed, drafts, lengths)),
            "accept": Step(fns["accept"], (), (logits_d, logits_v, s["presence"], k_draw, k_acc)),
            "emit": Step(fns["emit"], (), (s["out"], s["logprobs"], s["g"], active, new, m + 2,
                                            jnp.concatenate([logits_d[:, :1], logits_v], axis=1))),
            "commit": Step(commit, (), (cache, kv_v, keep, cache["length"]), feed=recommit)}


def ar_pass(params, cache, tok, positions, *, config: ModelConfig):
    """AR's decode pass: the forward of `ar.run`'s loop body, one row against its cache."""
    return model_lib.apply(params, config, tok[:, None], positions, cache=cache)


def ar_step(subject: Subject, gc: GenerationConfig, tokens, lengths) -> Step:
    """AR's decode pass against the cache its prefill leaves (`decoding.prefill`, `prompt + new_tokens` rows, as
    `ar.run` sizes it)."""
    cfg = subject.config
    prefill = prefill_program(cfg, tokens.shape[1] + gc.max_new_tokens, gc.kv_cache_dtype, decoding.prefill)
    logits, cache = prefill(subject.run_weights[0], tokens=tokens, lengths=lengths)
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return Step(functools.partial(ar_pass, config=cfg), (subject.run_weights[0],), (cache, tok, lengths[:, None]))


# --------------------------------------------------------------------------- the run
def measured_yield(subject: Subject, gc: GenerationConfig, b: int, key: jax.Array) -> float:
    """Tokens per cycle (`spec.summarize`, through `generate`'s stats) of the prompt pool decoded to completion
    (EOS or the budget) in batches of `b` (the pool cycled to fill the last one), pooled over the calls:
    Σ tokens ÷ Σ row-cycles."""
    lora_params, lora = adapter_of(subject, gc)
    pool, generated, row_cycles = subject.prompts, 0.0, 0.0
    for i in range(0, len(pool), b):
        batch = [pool[(i + j) % len(pool)] for j in range(b)]
        out = generate(subject.params, subject.config, batch, gc.replace(stop_at_eos=True), key,
                       lora_params=lora_params, lora=lora)
        tokens = float(out.lengths.sum())
        generated, row_cycles = generated + tokens, row_cycles + tokens / out.stats["tokens_per_cycle"]
    return generated / row_cycles


def profile(subject: Subject, gc: GenerationConfig, tokens, lengths, repeats: int, ar_ms: float) -> dict:
    """One mode at one F: the loop's ms per cycle, each component's ms and share of it, the remainder, the
    cycle's cost in AR passes (`ar_ms`: AR's loop ms per pass) and the budget run's tokens per cycle."""
    loop_ms, stats = spec_loop_ms(subject, gc, tokens, lengths, repeats)
    ms = {name: looped_ms(step, repeats) for name, step in cycle_steps(subject, gc, tokens, lengths).items()}
    total = sum(ms.values())
    row = {"mode": gc.mode.name, "draft_length": gc.mode.draft_length, "loop_ms_per_cycle": loop_ms,
           "cycles_timed": stats["cycles"]}
    for name in COMPONENTS:
        row.update({f"{name}_ms": ms[name], f"{name}_share": ms[name] / loop_ms})
    row.update(sum_ms=total, remainder_ms=loop_ms - total, remainder_share=(loop_ms - total) / loop_ms,
               cycle_in_ar_passes=loop_ms / ar_ms, budget_tokens_per_cycle=stats["tokens_per_cycle"])
    return row


def run(s: CycleSettings) -> tuple[dict, str]:
    """(results: setup, AR's pass and one row per (mode, F); Markdown). Module doc."""
    s.check()
    start = time.perf_counter()
    subject = load(s)
    base = GenerationConfig(max_new_tokens=s.new_tokens, stop_at_eos=False,
                            prompt_bucket=max(len(p) for p in subject.prompts))  # one width: one program
    tokens, lengths = padded(subject, s.batch, base)
    ar_ms, passes = ar_loop_ms(subject, base, tokens, lengths, s.repeats)
    ar_row = {"loop_ms_per_pass": ar_ms, "passes_timed": passes,
              "pass_ms": looped_ms(ar_step(subject, base, tokens, lengths), s.repeats)}
    rows = []
    for name in s.modes:
        for f in s.draft_lengths:
            gc = base.replace(mode=mode_of(name, draft_length=f))
            row = profile(subject, gc, tokens, lengths, s.repeats, ar_ms)
            # with data: what the model yields on real prompts; else the budget run's (random weights: ~the minimum)
            row["tokens_per_cycle"] = (measured_yield(subject, gc, s.batch, jax.random.PRNGKey(s.seed)) if s.data
                                       else row["budget_tokens_per_cycle"])
            row["speedup_estimate"] = row["tokens_per_cycle"] / row["cycle_in_ar_passes"]
            rows.append(row)
    device = jax.devices()[0]
    setup = {**subject.setup, "platform": device.platform, "device": device.device_kind, "batch": s.batch,
             "prompt_width": int(tokens.shape[1]), "new_tokens": s.new_tokens, "repeats": s.repeats,
             "yield_from": "data, to EOS" if s.data else "the timed budget run", "smoke": s.smoke,
             "seconds": time.perf_counter() - start}
    results = {"setup": setup, "ar": ar_row, "cycles": rows}
    return results, markdown(results)


def markdown(results: dict) -> str:
    """The setup, AR's pass and a table: each component's ms (share of the loop's cycle)."""
    st, a = results["setup"], results["ar"]
    head = [f"Model: {st['model']}" + (f"; adapter: {st['adapter']}" if st.get("adapter") else ""),
            f"Prompts: {st['prompts']} (padded width {st['prompt_width']}); batch {st['batch']}; {st['new_tokens']} "
            f"new tokens; greedy; {st['platform']} ({st['device']}); tokens/cycle from {st['yield_from']}", "",
            f"AR: {a['loop_ms_per_pass']:.3f} ms per pass of its loop; its one-row forward in a loop of its own: "
            f"{a['pass_ms']:.3f} ms", ""]

    def cell(r, name):
        return f"{r[f'{name}_ms']:.3f} ({r[f'{name}_share']:.0%})"

    rows = [{"mode": r["mode"], "F": r["draft_length"], "loop ms/cycle": f"{r['loop_ms_per_cycle']:.3f}",
             **{name: cell(r, name) for name in (*COMPONENTS, "remainder")},
             "cycle in AR passes": r["cycle_in_ar_passes"], "tokens/cycle": r["tokens_per_cycle"],
             "est. speed-up": r["speedup_estimate"]} for r in results["cycles"]]
    return "\n".join(head) + "\n" + markdown_table(rows, list(rows[0]) if rows else [])
