"""Ψ-Spec (docs/algorithms.md §7): accepted tokens per cycle, tokens per forward and wall-clock speed-up over the
AR sampler, for the two-pass modes `spec-lora` (Uno's gated-LoRA drafter) and `spec-self` (Zarya
self-speculation).

Without `ckpt` it makes its own small model: a Qwen3 trained for a few hundred steps on a deterministic
synthetic text (letter sequences with a per-sequence stride, so the AR model is predictable), plus a few
steps of Zarya-style MDM training on masked copies so that the self drafter has something to say
(`zarya_jax.testing`). Without `adapter` it trains a LoRA drafter on the same text with the TV loss and the
2→16 block curriculum. Every configuration is compiled and warmed up first; the timed runs of AR and spec at
a batch size are interleaved, so both see the same machine load.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from .. import lora as lora_lib
from ..config import LoraConfig, PromptFormat, missing_mask_token
from ..data import render
from ..data.tokenizer import load_tokenizer
from ..eval.tasks import read_jsonl
from ..inference import load_for_inference
from ..objectives.drafter import DrafterConfig
from ..sampling import GenerationConfig, generate
from ..sampling.modes import MODES as ALL_MODES, mode as mode_of
from ..testing import TINY, fit_adapter, pretrain_ar, synthetic_tokens
from .results import markdown_table, timed

MODES = ("spec-lora", "spec-self")  # the decoding modes timed here against "ar"
TINY_CONFIG = TINY.replace(tie_word_embeddings=False)
SMALL_CONFIG = TINY.replace(hidden_size=128, intermediate_size=384, num_layers=4, head_dim=32,
                            tie_word_embeddings=False)


def check_modes(names, flag: str = "--modes") -> tuple[str, ...]:
    """`names` (mode names, `sampling.modes.MODES`) if every one is timed here (`MODES`), else a ValueError."""
    names = tuple(names)
    if names and all(n in MODES for n in names):
        return names
    other = [n for n in names if n in ALL_MODES and n not in MODES]
    why = f" ({', '.join(other)}: a decoding mode bench spec does not time)" if other else ""
    raise ValueError(f"{flag}={','.join(names)!r}: expected a comma-separated subset of {','.join(MODES)}{why}")


@dataclasses.dataclass(frozen=True)
class SpecSettings:
    """Each mode of `modes` at each draft length F of `draft_lengths` (`spec-lora` also at each of
    `draft_passes`) and each batch size, against AR, on `ckpt` (with `adapter` for `spec-lora`) or a synthetic
    model of `size` "small" (4 layers × 128d) or "tiny" (2 × 64d), trained `pretrain_steps` (and a drafter
    `drafter_steps`) on rows of `train_length` tokens. prompts_file: a JSONL of prompt/answer or messages
    records (as `experiments.evaluate`), tokenized with the checkpoint's tokenizer (byte when it has none);
    default: synthetic letter prompts of up to `prompt_length` tokens."""

    ckpt: str | None = None
    adapter: str | None = None
    modes: tuple[str, ...] = MODES
    draft_lengths: tuple[int, ...] = (4, 8, 16)
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    draft_passes: tuple[int, ...] = (1,)
    max_new_tokens: int = 128
    prompt_length: int = 16
    temperature: float = 0.0
    repeats: int = 3
    pretrain_steps: int = 300
    drafter_steps: int = 200
    lora_rank: int = 16
    lora_alpha: float = 256.0
    seed: int = 0
    prompts_file: str | None = None
    size: str = "small"
    train_length: int = 64
    verify: bool = True

    def check(self) -> None:
        check_modes(self.modes)
        if self.size not in ("small", "tiny"):
            raise ValueError(f"size={self.size!r}: expected 'small' or 'tiny'")
        if self.ckpt and "spec-lora" in self.modes and not self.adapter:
            raise ValueError("with --ckpt, mode spec-lora (the LoRA drafter) needs --adapter (train one with "
                             "experiments.train_drafter), or use --modes spec-self")


def _model(s: SpecSettings, setup: dict, log):
    """(params, config, the loaded checkpoint or None): `s.ckpt`, or a synthetic model trained here."""
    if s.ckpt:
        loaded = load_for_inference(s.ckpt, adapter=s.adapter if "spec-lora" in s.modes else None, verify=s.verify)
        setup["model"] = loaded.ckpt
        log(f"model: {setup['model']}")
        return loaded.params, loaded.config, loaded
    config = SMALL_CONFIG if s.size == "small" else TINY_CONFIG
    t0 = time.perf_counter()
    params, loss = pretrain_ar(config, steps=s.pretrain_steps, batch=32 if s.size == "small" else 16,
                               length=s.train_length, lr=3e-3 if s.size == "small" else 1e-2, mdm_weight=1.0,
                               seed=s.seed)
    setup["model"] = (f"synthetic: {config.num_layers}×{config.hidden_size}d Qwen3, {s.pretrain_steps} steps AR+MDM "
                      f"on stride-letter text (final loss {loss:.3f}, {time.perf_counter() - t0:.0f}s)")
    log(f"model: {setup['model']}")
    return params, config, None


def _adapter(s: SpecSettings, params, config, loaded, setup: dict, log):
    """(adapter params, LoraConfig) for `spec-lora`: `s.adapter`, or one trained here."""
    if s.adapter:
        lora_params, lora = (loaded.adapter, loaded.lora) if loaded is not None else lora_lib.load(s.adapter,
                                                                                                   verify=s.verify)
        setup["adapter"] = os.path.abspath(s.adapter)
    else:
        lora = LoraConfig(rank=s.lora_rank, alpha=s.lora_alpha)
        t0 = time.perf_counter()
        lora_params, losses = fit_adapter(params, config, lora, DrafterConfig(), steps=s.drafter_steps, batch=16,
                                          length=s.train_length, lr=3e-3 if s.size == "small" else 1e-2, seed=s.seed)
        setup["adapter"] = (f"rank {lora.rank} alpha {lora.alpha}, {s.drafter_steps} TV steps with the 2→16 block "
                            f"curriculum (loss {np.mean(losses[:10]):.3f} → {np.mean(losses[-10:]):.3f}, "
                            f"{time.perf_counter() - t0:.0f}s)")
    log(f"adapter: {setup['adapter']}")
    return lora_params, lora


def measure(s: SpecSettings, log=print) -> dict:
    """Measures Ψ-Spec against the AR sampler (module doc). Returns {'setup': …, 'results': [row, …]}
    with one row per (drafter, F, draft passes, batch): accepted_per_cycle, tokens_per_cycle,
    tokens_per_forward, acceptance_by_position, ar_s, spec_s (best of `repeats`), speedup = ar_s / spec_s;
    `drafter` is the mode's (`lora` for spec-lora, `self` for spec-self)."""
    s.check()
    setup: dict = {"backend": jax.default_backend(), "device": str(jax.devices()[0]),
                   "max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                   "prompt_length": s.prompt_length, "repeats": s.repeats}
    params, config, loaded = _model(s, setup, log)
    lora_params = lora = None
    if "spec-lora" in s.modes:
        lora_params, lora = _adapter(s, params, config, loaded, setup, log)
    if "spec-self" in s.modes and config.mask_token_id is None:
        raise ValueError(missing_mask_token("mode 'spec-self' needs", otherwise="bench the 'spec-lora' mode"))

    rng = np.random.default_rng(s.seed + 123)
    pool, prompt_length = None, s.prompt_length
    if s.prompts_file:
        tok, fmt = (loaded.tokenizer, loaded.prompt_format) if loaded is not None else (load_tokenizer("byte"),
                                                                                         PromptFormat())
        pool = [tok.encode(render.render(record, tok, fmt)[0]) for record in read_jsonl(s.prompts_file, fmt)]
        prompt_length = max(len(p) for p in pool)
        setup["prompts"] = f"{len(pool)} prompts from {os.path.abspath(s.prompts_file)}"
    results = []
    for b in s.batch_sizes:
        if pool is not None:
            prompts = [pool[i % len(pool)] for i in range(b)]
        else:
            rows = synthetic_tokens(rng, b, prompt_length)
            prompts = [list(map(int, r[: int(rng.integers(prompt_length // 2, prompt_length + 1))])) for r in rows]
        base = GenerationConfig(mode="ar", max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                                prompt_bucket=prompt_length)
        key = jax.random.PRNGKey(s.seed)
        call = lambda gc: generate(params, config, prompts, gc, key,  # noqa: E731,B023 (used in this iteration)
                                   lora_params=lora_params, lora=lora)
        results += _rows_at_batch(s, b, base, call, log)
    return {"setup": setup, "results": results}


def _rows_at_batch(s: SpecSettings, b: int, base: GenerationConfig, call, log) -> list[dict]:
    """A row per (mode, F, draft passes) of `s` at batch size `b`: `call(gc)` (generate on the batch's prompts)
    of AR (`base`) and of each configuration, compiled and warmed up, then timed interleaved."""
    configs = [(m, f, k) for m in s.modes for f in s.draft_lengths
               for k in (s.draft_passes if m == "spec-lora" else (1,))]
    gcs = {None: base, **{(m, f, k): base.replace(mode=mode_of(m, draft_length=f,
                                                               **({"draft_passes": k} if m == "spec-lora" else {})))
                          for m, f, k in configs}}
    outs = {k: call(gc) for k, gc in gcs.items()}  # compile + warm up
    best = {k: np.inf for k in gcs}
    for _ in range(s.repeats):  # interleaved: AR and every spec config see the same machine load
        for k, gc in gcs.items():
            _, dt = timed(lambda: call(gc))  # noqa: B023 (called here)
            best[k] = min(best[k], dt)
    ar, rows = outs[None], []
    for m, f, k in configs:
        st = outs[(m, f, k)].stats
        same = bool(np.array_equal(outs[(m, f, k)].tokens, ar.tokens)) if s.temperature == 0 else None
        d = ALL_MODES[m].drafter
        row = {"drafter": d, "draft_length": f, "draft_passes": k, "batch": b,
               "accepted_per_cycle": st["accepted_per_cycle"],
               "tokens_per_cycle": st["tokens_per_cycle"], "tokens_per_forward": st["tokens_per_forward"],
               "acceptance_by_position": [round(x, 3) for x in st["acceptance_by_position"]],
               "ar_s": best[None], "spec_s": best[(m, f, k)], "speedup": best[None] / best[(m, f, k)],
               "identical_to_ar": same, "generated_tokens": int(outs[(m, f, k)].lengths.sum())}
        rows.append(row)
        log(f"B={b:3d} {d:4s} F={f:2d} passes={k}: accepted/cycle {row['accepted_per_cycle']:.2f}  tokens/forward "
            f"{row['tokens_per_forward']:.2f}  AR {row['ar_s'] * 1e3:.0f} ms  spec {row['spec_s'] * 1e3:.0f} ms  "
            f"speed-up {row['speedup']:.2f}×  identical={same}")
    return rows


def markdown(result: dict) -> str:
    head = "".join(f"{k}: {v}\n\n" for k, v in result["setup"].items() if k in ("model", "adapter", "prompts"))
    cols = ["drafter", "draft_length", "draft_passes", "batch", "accepted_per_cycle", "tokens_per_cycle",
            "tokens_per_forward", "ar_s", "spec_s", "speedup", "identical_to_ar"]
    return head + markdown_table(result["results"], cols)


def run(s: SpecSettings, log=print) -> tuple[dict, str]:
    result = measure(s, log)
    return result, markdown(result)
