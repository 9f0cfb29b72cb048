"""Generate text from a checkpoint in any mode (docs/algorithms.md §4–§7).

    python -m experiments.generate --ckpt CKPT --prompt "Hello" [--prompt "…"] --mode slotted
    python -m experiments.generate --ckpt CKPT --prompts-file prompts.txt --mode ar --batch-size 8 \\
        --set temperature=0.7 --set top_p=0.9
    python -m experiments.generate --ckpt CKPT --prompt "Hi" --mode spec-lora --lora LORA_DIR --set draft_length=4
    python -m experiments.generate --ckpt CKPT --prompt "Hi" --mode auto --speed RUN/eval/speed.json --lora LORA_DIR

Prompts: `--prompt` (repeatable) or `--prompts-file` (one prompt per line; `.jsonl` files hold
objects with a "prompt" field, or the field named by `--prompt-key`). Each prompt is rendered as the
checkpoint's training prompts were (its recorded prompt format: chat template, system message, prompt
template; `zarya_jax.data.render`; `--format FIELD=VALUE` changes a field). Tokenizer
(`zarya_jax.inference.load_for_inference`): `--tokenizer` if given, else the checkpoint's own
(CKPT/tokenizer/), else the byte tokenizer. `--mode` is one of the eight decoding modes (`ar`, `mdm`,
`slotted`, `spec-self`, `spec-lora`, `spec-model`, `spec-self-fused`, `spec-lora-fused`; default `ar`,
lossless), or `auto`: the fastest lossless configuration an experiment chose for the batch size
(`--speed RUN/eval/speed.json`, `zarya_jax.eval.speed`: the choice at the calibrated batch size nearest
to `--batch-size`, or to the number of `--prompt`s when fewer; which it picked is printed);
`--set FIELD=VALUE` sets a field of that mode's dataclass or a shared sampling field (YAML values, typed
from the field; list below); `--max-new-tokens` is a shorthand for one of them. Prompts run in batches
of `--batch-size`; each row is printed as soon as its batch finishes: a `=== [i] prompt` line, the
prompt, a `--- completion (N tokens, P passes)` line, the completion.
`--output F.jsonl` also writes one record per prompt, with the prompt's token ids as rendered (written
to a temporary file, renamed when complete). A LoRA drafter (`--lora DIR`) is sampled with the noise
convention it was trained with; a draft model (`--mode spec-model --draft-ckpt DIR`) must read the
checkpoint's ids. A field the chosen mode does not have (e.g. `--mode ar --set slot_size=4`) is an
error that names its fields, the checkpoint is verified against its checksums (`--no-verify` skips
that) and `--output` is checked writable up front. Bad input exits with status 2 and one `error:` line
on stderr, before anything is generated.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax

from zarya_jax import overrides
from zarya_jax.data.records import jsonl_lines
from zarya_jax.data.render import render_prompt
from zarya_jax.eval.evaluate import ADAPTER_MODES, DRAFT_MODEL_MODES, MODES, SHARED_TYPES
from zarya_jax.eval.evaluate import generation_config as mode_config
from zarya_jax.eval.speed import SpeedChoice
from zarya_jax.files import atomic_write_jsonl, check_output, check_writable_file, input_file_problem
from zarya_jax.inference import load_for_inference
from zarya_jax.sampling import GenerationConfig, generate
from zarya_jax.sampling import modes as modes_lib

from . import cli
from .evaluate import add_format_arguments, format_overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.generate", description=__doc__, epilog=knobs_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    src.add_argument("--prompts-file", help="text file, one prompt per line (or .jsonl with a 'prompt' field)")
    p.add_argument("--ckpt", required=True, help="checkpoint directory (zarya_jax.checkpoint.save)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or 'byte' (default: the checkpoint's)")
    # The default is lossless (AR's own outputs) and reads no mask token, so it decodes any checkpoint.
    p.add_argument("--mode", choices=MODES + ("auto",), default="ar",
                   help="decoding mode (default: ar, lossless); auto: the fastest lossless one for the batch (--speed)")
    p.add_argument("--speed", default=None, help="mode auto: an experiment's eval/speed.json")
    p.add_argument("--max-new-tokens", type=int, default=64, help="the `max_new_tokens` knob")
    cli.add_set_flag(p, "temperature=0.7")
    p.add_argument("--lora", default=None, help="modes spec-lora, spec-lora-fused: LoRA adapter directory")
    p.add_argument("--draft-ckpt", default=None, help="mode spec-model: draft model checkpoint directory")
    p.add_argument("--batch-size", type=int, default=8,
                   help="prompts decoded together, in one compiled program (default 8)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed of the decode (default 0): sampling at temperature > 0, mdm's random order")
    p.add_argument("--output", default=None, help="also write JSONL records here")
    add_format_arguments(p)
    p.add_argument("--no-verify", action="store_true",
                   help="load the checkpoint (and --lora adapter) without checking their checksums")
    return p


def read_prompts(args, prompt_key: str = "prompt") -> list[str]:
    if args.prompt is not None:
        prompts = list(args.prompt)
    else:
        path = args.prompts_file
        why = input_file_problem(path)
        if why:
            raise ValueError(f"--prompts-file {path!r} {why}")
        prompts = []
        if path.endswith(".jsonl"):
            for n, rec in jsonl_lines(path):
                if isinstance(rec, ValueError) or not isinstance(rec, dict) or not isinstance(rec.get(prompt_key), str):
                    why = rec if isinstance(rec, ValueError) else (f"expected an object with a string {prompt_key!r} "
                                                                   "(--prompt-key names another field)")
                    raise ValueError(f"{path}:{n}: {why}")
                prompts.append(rec[prompt_key])
        else:
            with open(path, "rb") as f:
                for n, raw in enumerate(f, 1):
                    try:  # a UTF-8 byte-order mark (some editors write one) is not part of the first prompt
                        line = raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\n")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"{path}:{n}: not UTF-8 text (byte {e.start})") from None
                    if line.strip():
                        prompts.append(line)
    if not prompts:
        raise ValueError("no prompts given: expected at least one non-empty prompt")
    for i, text in enumerate(prompts):
        if text == "":
            raise ValueError(f"prompt {i} is empty")
    return prompts


def knobs_help() -> str:
    """The `--set` listing: the shared sampling fields, then each mode's own."""
    shared = [row for row in overrides.keys(GenerationConfig) if row[0] in SHARED_TYPES]
    parts = [overrides.help_table(shared).replace("knobs (", "shared knobs, every mode (", 1)]
    parts += [overrides.help_table(overrides.keys(cls)).replace("knobs (", f"--mode {name} knobs (", 1)
              for name, cls in modes_lib.MODES.items() if dataclasses.fields(cls)]
    return "\n\n".join(parts)


def generation_config(args) -> GenerationConfig:
    """`--mode` and `--max-new-tokens`, then the `--set FIELD=VALUE` knobs: fields of the mode or shared
    ones, typed from the field; a field the mode does not have is an error naming its fields."""
    chosen = getattr(args, "auto_knobs", {})  # `--mode auto`: the speed table's knobs, under `--set`
    return mode_config(args.mode, args.max_new_tokens, {args.mode: {**chosen, **cli.set_overrides(args)}})


def resolve_auto(args) -> argparse.Namespace:
    """`--mode auto`: `args` with the mode and knobs the speed table chose at the calibrated batch size
    nearest to the batch this run decodes (its knobs first, `--set` on top); other modes: `args`."""
    if args.mode != "auto":
        if args.speed is not None:
            raise ValueError(f"--speed is read by --mode auto only, not --mode {args.mode}")
        return args
    if args.speed is None:
        raise ValueError("--mode auto needs --speed FILE (an experiment's eval/speed.json)")
    batch = min(args.batch_size, len(args.prompt)) if args.prompt is not None else args.batch_size
    mode, choice = SpeedChoice.load(args.speed).mode_for(batch)
    knobs = {f.name: getattr(mode, f.name) for f in dataclasses.fields(mode)}
    print(f"# auto: {mode.name} {mode.short()} for batch {batch} (chosen at batch {choice.batch}"
          + (f", {choice.test_speedup:.2f}× AR's tokens/s on test" if choice.test_speedup else "") + ")",
          file=sys.stderr)
    return argparse.Namespace(**{**vars(args), "mode": mode.name, "auto_knobs": knobs})


def main(argv=None) -> int:
    args = cli.parse_args(build_parser(), argv)
    return cli.run(lambda: _run(args))


def _run(args) -> int:
    if args.batch_size < 1:
        raise ValueError(f"--batch-size={args.batch_size}: expected ≥ 1")
    if not os.path.isdir(args.ckpt):
        raise ValueError(f"--ckpt {args.ckpt!r} is not a directory")
    args = resolve_auto(args)
    gc = generation_config(args)
    gc.validate()
    with_lora = args.mode in ADAPTER_MODES
    if with_lora and args.lora is None:
        raise ValueError(f"--mode {args.mode} needs --lora DIR (the drafter adapter)")
    with_draft = args.mode in DRAFT_MODEL_MODES
    if with_draft and args.draft_ckpt is None:
        raise ValueError(f"--mode {args.mode} needs --draft-ckpt DIR (the draft model checkpoint)")
    if args.output:
        check_output(args.output, {"--ckpt": args.ckpt, "--prompts-file": args.prompts_file, "--lora": args.lora,
                                   "--draft-ckpt": args.draft_ckpt,
                                   "--tokenizer": args.tokenizer}, "--output")
        check_writable_file(args.output, "--output")
    model = load_for_inference(args.ckpt, tokenizer=args.tokenizer, adapter=args.lora if with_lora else None,
                               draft=args.draft_ckpt if with_draft else None,
                               verify=not args.no_verify, format_overrides=format_overrides(args),
                               mesh=cli.decode_mesh())
    params, config, tokenizer, fmt = model.params, model.config, model.tokenizer, model.prompt_format
    texts = read_prompts(args, fmt.prompt_key)
    prompts = [tokenizer.encode(render_prompt(t, tokenizer, fmt)) for t in texts]
    gc.validate(config, prompts)
    drafter_kwargs = {**model.lora_kwargs, **model.draft_kwargs}
    key = jax.random.PRNGKey(args.seed)
    records = []
    for start in range(0, len(prompts), args.batch_size):
        chunk = prompts[start:start + args.batch_size]
        n = len(chunk)
        # A short last batch is filled with copies so every batch reuses one compiled program.
        padded = chunk + [chunk[0]] * (args.batch_size - n) if len(prompts) > args.batch_size else chunk
        t0 = time.perf_counter()
        out = generate(params, config, padded, gc, jax.random.fold_in(key, start), **drafter_kwargs)
        wall = time.perf_counter() - t0
        for r in range(n):
            length = int(out.lengths[r])
            text = tokenizer.decode(out.tokens[r, :length].tolist())
            rec = {"index": start + r, "prompt": texts[start + r], "prompt_ids": prompts[start + r], "text": text,
                   "tokens": length,
                   "forward_passes": int(out.num_forward_passes[r]),
                   "tokens_per_forward": float(out.tokens_per_forward[r])}
            records.append(rec)
            # Labelled apart: the completion continues the prompt's text, and glued on it reads as one.
            print(f"=== [{start + r}] prompt\n{texts[start + r]}\n"
                  f"--- completion ({length} tokens, {rec['forward_passes']} passes)\n{text}", flush=True)
        print(f"# batch {start // args.batch_size}: {wall:.2f} s, mode {out.stats['mode']}", file=sys.stderr)
    if args.output:
        atomic_write_jsonl(args.output, records)
    return 0


if __name__ == "__main__":
    cli.main(main)
