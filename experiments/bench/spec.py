"""Ψ-Spec benchmark (docs/algorithms.md §7): accepted tokens per cycle, tokens per forward and wall-clock speed-up
over the AR sampler, for the gated-LoRA drafter and for Zarya self-speculation.

    python -m experiments.bench spec [--ckpt CKPT [--prompts-file test.jsonl]] [--adapter DIR]
        [--draft-lengths 4,8,16] [--batch-sizes 1,8,32] [--drafters lora,self] [--draft-passes 1,2] [--max-new-tokens 128]
        [--temperature 0] [--repeats 3]

Without --ckpt the script makes its own small model: a Qwen3 trained for a few hundred steps on a
deterministic synthetic text (letter sequences with a per-sequence stride, so the AR model is
predictable), plus a few steps of Zarya-style MDM training on masked copies so that the self drafter
has something to say (`zarya_jax.testing`). Without --adapter it trains a LoRA drafter on the same
text with the TV loss and the 2→16 block curriculum. Every configuration is compiled and warmed up
first; the timed runs of AR and spec at a batch size are interleaved, so both see the same machine load.
`measure(...)` returns the results as a dict.
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

from zarya_jax import lora as lora_lib
from zarya_jax.config import LoraConfig, PromptFormat, missing_mask_token
from zarya_jax.data import render
from zarya_jax.data.tokenizer import load_tokenizer
from zarya_jax.eval.tasks import read_jsonl
from zarya_jax.inference import load_for_inference
from zarya_jax.objectives.drafter import DrafterConfig
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.sampling.modes import mode as mode_of
from zarya_jax.testing import TINY, fit_adapter, pretrain_ar, synthetic_tokens

from .harness import markdown_table, timed

TINY_CONFIG = TINY.replace(tie_word_embeddings=False)
SMALL_CONFIG = TINY.replace(hidden_size=128, intermediate_size=384, num_layers=4, head_dim=32,
                            tie_word_embeddings=False)


def measure(ckpt: str | None = None, adapter: str | None = None, *, draft_lengths=(4, 8, 16), batch_sizes=(1, 8, 32),
        max_new_tokens: int = 128, prompt_length: int = 16, temperature: float = 0.0, repeats: int = 3,
        drafters=("lora", "self"), draft_passes=(1,), pretrain_steps: int = 300, drafter_steps: int = 200, lora_rank: int = 16,
        lora_alpha: float = 256.0, seed: int = 0, prompts_file: str | None = None, size: str = "small",
        train_length: int = 64, log=print, verify: bool = True) -> dict:
    """Measures Ψ-Spec against the AR sampler (module doc). Returns {'setup': …, 'results': [row, …]}
    with one row per (drafter, F, batch): accepted_per_cycle, tokens_per_cycle, tokens_per_forward,
    acceptance_by_position, ar_s, spec_s (best of `repeats`), speedup = ar_s / spec_s. draft_passes: the
    LoRA drafter's passes per cycle to measure (`GenerationConfig.draft_passes`; a row each).

    size: the synthetic model, "small" (4 layers × 128d) or "tiny" (2 × 64d; minutes on a busy CPU);
    train_length: sequence length of its pretraining and drafter batches.
    prompts_file: a JSONL of prompt/answer or messages records (as `experiments.evaluate`), tokenized
    with the checkpoint's tokenizer (byte when it has none); default: synthetic letter prompts."""
    setup: dict = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "max_new_tokens": max_new_tokens,
                   "temperature": temperature, "prompt_length": prompt_length, "repeats": repeats}
    if ckpt and "lora" in drafters and not adapter:
        raise ValueError("with --ckpt the LoRA drafter needs --adapter (train one with experiments.train_drafter), "
                         "or use --drafters self")
    loaded = None
    if ckpt:
        loaded = load_for_inference(ckpt, adapter=adapter if "lora" in drafters else None, verify=verify)
        params, config = loaded.params, loaded.config
        setup["model"] = loaded.ckpt
    else:
        if size not in ("small", "tiny"):
            raise ValueError(f"size={size!r}: expected 'small' or 'tiny'")
        config = SMALL_CONFIG if size == "small" else TINY_CONFIG
        t0 = time.perf_counter()
        params, loss = pretrain_ar(config, steps=pretrain_steps, batch=32 if size == "small" else 16,
                                   length=train_length, lr=3e-3 if size == "small" else 1e-2, mdm_weight=1.0, seed=seed)
        setup["model"] = (f"synthetic: {config.num_layers}×{config.hidden_size}d Qwen3, {pretrain_steps} steps AR+MDM "
                          f"on stride-letter text (final loss {loss:.3f}, {time.perf_counter() - t0:.0f}s)")
    log(f"model: {setup['model']}")
    lora_params = lora = None
    if "lora" in drafters:
        if adapter:
            lora_params, lora = ((loaded.adapter, loaded.lora) if loaded is not None
                                 else lora_lib.load(adapter, verify=verify))
            setup["adapter"] = os.path.abspath(adapter)
        else:
            lora = LoraConfig(rank=lora_rank, alpha=lora_alpha)
            t0 = time.perf_counter()
            lora_params, losses = fit_adapter(params, config, lora, DrafterConfig(), steps=drafter_steps,
                                              batch=16, length=train_length, lr=3e-3 if size == "small" else 1e-2,
                                              seed=seed)
            setup["adapter"] = (f"rank {lora.rank} alpha {lora.alpha}, {drafter_steps} TV steps with the 2→16 block "
                                f"curriculum (loss {np.mean(losses[:10]):.3f} → {np.mean(losses[-10:]):.3f}, "
                                f"{time.perf_counter() - t0:.0f}s)")
        log(f"adapter: {setup['adapter']}")
    if "self" in drafters and config.mask_token_id is None:
        raise ValueError(missing_mask_token("drafter 'self' needs", otherwise="bench the 'lora' drafter"))

    rng = np.random.default_rng(seed + 123)
    pool = None
    if prompts_file:
        tok, fmt = (loaded.tokenizer, loaded.prompt_format) if loaded is not None else (load_tokenizer("byte"),
                                                                                         PromptFormat())
        pool = [tok.encode(render.render(record, tok, fmt)[0]) for record in read_jsonl(prompts_file, fmt)]
        prompt_length = max(len(p) for p in pool)
        setup["prompts"] = f"{len(pool)} prompts from {os.path.abspath(prompts_file)}"
    results = []
    for b in batch_sizes:
        if pool is not None:
            prompts = [pool[i % len(pool)] for i in range(b)]
        else:
            rows = synthetic_tokens(rng, b, prompt_length)
            prompts = [list(map(int, r[: int(rng.integers(prompt_length // 2, prompt_length + 1))])) for r in rows]
        base = GenerationConfig(mode="ar", max_new_tokens=max_new_tokens, temperature=temperature,
                                prompt_bucket=prompt_length)
        configs = [(d, f, k) for d in drafters for f in draft_lengths for k in (draft_passes if d == "lora" else (1,))]
        key = jax.random.PRNGKey(seed)

        def call(gc):
            out = generate(params, config, prompts, gc, key, lora_params=lora_params, lora=lora)
            return out

        gcs = {None: base, **{(d, f, k): base.replace(mode=mode_of(f"spec-{d}", draft_length=f,
                                                                   **({"draft_passes": k} if d == "lora" else {})))
                              for d, f, k in configs}}
        outs = {k: call(gc) for k, gc in gcs.items()}  # compile + warm up
        best = {k: np.inf for k in gcs}
        for _ in range(repeats):  # interleaved: AR and every spec config see the same machine load
            for k, gc in gcs.items():
                _, dt = timed(lambda: call(gc))
                best[k] = min(best[k], dt)
        ar = outs[None]
        for d, f, k in configs:
            st = outs[(d, f, k)].stats
            same = bool(np.array_equal(outs[(d, f, k)].tokens, ar.tokens)) if temperature == 0 else None
            row = {"drafter": d, "draft_length": f, "draft_passes": k, "batch": b,
                   "accepted_per_cycle": st["accepted_per_cycle"],
                   "tokens_per_cycle": st["tokens_per_cycle"], "tokens_per_forward": st["tokens_per_forward"],
                   "acceptance_by_position": [round(x, 3) for x in st["acceptance_by_position"]],
                   "ar_s": best[None], "spec_s": best[(d, f, k)], "speedup": best[None] / best[(d, f, k)],
                   "identical_to_ar": same, "generated_tokens": int(outs[(d, f, k)].lengths.sum())}
            results.append(row)
            log(f"B={b:3d} {d:4s} F={f:2d} passes={k}: accepted/cycle {row['accepted_per_cycle']:.2f}  tokens/forward "
                f"{row['tokens_per_forward']:.2f}  AR {row['ar_s'] * 1e3:.0f} ms  spec {row['spec_s'] * 1e3:.0f} ms  "
                f"speed-up {row['speedup']:.2f}×  identical={same}")
    return {"setup": setup, "results": results}


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what}={text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what}={text!r}: expected positive integers")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", default=None, help="AR/Zarya checkpoint (default: train a small synthetic model)")
    p.add_argument("--adapter", default=None, help="trained adapter directory (default: train one here)")
    p.add_argument("--draft-lengths", default="4,8,16")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--drafters", default="lora,self", help="lora, self or both")
    p.add_argument("--draft-passes", default="1", help="the LoRA drafter's draft passes per cycle, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--size", choices=("small", "tiny"), default="small", help="the synthetic model's size")
    p.add_argument("--train-length", type=int, default=64, help="sequence length of the synthetic training")
    p.add_argument("--pretrain-steps", type=int, default=300)
    p.add_argument("--drafter-steps", type=int, default=200)
    p.add_argument("--prompts-file", default=None, help="JSONL of prompt/answer records to use as prompts")
    p.add_argument("--no-verify", action="store_true", help="load --ckpt / --adapter without checking their checksums")


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench spec`: argparse namespace → (results, markdown)."""
    drafters = tuple(d for d in args.drafters.split(",") if d)
    bad = [d for d in drafters if d not in ("lora", "self")]
    if bad or not drafters:
        raise ValueError(f"--drafters={args.drafters!r}: expected 'lora', 'self' or 'lora,self'")
    for path, what in ((args.ckpt, "--ckpt"), (args.adapter, "--adapter"), (args.prompts_file, "--prompts-file")):
        if path and not os.path.exists(path):
            raise FileNotFoundError(f"{what} {path!r} does not exist")
    result = measure(args.ckpt, args.adapter, draft_lengths=_ints(args.draft_lengths, "--draft-lengths"),
                     batch_sizes=_ints(args.batch_sizes, "--batch-sizes"), max_new_tokens=args.max_new_tokens,
                     prompt_length=args.prompt_length, temperature=args.temperature, repeats=args.repeats,
                     drafters=drafters, draft_passes=_ints(args.draft_passes, "--draft-passes"), pretrain_steps=args.pretrain_steps, drafter_steps=args.drafter_steps,
                     prompts_file=args.prompts_file, size=args.size, train_length=args.train_length,
                     verify=not args.no_verify)
    head = "".join(f"{k}: {v}\n\n" for k, v in result["setup"].items() if k in ("model", "adapter", "prompts"))
    cols = ["drafter", "draft_length", "draft_passes", "batch", "accepted_per_cycle", "tokens_per_cycle", "tokens_per_forward",
            "ar_s", "spec_s", "speedup", "identical_to_ar"]
    return result, head + markdown_table(result["results"], cols)
