"""Hugging Face Qwen3 directory → zarya_jax checkpoint.

    python -m conversion.hf_to_jax --hf-dir DIR --out CKPT [--add-mask-token] [--dtype bfloat16]
                                   [--allow-pickle]

Reads `config.json` and safetensors weights (single file or sharded with
`model.safetensors.index.json`) without torch, tensor by tensor, and streams them into the checkpoint:
each param is a `checkpoint.Lazy` leaf, allocated and filled layer by layer only when Orbax writes it
and released before the next, and each safetensors file is opened only for one read so its mapped
pages are released at once. Peak memory stays near the largest stacked param plus the imports.
`--add-mask-token` gives `<mdm_mask>` the first embedding row no token uses (Qwen3: 151669 of 151936, the
vocabulary unchanged) or, without one, appends a row (docs/algorithms.md §1). The directory's tokenizer
files travel with the checkpoint (`CKPT/tokenizer/`, `checkpoint.tokenizer_dir`), with `<mdm_mask>`
registered at the model's mask id; `bos_token_id`, `eos_token_id` and `pad_token_id` are kept in its
config. Index entries must name files inside the directory; integer tensors are refused (weights are
floating point), and a cast that loses precision (e.g. float32 tensors into a bfloat16 checkpoint) is
named on stderr, as is the progress, a line every few seconds. `--out` may be new (parent directories
are created) or an empty directory.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import tempfile

import numpy as np
from safetensors import safe_open

from zarya_jax import checkpoint
from zarya_jax.config import ModelConfig, from_hf_dict
from zarya_jax.nn import hf_params

from . import (TOKENIZER_FILES, ConversionError, Progress, check_new_output, copy_tokenizer_files, note, read_json,
               run_cli, taking_over_empty)
from .mask_token import MASK_TOKEN, register_mask_token, tokenizer_length, tokenizer_mask_id  # noqa: F401 (re-exported)
_PICKLE_FILES = ("pytorch_model.bin.index.json", "pytorch_model.bin")


class SafetensorsSource:
    """HF tensors by name from one or more safetensors files, read one at a time as numpy arrays."""

    def __init__(self, hf_dir: str):
        index = os.path.join(hf_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            weight_map = read_json(index, "safetensors index").get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConversionError(f"safetensors index {index!r} has no 'weight_map'")
            files = sorted(set(weight_map.values()))
            for name in files:  # a file name, nothing that leaves the model directory
                if (not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", "..")
                        or os.path.isabs(name)):
                    raise ConversionError(f"safetensors index {index!r} names {name!r}: expected a file name inside "
                                          f"{hf_dir!r}")
        else:
            files, weight_map = ["model.safetensors"], None
        self.files: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        for name in files:
            path = os.path.join(hf_dir, name)
            if not os.path.isfile(path):
                raise ConversionError(f"weights file {path!r} not found")
            with _open(path) as f:
                for key in f.keys():
                    self.files[key] = path
                    tensor = f.get_slice(key)
                    self.shapes[key] = tuple(tensor.get_shape())
                    self.dtypes[key] = _ST_DTYPES.get(tensor.get_dtype(), tensor.get_dtype().lower())
        if weight_map is not None:
            for key, name in weight_map.items():
                if self.files.get(key) != os.path.join(hf_dir, name):
                    raise ConversionError(f"tensor {key!r} is listed in {index!r} but not found in {name!r}")

    def get(self, name: str) -> np.ndarray:
        # A fresh open per tensor: closing unmaps the file, so touched pages do not pile up in RSS.
        with _open(self.files[name]) as f:
            return f.get_tensor(name)


# safetensors' dtype codes → NumPy names (the others keep their code, lower-cased, and are refused)
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# Casts into the checkpoint's param dtype that keep every value exactly.
_LOSSLESS = {("float16", "float32"), ("bfloat16", "float32"), ("float16", "float64"), ("bfloat16", "float64"),
             ("float32", "float64")}


def check_dtypes(dtypes: dict[str, str], param_dtype: str) -> None:
    """Refuses non-float tensors; names (stderr) the tensors a cast to `param_dtype` rounds."""
    bad = {n: d for n, d in dtypes.items() if d not in _ST_DTYPES.values()}
    if bad:
        name, dtype = next(iter(bad.items()))
        raise ConversionError(f"{len(bad)} tensor(s) are not floating point, e.g. {name!r} ({dtype}): "
                              "expected float weights (an integer or quantized checkpoint is not supported)")
    lossy = sorted({d for d in dtypes.values() if d != param_dtype and (d, param_dtype) not in _LOSSLESS})
    if lossy:
        count = sum(d in lossy for d in dtypes.values())
        note(f"note: {count} tensor(s) stored as {', '.join(lossy)} are rounded to {param_dtype}, the checkpoint's "
             f"param dtype (config.json or --dtype); pass --dtype {max(lossy, key=lambda d: _WIDTH[d])} to keep "
             "them exact")


_WIDTH = {"float64": 3, "float32": 2, "float16": 1, "bfloat16": 1}


def _open(path: str):
    try:
        return safe_open(path, framework="numpy")
    except Exception as e:  # safetensors raises several types for truncated / non-safetensors files
        raise ConversionError(f"cannot read safetensors file {path!r}: {e}") from e


class PickleSource:
    """`pytorch_model*.bin` files, loaded with `torch.load(weights_only=True)` (no arbitrary code)."""

    def __init__(self, hf_dir: str):
        import torch  # only this opt-in path needs torch

        index = os.path.join(hf_dir, "pytorch_model.bin.index.json")
        if os.path.exists(index):
            names = sorted(set(read_json(index, "pytorch index").get("weight_map", {}).values()))
        else:
            names = ["pytorch_model.bin"]
        self.tensors = {}
        for name in names:
            path = os.path.join(hf_dir, name)
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception as e:  # pickle, zip and weights-only refusals all mean "unreadable"
                raise ConversionError(f"cannot read pickled weights {path!r} (weights-only load): {e}") from e
            self.tensors.update(state)
        self.shapes = {k: tuple(v.shape) for k, v in self.tensors.items()}
        self.dtypes = {k: str(v.dtype).replace("torch.", "") for k, v in self.tensors.items()}

    def get(self, name: str) -> np.ndarray:
        import torch

        t = self.tensors[name].detach()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16; reinterpret the bits as ml_dtypes'
            return t.view(torch.int16).numpy().view(np.dtype("bfloat16"))
        return t.numpy()


def open_source(hf_dir: str, allow_pickle: bool):
    if os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")) or os.path.exists(
            os.path.join(hf_dir, "model.safetensors")):
        return SafetensorsSource(hf_dir)
    pickled = [n for n in _PICKLE_FILES if os.path.exists(os.path.join(hf_dir, n))]
    if pickled:
        if not allow_pickle:
            raise ConversionError(
                f"{hf_dir!r} has only pickled PyTorch weights ({pickled[0]}), which can run code when loaded; "
                "pass --allow-pickle to load them with torch.load(weights_only=True)")
        return PickleSource(hf_dir)
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(hf_dir, "*")))
    raise ConversionError(f"no weights in {hf_dir!r}: expected model.safetensors or model.safetensors.index.json "
                          f"(found {found[:8]})")


def check_tensors(shapes: dict[str, tuple[int, ...]], config: ModelConfig) -> None:
    """Every tensor the config implies is present with its shape, and nothing else is."""
    want = hf_params.hf_shapes(config)
    missing = [n for n in want if n not in shapes]
    if missing:
        raise ConversionError(f"{len(missing)} tensors missing from the checkpoint, e.g. {missing[:3]}")
    # Tied checkpoints sometimes store the head anyway; old ones store RoPE buffers.
    ignored = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = [n for n in shapes if n not in want and n not in ignored and not n.endswith("rotary_emb.inv_freq")]
    if unexpected:
        raise ConversionError(f"{len(unexpected)} tensors that a Qwen3 model with this config.json does not have, "
                              f"e.g. {unexpected[:3]}")
    for name, shape in want.items():
        if tuple(shapes[name]) != shape:
            raise hf_params.ShapeError(
                f"tensor {name!r} has shape {tuple(shapes[name])}, expected {shape} from config.json")


def read_param(source, config: ModelConfig, e: hf_params.Entry, extra_rows: int = 0,
               mask_row: tuple[int, int] | None = None) -> np.ndarray:
    """One param (`e`) as a numpy array in `config.param_dtype`, filled tensor by tensor from `source`.

    mask_row=(row, used): the mask token's embedding row `row` (and untied head column) is set to the
    mean of the `used` rows that tokens own (docs/algorithms.md §1); extra_rows=1 appends that row first
    (`row` = config.vocab_size).
    """
    dtype = np.dtype(config.jnp_param_dtype)
    v = config.vocab_size
    arr = np.empty(_shape(config, e, extra_rows), dtype)
    if e.layered:
        for i in range(config.num_layers):
            hf_params.fill(e, source.get(e.hf_name(i)), arr[i], e.hf_name(i))
    elif e.path == ("embed",):
        hf_params.fill(e, source.get(e.hf), arr[:v])
        if mask_row is not None:
            arr[mask_row[0]] = arr[:mask_row[1]].mean(axis=0, dtype=np.float64)
    elif e.path == ("lm_head",):
        hf_params.fill(e, source.get(e.hf), arr[:, :v])
        if mask_row is not None:
            arr[:, mask_row[0]] = arr[:, :mask_row[1]].mean(axis=1, dtype=np.float64)
    else:
        hf_params.fill(e, source.get(e.hf), arr)
    return arr


def _shape(config: ModelConfig, e: hf_params.Entry, extra_rows: int) -> tuple[int, ...]:
    shape = hf_params.stacked_shape(e, config)
    if e.path == ("embed",):
        return (shape[0] + extra_rows,) + shape[1:]
    if e.path == ("lm_head",):
        return shape[:1] + (shape[1] + extra_rows,)
    return shape


def lazy_params(source, config: ModelConfig, extra_rows: int = 0, mask_row: tuple[int, int] | None = None,
                label: str | None = None) -> dict:
    """The params pytree of `checkpoint.Lazy` leaves: each param is read from `source` when it is saved
    (and, with `label`, counted in a `Progress` line on stderr)."""
    dtype = np.dtype(config.jnp_param_dtype)
    shapes = {e.path: _shape(config, e, extra_rows) for e in hf_params.entries(config)}
    progress = None if label is None else Progress(
        label, sum(math.prod(shape) for shape in shapes.values()) * dtype.itemsize, len(shapes), unit="params")

    def make(e: hf_params.Entry) -> np.ndarray:
        arr = read_param(source, config, e, extra_rows, mask_row)
        if progress is not None:
            progress.advance(arr.nbytes)
        return arr

    params: dict = {}
    for e in hf_params.entries(config):
        hf_params.set_path(params, e.path, checkpoint.Lazy(shapes[e.path], dtype, lambda e=e: make(e)))
    return params


def params_bytes(params: dict) -> int:
    """Bytes of a pytree of `checkpoint.Lazy` leaves."""
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for _, leaf in hf_params.leaves(params))


def choose_mask_row(vocab_size: int, tokens: int | None) -> tuple[int, int]:
    """(the mask token's id, how many rows are appended for it) for an embedding of `vocab_size` rows
    and a tokenizer of `tokens` ids: the first unused row (`tokens`) if the embedding has one, so the
    vocabulary keeps its size (Qwen3's 151936 = 2^7·1187 divides the usual tensor-parallel axes; one
    more row, 151937, is prime and would divide none); otherwise a new row at `vocab_size`."""
    if tokens is not None and tokens < vocab_size:
        return tokens, 0
    return vocab_size, 1


def convert(hf_dir: str, out: str, *, add_mask_token: bool = False, dtype: str | None = None,
            allow_pickle: bool = False) -> tuple[str, ModelConfig]:
    """Converts an HF Qwen3 directory into a checkpoint at `out` (new, or an empty directory)."""
    if not os.path.isdir(hf_dir):
        raise ConversionError(f"--hf-dir {hf_dir!r} is not a directory")
    out = check_new_output(out, {"--hf-dir": hf_dir}, empty_ok=True)
    hf = read_json(os.path.join(hf_dir, "config.json"), "model config")
    try:
        config, zarya = from_hf_dict(hf)
    except (KeyError, TypeError) as e:
        raise ConversionError(f"{os.path.join(hf_dir, 'config.json')!r} lacks or mistypes field {e}") from e
    if dtype is not None:
        config = config.replace(dtype=dtype, param_dtype=dtype)
    source = open_source(hf_dir, allow_pickle)
    check_tensors(source.shapes, config)
    check_dtypes({k: d for k, d in source.dtypes.items() if k in hf_params.hf_shapes(config)}, config.param_dtype)

    extra_rows, mask = 0, None
    if add_mask_token:
        existing = tokenizer_mask_id(hf_dir)
        if config.mask_token_id is not None:
            note(f"config.json already has mask_token_id={config.mask_token_id}; no row added")
        elif existing is not None and existing < config.vocab_size:
            note(f"the tokenizer already has {MASK_TOKEN} at id {existing}; no row added")
            config = config.replace(mask_token_id=existing)
        else:
            used = tokenizer_length(hf_dir)
            mask_id, extra_rows = choose_mask_row(config.vocab_size, used)
            mask = (mask_id, config.vocab_size if used is None else min(used, config.vocab_size))
            if extra_rows:
                why = "no tokenizer.json says which rows are unused" if used is None else "every row has a token"
                note(f"{MASK_TOKEN}: {why}; appending row {mask_id} (vocabulary {config.vocab_size + 1}, which a "
                     "tensor-parallel mesh axis may not divide)")
    params = lazy_params(source, config, extra_rows, mask, label="hf_to_jax")  # the source's vocabulary, + extra_rows
    if mask is not None:
        config = config.replace(vocab_size=config.vocab_size + extra_rows, mask_token_id=mask[0])
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = tmp if copy_tokenizer_files(hf_dir, tmp) else None
        if tokenizer is None:
            note(f"note: {hf_dir!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, …): the checkpoint "
                 "carries no tokenizer, so training and evaluating it need one named (data.tokenizer=DIR, --tokenizer)")
        elif config.mask_token_id is not None:
            register_mask_token(tmp, config.mask_token_id)
        note(f"hf_to_jax: {config.num_params():,} params ({params_bytes(params) / 1e6:,.1f} MB of "
             f"{config.param_dtype}) from {hf_dir} into {out}")
        with taking_over_empty(out):
            checkpoint.save(out, params, config, zarya, tokenizer=tokenizer)
    return out, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.hf_to_jax", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-dir", required=True, help="Hugging Face Qwen3 model directory")
    parser.add_argument("--out", required=True,
                        help="checkpoint directory to create (parents are created), or an empty directory")
    parser.add_argument("--add-mask-token", action="store_true",
                        help="give <mdm_mask> the first embedding row no token uses (else append one), set to "
                             "the mean of the tokens' rows, unless the model has a mask token")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="param and compute dtype (default: the dtype in config.json)")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="accept pytorch_model.bin files (loaded with torch.load(weights_only=True))")

    def run(args_list):
        args = parser.parse_args(args_list)
        path, config = convert(args.hf_dir, args.out, add_mask_token=args.add_mask_token, dtype=args.dtype,
                               allow_pickle=args.allow_pickle)
        print(f"wrote {path}: {config.num_params():,} params, {config.param_dtype}, vocab {config.vocab_size}, "
              f"mask_token_id {config.mask_token_id}")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
