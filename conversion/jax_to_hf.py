"""zarya_jax checkpoint → Hugging Face Qwen3 directory.

    python -m conversion.jax_to_hf --ckpt CKPT --out DIR [--max-shard-size 2GB]

Writes `config.json` (with `mask_token_id` and the Zarya hyperparameters under "zarya"),
`generation_config.json`, safetensors weights (sharded with `model.safetensors.index.json` above
the size limit) and the checkpoint's tokenizer files. Params are restored one at a time
(`checkpoint.read_param`) and their tensors streamed to disk, so memory stays near the largest stacked
param plus the imports. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` as `Qwen3ForCausalLM`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct

import numpy as np

from zarya_jax import checkpoint
from zarya_jax.config import ModelConfig, to_hf_dict
from zarya_jax.nn import hf_params
from zarya_jax.nn.integrity import CheckpointError

from . import ConversionError, check_new_output, run_cli, staging_dir

_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'2GB' → 2·10⁹ bytes (KB/MB/GB decimal, KiB/MiB/GiB binary, as transformers reads them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", str(text).upper())
    if not m or float(m.group(1)) <= 0:
        raise ConversionError(f"--max-shard-size {text!r}: expected a positive size such as 2GB, 500MB or 20KB")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


class StreamedParams:
    """A checkpoint's params read one at a time: `dtype(path)` from the metadata, `get(path)` restores that
    param (checked against its checksum unless verify=False) and keeps only it (tensors are written in
    table order, so each param is read once)."""

    def __init__(self, ckpt: str, verify: bool = True):
        self.ckpt = ckpt
        self.sums = checkpoint.checksums(ckpt) if verify else None  # each param is checked as it is read
        self.shapes = checkpoint.param_shapes(ckpt)
        self._path, self._array = None, None

    def dtype(self, path: tuple[str, ...]) -> np.dtype:
        return self.shapes[path][1]

    def get(self, path: tuple[str, ...]) -> np.ndarray:
        if path != self._path:
            self._path, self._array = None, None  # release the previous param before reading the next
            self._array, self._path = checkpoint.read_param(self.ckpt, path, self.sums), path
        return self._array


def plan_shards(params: StreamedParams, config: ModelConfig, max_bytes: int) -> list[list[tuple]]:
    """Groups tensors in order into shards of at most `max_bytes` (a bigger tensor gets its own)."""
    shards, current, size = [], [], 0
    for name, e, layer in hf_params.tensors(config):
        nbytes = math.prod(e.hf_shape) * params.dtype(e.path).itemsize
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, e, layer, nbytes))
        size += nbytes
    shards.append(current)
    return shards


def write_safetensors(path: str, params: StreamedParams, tensors: list[tuple]) -> None:
    """Streams tensors into one safetensors file: header first (sizes are known), then each array's bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, e, layer, nbytes in tensors:
        dtype = params.dtype(e.path).name
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(e.hf_shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format wants the data aligned to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, e, layer, nbytes in tensors:
            leaf = params.get(e.path)
            arr = hf_params.to_hf(e, leaf if layer is None else leaf[layer], name)
            arr.tofile(f)


def generation_config(config: ModelConfig) -> dict:
    gen = {"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}
    return {k: v for k, v in gen.items() if v is not None}


def export(ckpt: str, out: str, *, max_shard_size: int = 2 * 10**9, verify: bool = True) -> str:
    """Writes the HF directory `out` (which must not exist) from the checkpoint `ckpt` (checked against
    its checksums unless `verify=False`)."""
    if not os.path.isdir(ckpt):
        raise ConversionError(f"--ckpt {ckpt!r} is not a directory")
    out = check_new_output(out, {"--ckpt": ckpt})
    try:
        params = StreamedParams(ckpt, verify)  # checks the side files first when verifying
        config = checkpoint.load_config(ckpt)
        zarya = checkpoint.load_zarya_config(ckpt)
    except CheckpointError:
        raise
    except ValueError as e:
        raise ConversionError(str(e)) from e
    dtypes = {dtype.name for _, dtype in params.shapes.values()}
    if not dtypes <= set(_ST_DTYPES):
        raise ConversionError(f"checkpoint dtypes {sorted(dtypes)}: expected some of {sorted(_ST_DTYPES)}")
    shards = plan_shards(params, config, max_shard_size)
    with staging_dir(out) as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(to_hf_dict(config, zarya), f, indent=2)
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(generation_config(config), f, indent=2)
        tok = checkpoint.tokenizer_dir(ckpt)
        if tok is not None:
            shutil.copytree(tok, tmp, dirs_exist_ok=True)
        if len(shards) == 1:
            write_safetensors(os.path.join(tmp, "model.safetensors"), params, shards[0])
        else:
            weight_map, total = {}, 0
            for i, shard in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                write_safetensors(os.path.join(tmp, name), params, shard)
                for tensor_name, _, _, nbytes in shard:
                    weight_map[tensor_name] = name
                    total += nbytes
            with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.jax_to_hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="zarya_jax checkpoint directory")
    parser.add_argument("--out", required=True, help="Hugging Face directory to create (must not exist)")
    parser.add_argument("--max-shard-size", default="2GB",
                        help="split the weights into files of at most this size (default 2GB)")
    parser.add_argument("--no-verify", action="store_true", help="export without checking the checkpoint's checksums")

    def run(args_list):
        args = parser.parse_args(args_list)
        path = export(args.ckpt, args.out, max_shard_size=parse_size(args.max_shard_size), verify=not args.no_verify)
        print(f"wrote {path}")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
