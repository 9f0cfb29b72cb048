"""Evaluate any checkpoint on any JSONL set in any decoding mode (`zarya_jax.eval.evaluate`).

    python -m experiments.evaluate --ckpt CKPT --data test.jsonl --modes ar,mdm,slotted,spec-self \\
        [--lora ADAPTER --modes spec-lora] [--answer final|regex|exact] [--answer-regex PAT] \\
        [--max-new-tokens 64] [--batch-size 1] [--knob slotted.slot_size=4] [--batch1-examples N] \\
        [--diagnose [--slot-sizes 2,4,8]] [--prompt-key question] [--format FIELD=VALUE] [--out DIR]

Records are `{"prompt", "answer"}` (other field names with `--prompt-key` / `--answer-key`, e.g. GSM8K's
`question`) or chat `{"messages": [...]}` ending with the assistant answer. They are rendered exactly as
the checkpoint's training data was (its recorded prompt format: chat template, system message, prompt
template; `zarya_jax.data.render`); `--format FIELD=VALUE` changes one field of it.
Modes: `ar` (autoregressive baseline), `mdm` (mode A, SPEC §5), `slotted` (mode B, SPEC §6),
`spec-self` (lossless Zarya self-speculation, SPEC §7), `spec-lora` (Uno's LoRA drafter, needs
`--lora`; sampled with the noise convention it was trained with). `--knob [MODE.]FIELD=VALUE` sets any
`GenerationConfig` field for one mode or all (YAML values, typed; an unknown field is an error that
names the closest ones). Per mode it reports exact-match accuracy, wall-clock generated tokens/s
(compile time excluded and reported apart), tokens per forward pass and the speed-up over `ar`; it
writes `summary.json` (with the arguments and the code's provenance: commit, dirty tree, package
versions), `summary.md` and `predictions.jsonl` (one line per example and mode) to `--out` (default
`<ckpt>_eval`). `--batch1-examples N` also times the first N records at batch 1. `--diagnose` adds the
diagnostics (`zarya_jax.eval.diagnose`: each head's teacher-forced accuracy by offset within a slot,
where each mode's outputs first go wrong) to `summary.json` and `summary.md`.

Everything is checked before any decoding: the flags, each mode's knobs (a knob the mode does not read,
such as `ar.slot_size` or `ar.mode`, is an error), every record, the checkpoint against its checksums
(`--no-verify` skips that), each mode against the model and the prompts, and that `--out` can be
written. Exit status: 0 done, 2 bad input (one `error:` line, nothing written).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from zarya_jax import checkpoint
from zarya_jax import lora as lora_lib
from zarya_jax import overrides
from zarya_jax.config import PromptFormat
from zarya_jax.eval import answers, diagnose
from zarya_jax.eval.evaluate import (MODES, check_answer, check_mode_knobs, evaluate, generation_config,
                                     load_tokenizer_for, parse_knobs, parse_modes, prompt_format_for, summary_markdown,
                                     write_outputs)
from zarya_jax.eval.tasks import read_jsonl
from zarya_jax.files import check_writable_dir
from zarya_jax.provenance import provenance

from . import cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.evaluate", description=__doc__,
                                epilog=overrides.help_table(overrides.keys(PromptFormat), "--format"),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint directory (zarya_jax.checkpoint.save format)")
    p.add_argument("--data", required=True, help="JSONL of {prompt, answer} or {messages} records")
    p.add_argument("--modes", default="ar,mdm,slotted,spec-self", help=f"comma-separated subset of {MODES}")
    p.add_argument("--lora", default=None, help="LoRA drafter adapter directory (for spec-lora)")
    p.add_argument("--tokenizer", default=None, help="'byte' or a HF tokenizer directory (default: from --ckpt)")
    p.add_argument("--answer", default="final", choices=answers.METHODS, help="answer extraction method")
    p.add_argument("--answer-regex", default=None, help="pattern for --answer regex (last match, group 1)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N records")
    p.add_argument("--knob", action="append", default=[],
                   help="[MODE.]FIELD=VALUE GenerationConfig override, repeatable (e.g. slotted.slot_size=4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch1-examples", type=int, default=0, help="also time the first N records at batch 1")
    p.add_argument("--diagnose", action="store_true", help="add each head's teacher-forced accuracy and each "
                   "mode's first errors to the summary")
    p.add_argument("--slot-sizes", default="2,4,8", help="slot sizes of the --diagnose teacher-forced MDM accuracy")
    add_format_arguments(p)
    p.add_argument("--out", default=None, help="output directory (default: <ckpt>_eval)")
    p.add_argument("--no-verify", action="store_true",
                   help="load the checkpoint (and --lora adapter) without checking their checksums")
    return p


def add_format_arguments(p: argparse.ArgumentParser) -> None:
    """`--prompt-key`, `--answer-key` and `--format FIELD=VALUE`: changes to the checkpoint's prompt format."""
    p.add_argument("--prompt-key", default=None, help="record field holding the prompt (default: the checkpoint's, "
                   "else 'prompt'), e.g. question")
    p.add_argument("--answer-key", default=None, help="record field holding the reference answer (default: 'answer')")
    p.add_argument("--format", dest="format", action="append", default=[], metavar="FIELD=VALUE",
                   help="a PromptFormat field (" + ", ".join(f.name for f in dataclasses.fields(PromptFormat))
                   + "), e.g. chat_template=false (repeatable)")


def format_overrides(args) -> list[str]:
    """The `--format` items, with `--prompt-key` / `--answer-key` as two more."""
    keys = [f"{name}={value}" for name, value in (("prompt_key", args.prompt_key), ("answer_key", args.answer_key))
            if value is not None]
    return list(args.format) + keys


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(lambda: _run(args))


def _validate_flags(args) -> tuple[list[str], dict, list[int]]:
    """Every flag, each mode's knobs included, before anything is read: (modes, knobs, slot sizes)."""
    modes = parse_modes(args.modes)
    knobs = parse_knobs(args.knob)
    for flag in ("max_new_tokens", "batch_size"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')}={getattr(args, flag)}: expected ≥ 1")
    check_mode_knobs(modes, knobs)
    for mode in modes:
        generation_config(mode, args.max_new_tokens, knobs).validate()
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit={args.limit}: expected ≥ 1 (omit it to evaluate every record)")
    check_answer(args.answer, args.answer_regex)
    if args.batch1_examples < 0:
        raise ValueError(f"--batch1-examples={args.batch1_examples}: expected ≥ 0")
    try:
        slot_sizes = [int(x) for x in args.slot_sizes.split(",") if x.strip()]
    except ValueError:
        slot_sizes = []
    if not slot_sizes or min(slot_sizes) < 1:
        raise ValueError(f"--slot-sizes {args.slot_sizes!r}: expected comma-separated integers ≥ 1, e.g. 2,4,8")
    if "spec-lora" in modes and not args.lora:
        raise ValueError("mode 'spec-lora' needs --lora ADAPTER_DIR")
    return modes, knobs, slot_sizes


def _run(args) -> int:
    modes, knobs, slot_sizes = _validate_flags(args)
    if not os.path.isdir(args.ckpt):
        raise ValueError(f"--ckpt {args.ckpt!r} is not a directory")
    out = args.out or os.path.join(args.ckpt.rstrip("/") + "_eval")
    check_writable_dir(out, "--out")  # now, not after the decoding
    fmt = prompt_format_for(args.ckpt, format_overrides(args))
    records = read_jsonl(args.data, fmt)
    if args.limit is not None:
        records = records[: args.limit]
    params, config = checkpoint.load(args.ckpt, verify=not args.no_verify)
    tokenizer = load_tokenizer_for(args.ckpt, args.tokenizer)
    lora_params = lora_cfg = None
    if args.lora:
        lora_params, lora_cfg = lora_lib.load(args.lora, verify=not args.no_verify)
        lora_lib.check_lora(lora_params, config, lora_cfg)
    summary, predictions = evaluate(params, config, tokenizer, records, modes,
                                    max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                    knobs=knobs, method=args.answer, pattern=args.answer_regex,
                                    lora_params=lora_params, lora=lora_cfg, seed=args.seed,
                                    batch1_examples=args.batch1_examples, prompt_format=fmt)
    diag = (diagnose.analyse(params, config, tokenizer, records, summary, predictions, slot_sizes, fmt)
            if args.diagnose else None)
    extra = {"ckpt": os.path.abspath(args.ckpt), "data": os.path.abspath(args.data), "arguments": vars(args),
             "prompt_format": overrides.to_dict(fmt), "provenance": provenance()}
    if diag is not None:
        extra["diagnostics"] = diag
    markdown = summary_markdown(summary) + ("\n## Diagnostics\n\n" + diagnose.markdown(diag) if diag else "")
    write_outputs(out, summary, predictions, extra, markdown)
    print(markdown)
    print(f"wrote {out}/summary.json, summary.md, predictions.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
