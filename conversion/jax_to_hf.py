"""zarya_jax checkpoint → Hugging Face Qwen3 directory.

    python -m conversion.jax_to_hf --ckpt CKPT --out DIR [--dtype bfloat16] [--max-shard-size 2GB]

Writes `config.json` (with `mask_token_id`, `bos_token_id`, the Zarya hyperparameters under "zarya", and
`dtype`/`torch_dtype` naming the dtype of the weights written), `generation_config.json`, safetensors
weights in `--dtype` (default: the checkpoint's compute dtype, so a bfloat16 model exports bfloat16 even
when trained with float32 params), sharded with `model.safetensors.index.json` above the size limit, and
the checkpoint's tokenizer files with `<mdm_mask>` registered at `mask_token_id`. Params are restored
one at a time (`checkpoint.read_param`) and their tensors streamed to disk, so memory stays near the
largest stacked param plus the imports; a line on stderr every few seconds says how far it is. `--out`
may be new (parent directories are created) or an empty directory. The result loads with
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

from . import TOKENIZER_FILES, ConversionError, Progress, check_new_output, note, run_cli, staging_dir
from .mask_token import MASK_TOKEN, register_mask_token

_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'2GB' → 2·10⁹ bytes (KB/MB/GB decimal, KiB/MiB/GiB binary, as transformers reads them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", str(text).upper())
    if not m or float(m.group(1)) <= 0:
        raise ConversionError(f"--max-shard-size {text!r}: expected a positive size such as 2GB, 500MB or 20KB")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


class StreamedParams:
    """A checkpoint's params read one at a time: `shapes` {path: (shape, dtype)} from the metadata,
    `get(path)` restores that param (checked against its checksum unless verify=False) and keeps only it
    (tensors are written in table order, so each param is read once)."""

    def __init__(self, ckpt: str, verify: bool = True):
        self.ckpt = ckpt
        self.sums = checkpoint.checksums(ckpt) if verify else None  # each param is checked as it is read
        self.shapes = checkpoint.param_shapes(ckpt)
        self._path, self._array = None, None

    def get(self, path: tuple[str, ...]) -> np.ndarray:
        if path != self._path:
            self._path, self._array = None, None  # release the previous param before reading the next
            self._array, self._path = checkpoint.read_param(self.ckpt, path, self.sums), path
        return self._array


def plan_shards(config: ModelConfig, dtype: np.dtype, max_bytes: int) -> list[list[tuple]]:
    """Groups tensors (written in `dtype`) in order into shards of at most `max_bytes` (a bigger tensor gets
    its own)."""
    shards, current, size = [], [], 0
    for name, e, layer in hf_params.tensors(config):
        nbytes = math.prod(e.hf_shape) * dtype.itemsize
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, e, layer, nbytes))
        size += nbytes
    shards.append(current)
    return shards


def write_safetensors(path: str, params: StreamedParams, tensors: list[tuple], dtype: np.dtype,
                      progress: Progress | None = None) -> None:
    """Streams tensors into one safetensors file, each cast to `dtype`: header first (sizes are known), then
    each array's bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, e, layer, nbytes in tensors:
        header[name] = {"dtype": _ST_DTYPES[dtype.name], "shape": list(e.hf_shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format wants the data aligned to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, e, layer, nbytes in tensors:
            leaf = params.get(e.path)
            arr = hf_params.to_hf(e, leaf if layer is None else leaf[layer], name)
            np.ascontiguousarray(arr, dtype).tofile(f)  # round to nearest even, as torch's .to(dtype)
            if progress is not None:
                progress.advance(nbytes)


def generation_config(config: ModelConfig) -> dict:
    gen = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
           "pad_token_id": config.pad_token_id}
    return {k: v for k, v in gen.items() if v is not None}


def hf_config(config: ModelConfig, zarya, dtype: np.dtype) -> dict:
    """The exported `config.json`: the model's, with the dtype of the weights written under both spellings
    (transformers 5 reads `dtype`, 4 `torch_dtype`)."""
    return {**to_hf_dict(config, zarya), "dtype": dtype.name, "torch_dtype": dtype.name}


def export_dtype(params: StreamedParams, config: ModelConfig, dtype: str | None) -> np.dtype:
    """The dtype the weights are written in: `dtype`, default the checkpoint's compute dtype (`config.dtype`);
    a note on stderr when that rounds stored params (e.g. float32 params of a bfloat16 model)."""
    stored = {d.name for _, d in params.shapes.values()}
    if not stored <= set(_ST_DTYPES):
        raise ConversionError(f"checkpoint dtypes {sorted(stored)}: expected some of {sorted(_ST_DTYPES)}")
    out = np.dtype(dtype or config.dtype)
    lossy = sorted(d for d in stored if np.dtype(d).itemsize > out.itemsize or {d, out.name} == {"float16", "bfloat16"})
    if lossy:
        why = "" if dtype else ", the checkpoint's compute dtype"
        note(f"note: params stored as {', '.join(lossy)} are rounded to {out.name}{why}; pass --dtype "
             f"{max(lossy, key=lambda d: np.dtype(d).itemsize)} to keep them exact")
    return out


def export_tokenizer(ckpt: str, config: ModelConfig, out: str) -> None:
    """Copies the checkpoint's tokenizer (`checkpoint.tokenizer_dir`) into `out`, with `<mdm_mask>` registered
    at `mask_token_id` when the model has one; a note on stderr when there is no Hugging Face tokenizer."""
    tok = checkpoint.tokenizer_dir(ckpt)
    if tok is None or not any(os.path.isfile(os.path.join(tok, n)) for n in TOKENIZER_FILES):
        what = "no tokenizer" if tok is None else "no Hugging Face tokenizer (e.g. the byte one)"
        note(f"note: {ckpt!r} has {what}: the export has none; copy the tokenizer files the model was trained "
             "with into it")
        return
    shutil.copytree(tok, out, dirs_exist_ok=True)
    if config.mask_token_id is not None and register_mask_token(out, config.mask_token_id):
        note(f"tokenizer: {MASK_TOKEN} at id {config.mask_token_id}")


def export(ckpt: str, out: str, *, max_shard_size: int = 2 * 10**9, verify: bool = True,
           dtype: str | None = None) -> str:
    """Writes the HF directory `out` (new, or an empty directory) from the checkpoint `ckpt` (checked against
    its checksums unless `verify=False`), its weights in `dtype` (default: the checkpoint's compute dtype)."""
    if not os.path.isdir(ckpt):
        raise ConversionError(f"--ckpt {ckpt!r} is not a directory")
    out = check_new_output(out, {"--ckpt": ckpt}, empty_ok=True)
    try:
        params = StreamedParams(ckpt, verify)  # checks the side files first when verifying
        config = checkpoint.load_config(ckpt)
        zarya = checkpoint.load_zarya_config(ckpt)
    except CheckpointError:
        raise
    except ValueError as e:
        raise ConversionError(str(e)) from e
    out_dtype = export_dtype(params, config, dtype)
    shards = plan_shards(config, out_dtype, max_shard_size)
    tensors = [t for shard in shards for t in shard]
    progress = Progress("jax_to_hf", sum(t[3] for t in tensors), len(tensors))
    note(f"jax_to_hf: {config.num_params():,} params ({progress.total_bytes / 1e6:,.1f} MB of {out_dtype.name}) "
         f"from {ckpt} into {out}")
    with staging_dir(out) as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config(config, zarya, out_dtype), f, indent=2)
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(generation_config(config), f, indent=2)
        export_tokenizer(ckpt, config, tmp)
        if len(shards) == 1:
            write_safetensors(os.path.join(tmp, "model.safetensors"), params, shards[0], out_dtype, progress)
        else:
            weight_map, total = {}, 0
            for i, shard in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                write_safetensors(os.path.join(tmp, name), params, shard, out_dtype, progress)
                for tensor_name, _, _, nbytes in shard:
                    weight_map[tensor_name] = name
                    total += nbytes
            with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.jax_to_hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="zarya_jax checkpoint directory")
    parser.add_argument("--out", required=True,
                        help="Hugging Face directory to create (parents are created), or an empty directory")
    parser.add_argument("--dtype", choices=sorted(_ST_DTYPES), default=None,
                        help="dtype of the weights written (default: the checkpoint's compute dtype)")
    parser.add_argument("--max-shard-size", default="2GB",
                        help="split the weights into files of at most this size (default 2GB)")
    parser.add_argument("--no-verify", action="store_true", help="export without checking the checkpoint's checksums")

    def run(args_list):
        args = parser.parse_args(args_list)
        path = export(args.ckpt, args.out, max_shard_size=parse_size(args.max_shard_size), verify=not args.no_verify,
                      dtype=args.dtype)
        print(f"wrote {path}")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
