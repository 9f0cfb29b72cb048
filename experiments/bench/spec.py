"""Ψ-Spec benchmark (docs/algorithms.md §7): accepted tokens per cycle, tokens per forward and wall-clock speed-up
over the AR sampler, for the decoding modes spec-lora (the gated-LoRA drafter) and spec-self (Zarya
self-speculation).

    python -m experiments.bench spec [--ckpt CKPT [--prompts-file test.jsonl]] [--adapter DIR]
        [--draft-lengths 4,8,16] [--batch-sizes 1,8,32] [--modes spec-lora,spec-self] [--draft-passes 1,2]
        [--max-new-tokens 128] [--temperature 0] [--repeats 3]

Without --ckpt the script makes its own small model (a Qwen3 trained for a few hundred steps on a
deterministic synthetic text, plus MDM training so that the self drafter has something to say); without
--adapter it trains a LoRA drafter on the same text. Every configuration is compiled and warmed up first;
the timed runs of AR and spec at a batch size are interleaved. The measurement: `zarya_jax.bench.spec`
(`measure(SpecSettings(...))` returns the results as a dict).
"""
from __future__ import annotations

import argparse
import os

from zarya_jax.bench import spec

from .harness import names

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
    p.add_argument("--modes", default=None,
                   help=f"decoding modes to time against ar: a comma-separated subset of {','.join(spec.MODES)} "
                   f"(default: both)")
    p.add_argument("--draft-passes", default="1", help="spec-lora's draft passes per cycle, e.g. 1,2,3")
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


def modes(args) -> tuple[str, ...]:
    """The mode names of `--modes` (default: every mode `bench spec` times)."""
    return spec.check_modes(names(args.modes) if args.modes is not None else spec.MODES)


def settings(args) -> spec.SpecSettings:
    chosen = modes(args)
    for path, what in ((args.ckpt, "--ckpt"), (args.adapter, "--adapter"), (args.prompts_file, "--prompts-file")):
        if path and not os.path.exists(path):
            raise FileNotFoundError(f"{what} {path!r} does not exist")
    s = spec.SpecSettings(
        ckpt=args.ckpt, adapter=args.adapter, modes=chosen, draft_lengths=_ints(args.draft_lengths, "--draft-lengths"),
        batch_sizes=_ints(args.batch_sizes, "--batch-sizes"), draft_passes=_ints(args.draft_passes, "--draft-passes"),
        max_new_tokens=args.max_new_tokens, prompt_length=args.prompt_length, temperature=args.temperature,
        repeats=args.repeats, pretrain_steps=args.pretrain_steps, drafter_steps=args.drafter_steps,
        prompts_file=args.prompts_file, size=args.size, train_length=args.train_length, verify=not args.no_verify)
    s.check()
    return s


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench spec`: argparse namespace → (results, markdown)."""
    return spec.run(settings(args))
