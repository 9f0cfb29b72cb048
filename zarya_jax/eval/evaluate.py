"""Evaluate any checkpoint on any JSONL set in any decoding mode.

    python -m experiments.evaluate --ckpt CKPT --data test.jsonl --modes ar,mdm,slotted,spec-self \\
        [--lora ADAPTER --modes spec-lora] [--answer final|regex|exact] [--answer-regex PAT] \\
        [--max-new-tokens 64] [--batch-size 1] [--knob slotted.slot_size=4] [--out DIR]

Records are `{"prompt", "answer"}` (or chat `{"messages": [...]}` ending with the assistant answer).
Modes: `ar` (autoregressive baseline), `mdm` (mode A, SPEC §5), `slotted` (mode B, SPEC §6),
`spec-self` (lossless Zarya self-speculation, SPEC §7), `spec-lora` (Uno's LoRA drafter, needs
`--lora`). Per mode it reports exact-match accuracy, wall-clock generated tokens/s (compile time
excluded and reported apart), tokens per forward pass and the speed-up over `ar`; it writes
`summary.json`, `summary.md` and `predictions.jsonl` (one line per example and mode) to `--out`
(default `<ckpt>_eval`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np

from . import answers
from .tasks import read_jsonl

MODES = ("ar", "mdm", "slotted", "spec-self", "spec-lora")
MODE_LABELS = {"ar": "AR", "mdm": "mode A (MDM)", "slotted": "mode B (slotted)",
               "spec-self": "spec, self drafter", "spec-lora": "spec, LoRA drafter"}
# Base GenerationConfig fields per evaluation mode; knobs are layered on top.
MODE_FIELDS = {"ar": {"mode": "ar"}, "mdm": {"mode": "mdm"}, "slotted": {"mode": "slotted"},
               "spec-self": {"mode": "spec", "drafter": "self"}, "spec-lora": {"mode": "spec", "drafter": "lora"}}


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"--modes {text!r}: unknown mode(s) {bad}; expected a comma-separated subset of {MODES}")
    return modes


def _coerce(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def parse_knobs(items: list[str]) -> dict[str, dict]:
    """`["slotted.slot_size=4", "temperature=0"]` -> {"slotted": {"slot_size": 4}, "*": {"temperature": 0}}."""
    knobs: dict[str, dict] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--knob {item!r}: expected [MODE.]FIELD=VALUE, e.g. slotted.slot_size=4")
        key, value = item.split("=", 1)
        mode, _, field = key.rpartition(".")
        mode = mode or "*"
        if mode != "*" and mode not in MODES:
            raise ValueError(f"--knob {item!r}: unknown mode {mode!r}; expected one of {MODES}")
        knobs.setdefault(mode, {})[field] = _coerce(value)
    return knobs


def generation_config(mode: str, max_new_tokens: int, knobs: dict[str, dict] | None = None):
    """The `GenerationConfig` of an evaluation mode with `knobs` ("*" for all modes) applied."""
    from zarya_jax.sampling import GenerationConfig

    fields = {f.name for f in dataclasses.fields(GenerationConfig)}
    kwargs = dict(MODE_FIELDS[mode], max_new_tokens=max_new_tokens, temperature=0.0)
    knobs = knobs or {}
    for scope in ("*", mode):
        for k, v in knobs.get(scope, {}).items():
            if k not in fields:
                raise ValueError(f"knob {scope}.{k}: GenerationConfig has no field {k!r}; fields: {sorted(fields)}")
            kwargs[k] = v
    return GenerationConfig(**kwargs)


def prompt_and_answer(record: dict, tokenizer) -> tuple[str, str]:
    if "messages" in record:
        return tokenizer.apply_chat_template(record["messages"])
    return record["prompt"], record["answer"]


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


def evaluate_mode(params, config, tokenizer, prompts: list[list[int]], gen_config, key, batch_size: int,
                  lora_params=None, lora=None, progress=None) -> dict:
    """Generates for all prompts in batches of `batch_size`; returns texts, lengths, passes and timings.

    The first batch is run once untimed (compilation); the timed pass covers every batch.
    """
    import jax

    from zarya_jax.sampling import generate

    def call(batch, k):
        kwargs = {} if lora_params is None else {"lora_params": lora_params, "lora": lora}
        out = generate(params, config, batch, gen_config, k, **kwargs)
        jax.block_until_ready(out.tokens)
        return out

    starts = list(range(0, len(prompts), batch_size))
    # Keys are made before the clock starts: the first fold_in compiles, which is not decoding time.
    keys = [jax.random.fold_in(key, i) for i in starts]
    t0 = time.perf_counter()
    call(_pad_batch(prompts[:batch_size], batch_size), keys[0])
    compile_s = time.perf_counter() - t0
    texts, lengths, passes = [], [], []
    t0 = time.perf_counter()
    for i, k in zip(starts, keys):
        chunk = prompts[i:i + batch_size]
        out = call(_pad_batch(chunk, batch_size), k)
        tokens = np.asarray(out.tokens)
        n = len(chunk)
        lens = np.asarray(out.lengths)[:n]
        for row in range(n):
            texts.append(tokenizer.decode(tokens[row, : int(lens[row])]))
        lengths += [int(x) for x in lens]
        fp = _stat(out, "num_forward_passes", n)
        passes += [int(x) for x in fp] if fp is not None else [0] * n
        if progress:
            progress(min(i + batch_size, len(prompts)), len(prompts))
    wall = time.perf_counter() - t0
    total_tokens = int(sum(lengths))
    # A batched pass advances every row, so a batch's passes count once: tokens per forward is the
    # number of generated tokens per row divided by that row's passes, averaged over rows.
    tpf = [l / p for l, p in zip(lengths, passes) if p > 0]
    return {"texts": texts, "lengths": lengths, "forward_passes": passes, "wall_s": wall, "compile_s": compile_s,
            "tokens": total_tokens, "tokens_per_s": total_tokens / wall if wall > 0 else float("nan"),
            "tokens_per_forward": float(np.mean(tpf)) if tpf else float("nan")}


def evaluate(params, config, tokenizer, records: list[dict], modes: list[str], *, max_new_tokens: int = 64,
             batch_size: int = 1, knobs: dict | None = None, method: str = "final", pattern: str | None = None,
             lora_params=None, lora=None, seed: int = 0, progress: bool = True) -> tuple[list[dict], list[dict]]:
    """Runs every mode on every record. Returns (summary rows, per-example prediction rows)."""
    import jax

    if "spec-lora" in modes and lora_params is None:
        raise ValueError("mode 'spec-lora' needs a LoRA drafter adapter (--lora DIR)")
    if batch_size < 1:
        raise ValueError(f"batch size {batch_size}: expected ≥ 1")
    pairs = [prompt_and_answer(r, tokenizer) for r in records]
    prompts = [tokenizer.encode(p) for p, _ in pairs]
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise ValueError(f"records {empty[:5]} have empty prompts")
    golds = [answers.reference(a, method, pattern) for _, a in pairs]
    summary, predictions = [], []
    key = jax.random.PRNGKey(seed)
    for mode in modes:
        gen = generation_config(mode, max_new_tokens, knobs)
        bar = _progress_bar(mode, len(prompts)) if progress else None
        res = evaluate_mode(params, config, tokenizer, prompts, gen, key, batch_size,
                            lora_params if mode == "spec-lora" else None, lora,
                            progress=(lambda done, total: bar(done)) if bar else None)
        if bar:
            bar(None)
        correct = 0
        for i, text in enumerate(res["texts"]):
            pred = answers.extract(text, method, pattern)
            ok = pred is not None and pred == golds[i]
            correct += ok
            predictions.append({"index": i, "mode": mode, "prompt": pairs[i][0], "reference": pairs[i][1],
                                "output": text, "prediction": pred, "gold": golds[i], "correct": bool(ok),
                                "num_tokens": res["lengths"][i], "forward_passes": res["forward_passes"][i]})
        summary.append({"mode": mode, "label": MODE_LABELS[mode], "examples": len(prompts),
                        "accuracy": correct / len(prompts), "tokens_per_forward": res["tokens_per_forward"],
                        "tokens_per_s": res["tokens_per_s"], "generated_tokens": res["tokens"],
                        "wall_s": res["wall_s"], "compile_s": res["compile_s"], "batch_size": batch_size,
                        "generation_config": dataclasses.asdict(gen)})
    ar = next((r for r in summary if r["mode"] == "ar"), None)
    for r in summary:
        r["speedup_vs_ar"] = r["tokens_per_s"] / ar["tokens_per_s"] if ar and ar["tokens_per_s"] > 0 else None
    return summary, predictions


def _progress_bar(mode: str, total: int):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=f"eval {mode}", unit="ex", leave=False, file=sys.stderr)

    def update(done):
        if done is None:
            bar.close()
        else:
            bar.n = done
            bar.refresh()

    return update


def summary_markdown(summary: list[dict]) -> str:
    lines = ["| mode | exact match | tokens / forward | tokens / s | speed-up vs AR |", "|---|---|---|---|---|"]
    for r in summary:
        sp = f"{r['speedup_vs_ar']:.2f}×" if r.get("speedup_vs_ar") is not None else "–"
        lines.append(f"| {r['label']} | {100 * r['accuracy']:.1f}% | {r['tokens_per_forward']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {sp} |")
    return "\n".join(lines) + "\n"


def atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_outputs(out_dir: str, summary: list[dict], predictions: list[dict], extra: dict | None = None) -> None:
    atomic_write(os.path.join(out_dir, "predictions.jsonl"), "".join(json.dumps(p) + "\n" for p in predictions))
    atomic_write(os.path.join(out_dir, "summary.json"), json.dumps({"modes": summary, **(extra or {})}, indent=2))
    atomic_write(os.path.join(out_dir, "summary.md"), summary_markdown(summary))


def load_tokenizer_for(ckpt: str, spec: str | None):
    """--tokenizer if given; else a tokenizer saved inside the checkpoint directory; else bytes."""
    from zarya_jax.checkpoint import tokenizer_dir
    from zarya_jax.tokenizer import load_tokenizer

    if spec:
        return load_tokenizer(spec)
    return load_tokenizer(tokenizer_dir(ckpt) or "byte")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.evaluate", description=__doc__,
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
    p.add_argument("--out", default=None, help="output directory (default: <ckpt>_eval)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        modes = parse_modes(args.modes)
        knobs = parse_knobs(args.knob)
        if args.max_new_tokens <= 0:
            raise ValueError(f"--max-new-tokens={args.max_new_tokens}: expected > 0")
        if args.answer == "regex" and not args.answer_regex:
            raise ValueError("--answer regex needs --answer-regex PATTERN")
        if not os.path.exists(args.ckpt):
            raise ValueError(f"--ckpt {args.ckpt!r} does not exist")
        records = read_jsonl(args.data)
        if args.limit is not None:
            records = records[: args.limit]
        from zarya_jax import checkpoint

        params, config = checkpoint.load(args.ckpt)
        tokenizer = load_tokenizer_for(args.ckpt, args.tokenizer)
        lora_params = lora_cfg = None
        if args.lora:
            from zarya_jax import lora as lora_lib

            lora_params, lora_cfg = lora_lib.load(args.lora)
        elif "spec-lora" in modes:
            raise ValueError("mode 'spec-lora' needs --lora ADAPTER_DIR")
        summary, predictions = evaluate(params, config, tokenizer, records, modes,
                                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                        knobs=knobs, method=args.answer, pattern=args.answer_regex,
                                        lora_params=lora_params, lora=lora_cfg, seed=args.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or os.path.join(args.ckpt.rstrip("/") + "_eval")
    write_outputs(out, summary, predictions, {"ckpt": os.path.abspath(args.ckpt), "data": os.path.abspath(args.data)})
    print(summary_markdown(summary))
    print(f"wrote {out}/summary.json, summary.md, predictions.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
