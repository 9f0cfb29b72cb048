"""Peak memory of `conversion.hf_to_jax` relative to the checkpoint size.

    python -m conversion.memcheck --size-gb 1 [--dtype bfloat16] [--workdir DIR]

Writes a random Qwen3 checkpoint of about that size as sharded safetensors (numpy only, no torch
model), converts it in a subprocess, and prints the child's peak RSS (`ru_maxrss`) divided by the
size of the weights; then the same for converting the result back with `conversion.jax_to_hf`. A baseline child that only imports the converter is measured first, so the
import cost (jax, orbax) can be told apart from the conversion's own memory.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import safetensors.numpy

from zarya_jax.config import ModelConfig, to_hf_dict
from zarya_jax.files import check_output, check_writable_dir
from zarya_jax.nn import hf_params

from . import ConversionError, run_cli


def config_of_size(size_bytes: float, itemsize: int) -> ModelConfig:
    """A Qwen3-0.6B-like shape (hidden 1024, vocab 32768) with as many layers as fill the size."""
    base = ModelConfig(vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_layers=1, num_heads=16,
                       num_kv_heads=8, head_dim=128, tie_word_embeddings=True)
    embed = base.vocab_size * base.hidden_size + base.hidden_size
    per_layer = base.num_params() - embed
    layers = max(1, round((size_bytes / itemsize - embed) / per_layer))
    return base.replace(num_layers=layers)


def write_random_checkpoint(directory: str, config: ModelConfig, dtype: str, shard_bytes: int = 256 << 20) -> int:
    """Random weights in HF names and layout, sharded safetensors + index; returns the weights' bytes."""
    os.makedirs(directory)
    rng = np.random.default_rng(0)
    np_dtype = np.dtype(dtype)
    shards, current, size, total = [], {}, 0, 0

    def flush():
        name = f"model-{len(shards) + 1:05d}.safetensors"
        safetensors.numpy.save_file(current, os.path.join(directory, name), metadata={"format": "pt"})
        shards.append((name, list(current)))

    for name, e, _ in hf_params.tensors(config):
        arr = (rng.standard_normal(e.hf_shape, dtype=np.float32) * 0.02).astype(np_dtype)
        if current and size + arr.nbytes > shard_bytes:
            flush()
            current, size = {}, 0
        current[name] = arr
        size += arr.nbytes
        total += arr.nbytes
    flush()
    weight_map = {t: name for name, names in shards for t in names}
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    hf = to_hf_dict(config.replace(dtype=dtype, param_dtype=dtype))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f)
    return total


# Measured from a fresh, small interpreter: a child forked from this (large) process would report
# this process's RSS at fork time as its own peak.
_WRAPPER = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_bytes(cmd: list[str], env: dict) -> int:
    """Runs `cmd` in a subprocess and returns its peak RSS (`ru_maxrss` of RUSAGE_CHILDREN, KiB on Linux)."""
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], check=True, capture_output=True, text=True, env=env)
    return int(out.stdout.split()[-1]) * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.memcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="checkpoint size in GB (10^9 bytes)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir, removed)")
    args = parser.parse_args(argv)
    return run_cli(lambda _: _run(args), argv)


def _run(args) -> int:
    if not (args.size_gb > 0 and math.isfinite(args.size_gb)):
        raise ConversionError(f"--size-gb={args.size_gb}: expected a positive, finite size in GB")
    if args.workdir is not None:
        check_output(args.workdir, {}, "--workdir", writes=())
        check_writable_dir(args.workdir, "--workdir")
    work = tempfile.mkdtemp(prefix="zarya_memcheck.", dir=args.workdir)
    try:
        itemsize = np.dtype(args.dtype).itemsize
        config = config_of_size(args.size_gb * 1e9, itemsize)
        size = write_random_checkpoint(os.path.join(work, "hf"), config, args.dtype)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
        baseline = peak_rss_bytes([sys.executable, "-c", "import conversion.hf_to_jax"], env)
        peak = peak_rss_bytes([sys.executable, "-m", "conversion.hf_to_jax", "--hf-dir", os.path.join(work, "hf"),
                               "--out", os.path.join(work, "ckpt")], env)
        peak_back = peak_rss_bytes([sys.executable, "-m", "conversion.jax_to_hf", "--ckpt", os.path.join(work, "ckpt"),
                                    "--out", os.path.join(work, "hf_back")], env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"checkpoint: {config.num_layers} layers, {size / 1e9:.3f} GB of {args.dtype} weights")
    print(f"peak RSS of the converter: {peak / 1e9:.3f} GB (imports alone: {baseline / 1e9:.3f} GB)")
    print(f"peak / size = {peak / size:.2f}   (peak - imports) / size = {(peak - baseline) / size:.2f}")
    print(f"back to HF (jax_to_hf): peak {peak_back / 1e9:.3f} GB, peak / size = {peak_back / size:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
