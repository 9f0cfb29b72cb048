"""Generate text from a checkpoint in any mode (SPEC §4–§7).

    python -m experiments.generate --ckpt CKPT --prompt "Hello" [--prompt "…"] --mode slotted
    python -m experiments.generate --ckpt CKPT --prompts-file prompts.txt --mode ar --batch-size 8

Prompts: `--prompt` (repeatable) or `--prompts-file` (one prompt per line; `.jsonl` files hold
objects with a "prompt" field). Tokenizer: the checkpoint's own (CKPT/tokenizer/) if present, else
`--tokenizer DIR`, else the byte tokenizer. Prompts run in batches of `--batch-size`; the text of
each row is printed as soon as its batch finishes. `--output F.jsonl` also writes one record per
prompt (written to a temporary file, renamed when complete). Bad input exits with status 2 and a
message on stderr, before anything is generated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

MODES = ("ar", "mdm", "slotted", "spec")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="a prompt (repeat for several)")
    src.add_argument("--prompts-file", help="text file, one prompt per line (or .jsonl with a 'prompt' field)")
    p.add_argument("--ckpt", required=True, help="checkpoint directory (zarya_jax.checkpoint.save)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or 'byte' (when the checkpoint has none)")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="sampler; default routes by --slotted-generation (mode B if set, else mode A)")
    p.add_argument("--slotted-generation", action="store_true", help="route to mode B when --mode is not given")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--steps", type=int, default=0, help="mode A: T (0 → ⌈M/4⌉ steps of ≤ 4 tokens)")
    p.add_argument("--alpha0", type=float, default=0.25, help="mode A: diffusion share of the budget")
    p.add_argument("--slot-size", type=int, default=8, help="mode B")
    p.add_argument("--serial-num-blocks", type=int, default=2, help="mode B")
    p.add_argument("--slot-threshold", type=float, default=0.9, help="mode B τs (> 1: one slot per plan)")
    p.add_argument("--token-threshold", type=float, default=0.9, help="mode B τt")
    p.add_argument("--draft-length", type=int, default=8, help="mode spec: F")
    p.add_argument("--drafter", choices=("lora", "self"), default="lora", help="mode spec")
    p.add_argument("--lora", default=None, help="mode spec with --drafter lora: LoRA adapter directory")
    p.add_argument("--eos-token-id", type=int, default=None, help="default: the model's")
    p.add_argument("--no-stop-at-eos", action="store_true", help="always generate --max-new-tokens")
    p.add_argument("--prompt-bucket", type=int, default=16, help="pad prompt lengths to a multiple of this")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="also write JSONL records here")
    return p


def read_prompts(args) -> list[str]:
    if args.prompt is not None:
        prompts = list(args.prompt)
    else:
        if not os.path.isfile(args.prompts_file):
            raise ValueError(f"--prompts-file {args.prompts_file!r} does not exist")
        prompts = []
        with open(args.prompts_file, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if args.prompts_file.endswith(".jsonl"):
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{args.prompts_file}:{n}: not valid JSON ({e})") from None
                    if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                        raise ValueError(f"{args.prompts_file}:{n}: expected an object with a string 'prompt'")
                    line = rec["prompt"]
                prompts.append(line)
    if not prompts:
        raise ValueError("no prompts given: expected at least one non-empty prompt")
    for i, text in enumerate(prompts):
        if text == "":
            raise ValueError(f"prompt {i} is empty")
    return prompts


def load_model(args):
    from zarya_jax import checkpoint

    if not os.path.isdir(args.ckpt):
        raise ValueError(f"--ckpt {args.ckpt!r} is not a directory")
    try:
        params, config = checkpoint.load(args.ckpt)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    tok_spec = checkpoint.tokenizer_dir(args.ckpt) or args.tokenizer
    from zarya_jax.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(tok_spec)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load tokenizer {tok_spec!r}: {e}") from None
    return params, config, tokenizer


def generation_config(args):
    from zarya_jax.sampling import GenerationConfig

    return GenerationConfig(
        mode=args.mode, slotted_generation=args.slotted_generation, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, steps=args.steps, alpha0=args.alpha0, slot_size=args.slot_size,
        serial_num_blocks=args.serial_num_blocks, slot_threshold=args.slot_threshold,
        token_threshold=args.token_threshold, draft_length=args.draft_length, drafter=args.drafter,
        eos_token_id=args.eos_token_id, prompt_bucket=args.prompt_bucket, stop_at_eos=not args.no_stop_at_eos)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.batch_size < 1:
            raise ValueError(f"--batch-size={args.batch_size}: expected ≥ 1")
        texts = read_prompts(args)
        gc = generation_config(args)
        gc.validate()
        params, config, tokenizer = load_model(args)
        prompts = [tokenizer.encode(t) for t in texts]
        gc.validate(config, prompts)
        lora_kwargs = {}
        if gc.resolved_mode == "spec" and gc.drafter == "lora":
            if args.lora is None:
                raise ValueError("--mode spec with --drafter lora needs --lora DIR (the drafter adapter)")
            from zarya_jax import lora as lora_lib

            lora_params, lora_cfg = lora_lib.load(args.lora)
            lora_kwargs = dict(lora_params=lora_params, lora=lora_cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import jax

    from zarya_jax.sampling import generate

    key = jax.random.PRNGKey(args.seed)
    records = []
    for start in range(0, len(prompts), args.batch_size):
        chunk = prompts[start:start + args.batch_size]
        n = len(chunk)
        # A short last batch is filled with copies so every batch reuses one compiled program.
        padded = chunk + [chunk[0]] * (args.batch_size - n) if len(prompts) > args.batch_size else chunk
        t0 = time.perf_counter()
        out = generate(params, config, padded, gc, jax.random.fold_in(key, start), **lora_kwargs)
        wall = time.perf_counter() - t0
        for r in range(n):
            length = int(out.lengths[r])
            text = tokenizer.decode(out.tokens[r, :length].tolist())
            rec = {"index": start + r, "prompt": texts[start + r], "text": text, "tokens": length,
                   "forward_passes": int(out.num_forward_passes[r]),
                   "tokens_per_forward": float(out.tokens_per_forward[r])}
            records.append(rec)
            print(f"=== [{start + r}] ({length} tokens, {rec['forward_passes']} passes)", flush=True)
            print(texts[start + r] + text, flush=True)
        print(f"# batch {start // args.batch_size}: {wall:.2f} s, mode {out.stats['mode']}", file=sys.stderr)
    if args.output:
        directory = os.path.dirname(os.path.abspath(args.output))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-generate-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
