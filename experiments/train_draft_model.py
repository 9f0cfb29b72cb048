"""Train an independent draft model for speculative sampling with a frozen base checkpoint
(docs/algorithms.md §7.6): `GenerationConfig(mode="spec", drafter="model")`, `evaluate --mode spec-model`.

    python -m experiments.train_draft_model --base CKPT --workdir DIR [--config PRESET_OR_FILE]
        [--params-ratio R [--lora-rank 16] | --params N] [--set key=value ...] [--force]

e.g. --set draft.loss=tv|ntp --set draft.ce_weight=0.1 --set model.hidden_size=96
--set model.intermediate_size=288 --set model.num_layers=1 --set data.train=FILE.jsonl --set train.steps=300
--set optim.lr=2e-3.

The draft model reads the base's ids: its vocabulary, special ids, positions, RoPE and norms are the
base checkpoint's; only its size is its own: `model.hidden_size`, `intermediate_size`, `num_layers`,
`num_heads`, `num_kv_heads`, `head_dim`, `tie_word_embeddings` (from `--config`, default `tiny`, and
`--set`), or a parameter budget: `--params N`, or `--params-ratio R` times the parameters of a
gated-LoRA adapter of rank `--lora-rank` on the base (the largest model of the base's shape family
within it, every parameter counted, a tied embedding once; `--set model.*` still wins). `draft.loss`:
`tv` (default; distilled from the frozen base: Σ|q − p| on the answer tokens, + `draft.ce_weight` ×
next-token cross-entropy, + `draft.kl_weight` × KL(q ‖ p)) or `ntp` (plain next-token loss on the data,
the AR trainer). Run machinery as `experiments.train` (checkpoints every `train.save_every`, exact
resume, metrics.jsonl). The data are rendered with the base checkpoint's recorded prompt format unless
the run sets its own, and read with its tokenizer (CKPT/tokenizer/; another one, named with
--set data.tokenizer=..., must have as many tokens, or --set train.allow_tokenizer_mismatch=true); when
CKPT is RUN/final, data.batch_size, data.max_length and optim.grad_accum_steps default to the base run's
(RUN/run_config.json); one line says what was taken, --set overrides it. Output: DIR/final (a
checkpoint: `zarya_jax.checkpoint.load`, `experiments.evaluate --mode spec-model --draft-ckpt DIR/final`)
and DIR/draft_model.json.
Exit status: 0 done, 2 bad input, 3 diverged, 128 + signal when interrupted.
"""
from __future__ import annotations

import argparse
import json

from zarya_jax import overrides
from zarya_jax.config import LoraConfig
from zarya_jax import checkpoint as ckpt_lib
from zarya_jax.train import config as rc
from zarya_jax.train import draft_model as draft_run
from zarya_jax.train import inherit

from . import cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.train_draft_model", description=__doc__,
                                epilog=overrides.help_table(rc.knobs(draft_run.DraftModelRunConfig)),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="frozen base checkpoint directory (zarya_jax.checkpoint)")
    p.add_argument("--workdir", required=True, help="run directory: checkpoints, metrics, final/")
    p.add_argument("--config", default="tiny", help="run config preset or YAML/JSON file (its model section: the size)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--params", type=int, help="size the draft model to at most N parameters")
    size.add_argument("--params-ratio", type=float, help="size it to R × a rank --lora-rank adapter's parameters")
    p.add_argument("--lora-rank", type=int, default=16, help="the adapter rank --params-ratio refers to (16)")
    cli.add_run_flags(p)
    return p


def main(argv=None) -> int:
    args = cli.parse_args(parser(), argv)
    return cli.run(lambda: _run(args))


def size_overrides(base: str, params: int | None, ratio: float | None, rank: int) -> dict:
    """model.* overrides of the sized draft model (empty without a budget)."""
    if params is None and ratio is None:
        return {}
    base_config = ckpt_lib.load_config(base)
    if ratio is not None:
        if not ratio > 0:
            raise ValueError(f"--params-ratio {ratio}: expected a ratio > 0")
        params = int(ratio * draft_run.lora_budget(base_config, LoraConfig(rank=rank)))
    sized = draft_run.sized_to(base_config, params)
    return {f"model.{f}": getattr(sized, f) for f in draft_run.SIZE_FIELDS}


def _run(args) -> int:
    cli.check_workdir(args.workdir, {"--base": args.base})
    sizes = size_overrides(args.base, args.params, args.params_ratio, args.lora_rank)
    sets = overrides.parse_all(cli.run_overrides(args))
    inherited, note = inherit.from_base(args.base, sets, inherit.BASE_RUN_KEYS)
    cfg = draft_run.load_config(args.config, {**inherited, **sizes, **sets})
    if note:
        print(note, flush=True)
    cli.check_workdir(args.workdir, {"--base": args.base, "data.train": cfg.data.train, "data.eval": cfg.data.eval})
    with cli.training_lock(args.workdir, "experiments.train_draft_model", cfg.train.distributed):
        summary = draft_run.train_draft_model(cfg, args.base, args.workdir, force=args.force)
    print(json.dumps(summary, indent=2, default=str))
    return cli.run_status(summary)


if __name__ == "__main__":
    cli.main(main)
