"""Where a two-pass Ψ-Spec cycle's time goes: the compiled cycle of spec-lora and spec-self, step by step, against AR.

    python -m experiments.bench cycle --ckpt CKPT --adapter DIR --data test.jsonl [--batch 1]
    python -m experiments.bench cycle --smoke        # seconds: random tiny weights and a random LoRA adapter

Per mode of `--modes` and draft length F of `--draft-lengths`, at `--batch` rows, greedy: ms per cycle of the real
compiled loop (`spec_decode`, the slope between 1 cycle and the whole `--new-tokens` budget), each step of a
cycle jitted in a loop of its own with the cycle's shapes (draft pass, verify pass, sampling + acceptance,
emit, cache commit) and its share of the cycle, the remainder, AR's ms per pass of its own loop, the cycle's
cost in AR passes (the tokens a cycle must yield to break even) and the tokens per cycle the model yields on
`--data`'s prompts (rendered in the checkpoint's prompt format). Without `--ckpt`: random weights of
`--preset` (and a random LoRA adapter) on random prompts. The measurement: `zarya_jax.bench.cycle`.
"""
from __future__ import annotations

import argparse

from zarya_jax.bench import cycle

from .harness import csv_ints, names

D = cycle.CycleSettings()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true", help="seconds on a CPU: tiny preset, random weights and adapter")
    p.add_argument("--ckpt", default=None, help="checkpoint (default: random weights of --preset)")
    p.add_argument("--adapter", default=None, help="LoRA drafter directory (needed by spec-lora with --ckpt)")
    p.add_argument("--data", default=None,
                   help="JSONL of prompt records: the prompts, and the tokens per cycle decoded to EOS (with --ckpt)")
    p.add_argument("--preset", default=D.preset, help="model preset of the random weights")
    p.add_argument("--modes", default=",".join(D.modes), help=f"a comma-separated subset of {','.join(cycle.MODES)}")
    p.add_argument("--draft-lengths", type=csv_ints, default=list(D.draft_lengths), help="draft lengths F")
    p.add_argument("--batch", type=int, default=D.batch, help="rows per decode")
    p.add_argument("--prompt-length", type=int, default=D.prompt_length, help="tokens of a random prompt")
    p.add_argument("--new-tokens", type=int, default=D.new_tokens, help="budget per row (the long timed run)")
    p.add_argument("--repeats", type=int, default=D.repeats, help="timed runs per measurement (the best counts)")
    p.add_argument("--max-prompts", type=int, default=D.max_prompts, help="prompts of --data decoded for the yield")


def settings(args) -> cycle.CycleSettings:
    s = cycle.CycleSettings(
        ckpt=args.ckpt, adapter=args.adapter, data=args.data, preset=args.preset, modes=names(args.modes),
        draft_lengths=tuple(args.draft_lengths), batch=args.batch, prompt_length=args.prompt_length,
        new_tokens=args.new_tokens, repeats=args.repeats, max_prompts=args.max_prompts)
    s = cycle.smoke(s) if args.smoke else s
    s.check()
    return s


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench cycle`: argparse namespace → (results, markdown)."""
    return cycle.run(settings(args))
