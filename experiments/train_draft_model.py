"""Train an independent draft model for speculative sampling with a frozen base checkpoint
(docs/algorithms.md §7.6): `GenerationConfig(mode="spec", drafter="model")`, `evaluate --mode spec-model`.

    python -m experiments.train_draft_model --base CKPT --workdir DIR [--config PRESET_OR_FILE]
        [--params-ratio R [--lora-rank 16] | --params N] [--set key=value ...] [--force]

e.g. --set draft_model.objective.loss=tv|ntp --set draft_model.objective.ce_weight=0.1
--set draft_model.hidden_size=96 --set draft_model.intermediate_size=288 --set draft_model.num_layers=1
--set draft_model.num_heads=3 --set draft_model.num_kv_heads=1 --set data.train=FILE.jsonl
--set draft_model.steps=300 --set draft_model.optim.lr=2e-3.

The draft model reads the base's ids: its vocabulary, special ids, positions, RoPE and norms are the
base checkpoint's; only its size is its own: explicit (`draft_model.hidden_size`, `intermediate_size`,
`num_layers`, `num_heads`, `num_kv_heads`; the base's head_dim, tied embeddings), or a parameter budget:
`--params N`, or `draft_model.params_ratio` (`--params-ratio R`, default 1) times the parameters of a
gated-LoRA adapter of rank `--lora-rank` on the base (the largest model of the base's shape family
within it, every parameter counted, a tied embedding once). The keys are the quickstart's and the
sweeps' (`draft_model.*`, the same section): `draft_model.steps`, `draft_model.batch_size` and
`draft_model.optim.*` (AdamW at 3e-3, cosine, no weight decay) are the run's steps, batch and optimizer;
`draft_model.objective.loss`: `tv` (default; distilled from the frozen base: Σ|q − p| on the answer
tokens, + `draft_model.objective.ce_weight` (1) × next-token cross-entropy, + `kl_weight` × KL(q ‖ p)) or
`ntp` (plain next-token loss on the data, the AR trainer). A former key (draft.loss, model.hidden_size,
optim.lr, train.steps, data.batch_size) is an error naming its new one. The run config (`--config`,
default `tiny`) supplies data, mesh and train settings and the model's runtime fields. Run machinery as
`experiments.train` (checkpoints every `train.save_every`, exact resume, metrics.jsonl). The data are
rendered with the base checkpoint's recorded prompt format unless the run sets its own, and read with its
tokenizer (CKPT/tokenizer/; another one, named with --set data.tokenizer=..., must have as many tokens,
or --set train.allow_tokenizer_mismatch=true); when CKPT is RUN/final, the batch
(draft_model.batch_size), data.max_length and the gradient accumulation (draft_model.optim.grad_accum_steps)
default to the base run's (RUN/run_config.json); one line says what was taken, --set overrides it.
Output: DIR/final (a checkpoint: `zarya_jax.checkpoint.load`, `experiments.evaluate --mode spec-model
--draft-ckpt DIR/final`) and DIR/draft_model.json.
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
    p.add_argument("--config", default="tiny",
                   help="run config preset or YAML/JSON file (model runtime, data, mesh, train)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--params", type=int, help="size the draft model to at most N parameters")
    size.add_argument("--params-ratio", type=float,
                      help="size it to R × a rank --lora-rank adapter's parameters (draft_model.params_ratio)")
    p.add_argument("--lora-rank", type=int, default=16, help="the adapter rank --params-ratio refers to (16)")
    cli.add_run_flags(p)
    return p


def main(argv=None) -> int:
    args = cli.parse_args(parser(), argv)
    return cli.run(lambda: _run(args))


def size_overrides(base: str, params: int | None, ratio: float | None) -> dict:
    """The `draft_model.*` size keys of the flags: `--params N`, the explicit size of the draft model sized to
    N parameters; `--params-ratio R`, `draft_model.params_ratio` (empty without either)."""
    if ratio is not None:
        return {"draft_model.params_ratio": ratio}
    if params is None:
        return {}
    sized = draft_run.sized_to(ckpt_lib.load_config(base), params)
    return {f"draft_model.{f}": getattr(sized, f) for f in draft_run.EXPLICIT_SIZE}


def _run(args) -> int:
    cli.check_workdir(args.workdir, {"--base": args.base})
    sizes = size_overrides(args.base, args.params, args.params_ratio)
    sets = overrides.parse_all(cli.run_overrides(args))
    inherited, note = inherit.from_base(args.base, sets, draft_run.DraftModelRunConfig.base_keys(inherit.BASE_RUN_KEYS))
    cfg = draft_run.load_config(args.config, {**inherited, **sizes, **sets})
    if note:
        print(note, flush=True)
    cli.check_workdir(args.workdir, {"--base": args.base, "data.train": cfg.data.train, "data.eval": cfg.data.eval})
    with cli.training_lock(args.workdir, "experiments.train_draft_model", cfg.train.distributed):
        summary = draft_run.train_draft_model(cfg, args.base, args.workdir, lora=LoraConfig(rank=args.lora_rank),
                                              force=args.force)
    print(json.dumps(summary, indent=2, default=str))
    return cli.run_status(summary)


if __name__ == "__main__":
    cli.main(main)
