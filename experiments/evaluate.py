"""Evaluate any checkpoint on any JSONL set in any decoding mode (`zarya_jax.eval.evaluate`).

    python -m experiments.evaluate --ckpt CKPT --data test.jsonl --modes ar,mdm,slotted,spec-self \\
        [--lora ADAPTER --modes spec-lora,spec-lora-fused] [--draft-ckpt DRAFT_CKPT --modes spec-model] [--answer final|regex|exact] [--answer-regex PAT] \\
        [--max-new-tokens 64] [--batch-size 1] [--knob slotted.slot_size=4] [--batch1-examples N] \\
        [--diagnose [--slot-sizes 2,4,8]] [--prompt-key question] [--format FIELD=VALUE] [--out DIR [--force]]

Records are `{"prompt", "answer"}` (other field names with `--prompt-key` / `--answer-key`, e.g. GSM8K's
`question`) or chat `{"messages": [...]}` ending with the assistant answer. They are rendered exactly as
the checkpoint's training data was (its recorded prompt format: chat template, system message, prompt
template; `zarya_jax.data.render`); `--format FIELD=VALUE` changes one field of it.
Modes: `ar` (autoregressive baseline), `mdm` (mode A, docs/algorithms.md §5), `slotted` (mode B, docs/algorithms.md §6),
`spec-self` (lossless Zarya self-speculation, docs/algorithms.md §7), `spec-lora` (Uno's LoRA drafter, needs
`--lora`; sampled with the noise convention it was trained with), `spec-model` (classic speculative
sampling with an independent draft model, needs `--draft-ckpt`, e.g. one from
`experiments.train_draft_model`; docs/algorithms.md §7.6), `spec-self-fused` / `spec-lora-fused` (the same
drafters in one forward pass per cycle, docs/algorithms.md §7.5). `--knob MODE.FIELD=VALUE` sets a field
of that mode (its dataclass in `zarya_jax.sampling`, e.g. `slotted.token_threshold=0.5`) or a shared
sampling field for it (`spec-self.temperature=0.7`); `--knob '*.FIELD=VALUE'` sets a shared field for
every mode (YAML values, typed from the field; a field the mode does not have is an error that names
its fields, and so is a knob for a mode not in `--modes`). Per mode it reports exact-match accuracy,
wall-clock generated tokens/s
(the modes take turns `eval.repeats` times, 2 by default, and each one's best counts; compile time excluded and
reported apart, in the table too), tokens per forward pass and the speed-up
over `ar`; it writes `summary.json` (with the arguments, the evaluation's settings and their id, and the
code's provenance: commit, dirty tree, package versions), `summary.md` and `predictions.jsonl` (one line
per example and mode) to `--out`.

Outputs never replace results. Without `--out` each evaluation writes a directory of its own,
`<ckpt>_eval/<data>-<modes>-<id>`, the id a hash of everything that makes it distinct
(`zarya_jax.eval.identity`: the content of the checkpoint, the records, the adapter, the draft model and
the tokenizer; every `eval` field; each mode's resolved decoding config; the prompt format; the
diagnostics). Run again with the same settings, it prints the stored summary and `kept DIR` without
decoding anything; an `--out` that holds another evaluation is refused (naming what differs) unless
`--force`, which replaces it (`--force` also recomputes the same evaluation). The directory appears
whole, or, when it already existed, summary.json is written last: an error or a signal leaves no
half-written result. On stderr: `compiling mode X… 12.3 s` while a mode's first batches compile, then
a bar per mode that advances after every batch.

`--limit N` evaluates the first N records (0, the default, evaluates them all, as `eval.limit` does).
`--batch1-examples N` also times the first N records at batch 1. `--diagnose` adds the diagnostics
(`zarya_jax.eval.diagnose`: each head's teacher-forced accuracy by offset within a slot, where each
mode's outputs first go wrong) to `summary.json` and `summary.md`.

The flags are the fields of an `eval` section (`zarya_jax.eval.evaluate.EvalConfig`, the quickstart's):
`--set eval.FIELD=VALUE` sets any of them (e.g. `eval.limit=5`, `eval.knobs.slotted.slot_size=4`), and
each is validated once, where the section is built; `--set eval.ckpt=DIR` is `--ckpt DIR`. The
checkpoint is read by `zarya_jax.inference.load_for_inference` (`--tokenizer` wins over the
checkpoint's own tokenizer).

Everything is checked before any decoding: the flags, each mode's knobs (a field the mode does not have,
such as `ar.slot_size` or `ar.mode`, is an error), that the checkpoint has a mask token when a mode
needs one (`mdm`, `slotted`, `spec-self`: the error names the checkpoint and `conversion.hf_to_jax
--add-mask-token`), every record, the checkpoint against its checksums (`--no-verify` skips that),
each mode against the model and the prompts, that `--out` can be written, that it lands on none of
the inputs and that it holds no other evaluation. Exit status: 0 done, 2 bad input (one `error:` line,
nothing written), 130 / 143 on Ctrl-C / SIGTERM (nothing written).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re

from zarya_jax import overrides
from zarya_jax.checkpoint import load_config
from zarya_jax.config import ConfigError, PromptFormat
from zarya_jax.eval import answers, diagnose, identity
from zarya_jax.eval.evaluate import (ADAPTER_MODES, DRAFT_MODEL_MODES, MODES, EvalConfig, check_mask_token,
                                     check_mode_knobs, evaluate, generation_config, parse_knobs, parse_modes,
                                     summary_markdown, write_outputs)
from zarya_jax.eval.tasks import read_jsonl
from zarya_jax.files import OutputPathError, check_output, check_writable_dir
from zarya_jax.inference import load_for_inference, prompt_format
from zarya_jax.provenance import provenance

from . import cli


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """The command's config tree: one `eval` section (its `--set` keys are `eval.*`)."""

    eval: EvalConfig = EvalConfig()


# The flags that are fields of the eval section: (field, flag), so an error names the flag the user typed.
FLAGS = (("ckpt", "--ckpt"), ("modes", "--modes"), ("max_new_tokens", "--max-new-tokens"),
         ("batch_size", "--batch-size"), ("limit", "--limit"), ("answer", "--answer"),
         ("answer_regex", "--answer-regex"), ("seed", "--seed"), ("batch1_examples", "--batch1-examples"))

OUTPUTS = ("summary.json", "summary.md", "predictions.jsonl")  # what `write_outputs` writes into --out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.evaluate", description=__doc__,
                                epilog=overrides.help_table(overrides.keys(EvaluateConfig)) + "\n\n"
                                + overrides.help_table(overrides.keys(PromptFormat), "--format"),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default="", help="checkpoint directory (zarya_jax.checkpoint.save format; required, "
                   "here or as --set eval.ckpt=DIR)")
    p.add_argument("--data", required=True, help="JSONL of {prompt, answer} or {messages} records")
    p.add_argument("--modes", default="ar,mdm,slotted,spec-self", help=f"comma-separated subset of {MODES}")
    p.add_argument("--lora", default=None, help="LoRA drafter adapter directory (for spec-lora)")
    p.add_argument("--draft-ckpt", default=None, help="draft model checkpoint directory (for spec-model)")
    p.add_argument("--tokenizer", default=None, help="'byte' or a HF tokenizer directory (default: from --ckpt)")
    p.add_argument("--answer", default="final", choices=answers.METHODS, help="answer extraction method")
    p.add_argument("--answer-regex", default="", help="pattern for --answer regex (last match, group 1)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N records (0: all)")
    p.add_argument("--knob", action="append", default=[],
                   help="MODE.FIELD=VALUE (a field of that mode, or a shared sampling field) or '*.FIELD=VALUE' "
                   "(a shared field, every mode), repeatable (e.g. slotted.slot_size=4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch1-examples", type=int, default=0, help="also time the first N records at batch 1")
    p.add_argument("--diagnose", action="store_true", help="add each head's teacher-forced accuracy and each "
                   "mode's first errors to the summary")
    p.add_argument("--slot-sizes", default="2,4,8", help="slot sizes of the --diagnose teacher-forced MDM accuracy")
    add_format_arguments(p)
    cli.add_set_flag(p, "eval.limit=5")
    p.add_argument("--out", default=None, help="output directory (default: <ckpt>_eval/<data>-<modes>-<id>, one per "
                   "evaluation; a directory holding another evaluation is refused unless --force)")
    p.add_argument("--force", action="store_true", help="replace the evaluation --out holds, or recompute the same one")
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
    args = cli.parse_args(build_parser(), argv)
    return cli.run(lambda: _run(args))


def eval_config(args) -> tuple[EvalConfig, dict]:
    """The eval section from the flags, `--knob MODE.FIELD=VALUE` items as `eval.knobs.MODE.FIELD`, then
    `--set` (which wins); and the shared knobs for every mode (`--knob '*.FIELD=VALUE'`). The section
    validates every field; an error names the flag it came from."""
    knobs = parse_knobs(args.knob)
    flags = {f"eval.{field}": getattr(args, field) for field, _ in FLAGS}
    flags["eval.modes"] = parse_modes(args.modes)
    flags.update({f"eval.knobs.{mode}.{k}": v for mode, items in knobs.items() if mode != "*" for k, v in items.items()})
    given = cli.set_overrides(args)
    try:
        config = overrides.apply(EvaluateConfig(), cli.set_overrides(args, flags)).eval
    except overrides.UnknownKey:
        raise  # typed under --set, and its suggestions are keys (eval.modes), not the flags they rename to
    except ConfigError as e:
        message = str(e)
        for field, flag in FLAGS:
            if f"eval.{field}" not in given:
                message = re.sub(rf"\beval\.{field}\b", flag, message)
        raise ConfigError(message) from None
    return config, {"*": knobs["*"]} if "*" in knobs else {}


def check_knobs_evaluated(args, ev: EvalConfig, knobs: dict[str, dict]) -> None:
    """A knob this command was given for a mode it does not evaluate would change nothing, without a word
    (e.g. `--modes ar --knob mdm.steps=4`): a ConfigError naming the knob as given and the modes evaluated.
    (An `eval` section itself may hold knobs for modes it does not run: a sweep's runs share one.)"""
    from_set = cli.set_overrides(args)
    for mode, fields in knobs.items():
        if mode == "*" or mode in ev.modes:
            continue
        for field, value in fields.items():
            key = f"eval.knobs.{mode}.{field}"
            name = key if key in from_set else f"--knob {mode}.{field}"
            raise ConfigError(f"{name}={value!r}: mode {mode!r} is not evaluated (the modes are "
                              f"{','.join(ev.modes)}); add it to --modes or drop the knob")


def slot_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--slot-sizes {text!r}: expected comma-separated integers ≥ 1, e.g. 2,4,8")
    return sizes


def _run(args) -> int:
    ev, shared = eval_config(args)
    sizes = slot_sizes(args.slot_sizes)
    ckpt = ev.ckpt
    if not ckpt:
        raise ConfigError("no checkpoint to evaluate: pass --ckpt CKPT_DIR (or --set eval.ckpt=CKPT_DIR)")
    lora_modes = [m for m in ev.modes if m in ADAPTER_MODES]
    if lora_modes and not args.lora:
        raise ValueError(f"mode {lora_modes[0]!r} needs --lora ADAPTER_DIR")
    draft_modes = [m for m in ev.modes if m in DRAFT_MODEL_MODES]
    if draft_modes and not args.draft_ckpt:
        raise ValueError(f"mode {draft_modes[0]!r} needs --draft-ckpt DRAFT_CKPT_DIR")
    if not os.path.isdir(ckpt):
        raise ValueError(f"{'--ckpt' if ckpt == args.ckpt else 'eval.ckpt'} {ckpt!r} is not a directory")
    knobs = {**ev.knobs.as_dict(), **shared}
    check_knobs_evaluated(args, ev, knobs)
    check_mode_knobs(ev.modes, knobs)
    check_mask_token({m: generation_config(m, ev.max_new_tokens, knobs) for m in ev.modes}, load_config(ckpt), ckpt)
    fmt = prompt_format(ckpt, format_overrides(args))
    records = read_jsonl(args.data, fmt)  # `evaluate` decodes the first `ev.limit` of them
    settings = identity.settings(ev, knobs, ckpt=ckpt, data=args.data, prompt_format=fmt, lora=args.lora,
                                 draft_ckpt=args.draft_ckpt, tokenizer=args.tokenizer,
                                 diagnose=sizes if args.diagnose else None)
    record = identity.record(settings)
    out = args.out or identity.default_out(ckpt, args.data, ev.modes, record["id"])
    check_output(out, {"--ckpt": ckpt, "--data": args.data, "--lora": args.lora, "--tokenizer": args.tokenizer,
                       "--draft-ckpt": args.draft_ckpt}, "--out", writes=OUTPUTS)
    if not args.force and _kept(out, record):
        return 0
    check_writable_dir(out, "--out")  # now, not after the decoding
    model = load_for_inference(ckpt, tokenizer=args.tokenizer, adapter=args.lora,
                               draft=args.draft_ckpt if draft_modes else None,
                               verify=not args.no_verify, format_overrides=format_overrides(args),
                               mesh=cli.decode_mesh())
    summary, predictions = evaluate(model, records, ev, knobs=knobs)
    diag = diagnose.analyse(model, records, summary, predictions, sizes) if args.diagnose else None
    extra = {"ckpt": os.path.abspath(ckpt), "data": os.path.abspath(args.data), "arguments": vars(args),
             "evaluation": record, "prompt_format": overrides.to_dict(model.prompt_format),
             "provenance": provenance()}
    if diag is not None:
        extra["diagnostics"] = diag
    markdown = summary_markdown(summary) + ("\n## Diagnostics\n\n" + diagnose.markdown(diag) if diag else "")
    write_outputs(out, summary, predictions, extra, markdown)
    print(markdown)
    print(f"wrote {out}/summary.json, summary.md, predictions.jsonl")
    return 0


def _kept(out: str, record: dict) -> bool:
    """True (after printing its summary and `kept OUT`) when `out` already holds this very evaluation;
    False when it holds none; an OutputPathError naming `--force` and `--out` when it holds another."""
    held, why = identity.recorded(out, OUTPUTS)
    if held is None:
        return False
    if held.get("id") == record["id"]:
        with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
            print(f.read())
        print(f"kept {out}: it holds this same evaluation (pass --force to compute it again)")
        return True
    diff = identity.differences(held["settings"], record["settings"]) if held else []
    why = why or "it differs in " + ", ".join(diff[:6]) + (", …" if len(diff) > 6 else "")
    raise OutputPathError(f"--out {out!r} holds another evaluation ({why}): pass --force to replace it, or "
                          "another --out (without --out each evaluation writes a directory of its own)")


if __name__ == "__main__":
    cli.main(main)
