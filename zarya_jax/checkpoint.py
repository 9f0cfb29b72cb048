"""Model checkpoints: the params pytree on Orbax, the configs as JSON next to it.

Layout of a checkpoint directory:

    CKPT/params/       Orbax PyTree checkpoint (OCDBT) of the params pytree (see `zarya_jax/model.py`)
    CKPT/config.json   {"format": ..., "model": ModelConfig fields, "zarya": ZaryaConfig fields or null,
                        "prompt": PromptFormat fields (how the training data was rendered) or absent}
    CKPT/tokenizer/    optional tokenizer files (`zarya_jax.data.tokenizer.load_tokenizer` reads them)
    CKPT/checksums.json  a checksum of every param array and of every other file (`nn.integrity`)

Saving is atomic: everything is written into a hidden sibling directory that is renamed into place
only when complete, so a crash never leaves a half-written checkpoint under the final name. Loading
verifies every checksum (`verify=False` skips it): a damaged, truncated or incomplete checkpoint is one
`CheckpointError` naming its path, never a silent load of wrong weights or a TensorStore traceback.
Train state (optimizer, step, data iterator) is not stored here; this is the model only.

Memory: a converter never needs the whole model at once. A `Lazy` leaf is made only when Orbax writes
it and released before the next is made (`save`), and `read_param` restores one param as numpy
(`load` also restores one leaf at a time), so converting peaks near one stacked param plus the imports.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import future, type_handlers

from .config import ConfigError, ModelConfig, PromptFormat, ZaryaConfig, model_config_from_dict, to_dict
from .files import replace_directory
from .nn import hf_params
from .nn.integrity import CheckpointError, array_checksums, compare, describe_error, file_checksum

FORMAT = "zarya_jax.checkpoint/1"
CONFIG_FILE = "config.json"
PARAMS_DIR = "params"
TOKENIZER_DIR = "tokenizer"
CHECKSUMS_FILE = "checksums.json"


@dataclasses.dataclass(frozen=True)
class Lazy:
    """A param leaf computed when it is written: `make()` returns the numpy array of `shape` and `dtype`.

    `save` writes lazy leaves one after another, each made just before it is written and dropped
    after, so a converter holds one param at a time instead of the whole model."""

    shape: tuple[int, ...]
    dtype: Any
    make: Callable[[], np.ndarray]


class _LazyHandler(type_handlers.NumpyHandler):
    """Orbax's numpy writer for `Lazy` leaves, one leaf at a time (the stored format is the numpy one)."""

    def __init__(self):
        super().__init__(deepcopy_host_arrays=False)

    async def serialize(self, values, infos, args=None):
        args = args or [ocp.SaveArgs()] * len(values)
        return [future.CommitFutureAwaitingContractedSignals(self._write_in_turn(values, infos, args),
                                                             name="lazy_params")]

    async def _write_in_turn(self, values, infos, args):
        for value, info, arg in zip(values, infos, args):
            array = value.make()
            if array.shape != tuple(value.shape) or array.dtype != np.dtype(value.dtype):
                raise ValueError(f"lazy param {info.name}: made {array.shape} {array.dtype}, "
                                 f"declared {tuple(value.shape)} {np.dtype(value.dtype)}")
            await self._background_serialize([array], [info], [arg])  # written (committed) before the next


def _checkpointer() -> ocp.Checkpointer:
    """A synchronous PyTree checkpointer that writes numpy leaves without a defensive copy and `Lazy`
    leaves one at a time.

    The copy Orbax makes by default guards against callers mutating arrays during an async save;
    this save is synchronous, so the copy would only double peak memory (converters save numpy trees).
    """
    registry = type_handlers.create_type_handler_registry(
        (np.ndarray, type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
        (Lazy, _LazyHandler()),
        (jax.Array, type_handlers.get_type_handler(jax.Array)),
    )
    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(type_handler_registry=registry))


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def save(path: str | os.PathLike, params: Any, config: ModelConfig, zarya_config: ZaryaConfig | None = None,
         *, overwrite: bool = False, tokenizer: Any = None, prompt_format: PromptFormat | None = None) -> str:
    """Writes params (numpy or jax arrays, any sharding, or `Lazy` leaves) and configs to `path`; returns the
    absolute path.

    tokenizer: None, a directory whose files are copied, or an object with `.save(directory)`
    (`zarya_jax.data.tokenizer.ByteTokenizer` / `HFTokenizer`). prompt_format: how the model's training
    records were rendered (`zarya_jax.data.render`), for evaluation and generation to render alike.
    The recorded `param_dtype` is the arrays' dtype when they share one (float32 master weights saved with
    a bfloat16 config record float32). Raises FileExistsError if `path` exists and `overwrite` is false. Every process of a multi-host run
    must call it.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"checkpoint path {path!r} already exists (pass overwrite=True to replace it)")
    hf_params.check_params(params, config)
    config = _as_stored(params, config)
    if isinstance(tokenizer, (str, os.PathLike)) and not os.path.isdir(tokenizer):
        raise FileNotFoundError(f"tokenizer directory {os.fspath(tokenizer)!r} does not exist")
    parent, name = os.path.split(path)
    # A deterministic name so that every host of a multi-host save agrees on it.
    tmp = os.path.join(parent, f".{name}.tmp")
    primary = jax.process_index() == 0
    if primary:
        os.makedirs(parent, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # leftovers of a crashed save
        os.makedirs(tmp)
    _sync("zarya_checkpoint_tmp")
    try:
        # Checksums of what is written: eager leaves now, lazy ones as each is made (never all at once).
        arrays = array_checksums(jax.tree.map(lambda x: None if isinstance(x, Lazy) else x, params))
        params = _checksummed_lazy(params, arrays)
        # Orbax's default chunking: measured on a 151,937 × 128 float32 embedding, 4 MB chunks and 16 MB data
        # files made the write 37× slower (14 s vs 0.4 s) and grew the peak by 8 copies of the array, not one.
        _checkpointer().save(os.path.join(tmp, PARAMS_DIR), args=ocp.args.PyTreeSave(params))
        if primary:
            meta = {"format": FORMAT, "model": to_dict(config),
                    "zarya": None if zarya_config is None else to_dict(zarya_config)}
            if prompt_format is not None:
                meta["prompt"] = to_dict(prompt_format)
            with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
                json.dump(meta, f, indent=2, sort_keys=True)
            if tokenizer is not None:
                _write_tokenizer(tokenizer, os.path.join(tmp, TOKENIZER_DIR))
            with open(os.path.join(tmp, CHECKSUMS_FILE), "w") as f:
                json.dump({"arrays": arrays, "files": _side_files(tmp)}, f, indent=1, sort_keys=True)
            replace_directory(tmp, path)
        _sync("zarya_checkpoint_done")
    except BaseException:
        if primary:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _as_stored(params: Any, config: ModelConfig) -> ModelConfig:
    """`config` with `param_dtype` the dtype the arrays are stored in when they share one: a trainer saves
    its float32 master weights of a bfloat16 checkpoint, and config.json must say float32 (loaders and
    `jax_to_hf` read the dtype from it)."""
    names = {np.dtype(leaf.dtype).name for leaf in jax.tree.leaves(params)}
    if len(names) != 1 or names == {config.param_dtype}:
        return config
    try:
        return config.replace(param_dtype=names.pop())
    except ConfigError:  # a dtype a ModelConfig cannot name: the config stays as given
        return config


def _checksummed_lazy(params: Any, sums: dict) -> Any:
    """`params` with each `Lazy` leaf's `make` also recording the made array's checksum in `sums`."""
    def wrap(path, leaf):
        if not isinstance(leaf, Lazy):
            return leaf

        def make():
            array = leaf.make()
            sums[jax.tree_util.keystr(path)] = next(iter(array_checksums({"x": array}).values()))
            return array

        return dataclasses.replace(leaf, make=make)

    return jax.tree_util.tree_map_with_path(wrap, params)


def _write_tokenizer(tokenizer: Any, directory: str) -> None:
    if isinstance(tokenizer, (str, os.PathLike)):
        shutil.copytree(tokenizer, directory)
    else:
        tokenizer.save(directory)


def _side_files(path: str) -> dict[str, str]:
    """{relative path: crc32} of every file of a checkpoint outside params/ (configs, tokenizer)."""
    out = {}
    for root, dirs, names in os.walk(path):
        rel_root = os.path.relpath(root, path)
        if rel_root.split(os.sep)[0] == PARAMS_DIR:
            continue
        for name in names:
            rel = os.path.normpath(os.path.join(rel_root, name))
            if rel != CHECKSUMS_FILE:
                out[rel] = file_checksum(os.path.join(root, name))
    return out


def _read_checksums(path: str) -> dict:
    file = os.path.join(path, CHECKSUMS_FILE)
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint {path!r} has no {CHECKSUMS_FILE} (incomplete, or written before "
                              "checkpoints carried checksums): cannot verify it; pass --no-verify "
                              "(verify=False) to load it unverified")
    try:
        with open(file) as f:
            sums = json.load(f)
        if not isinstance(sums.get("arrays"), dict) or not isinstance(sums.get("files"), dict):
            raise ValueError("expected 'arrays' and 'files'")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path!r} is damaged: {file} is unreadable ({e})") from None
    return sums


def verify_files(path: str, sums: dict) -> None:
    """The side files (configs, tokenizer) against their recorded crc32s."""
    actual = _side_files(path)
    for rel, crc in sums["files"].items():
        if rel not in actual:
            raise CheckpointError(f"checkpoint {path!r} is damaged: {rel} is missing")
        if actual[rel] != crc:
            raise CheckpointError(f"checkpoint {path!r} is damaged: {rel} differs from the checksum written at save")


def _check_layout(path: str) -> None:
    if not os.path.isdir(os.path.join(path, PARAMS_DIR)) or not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise FileNotFoundError(
            f"{path!r} is not a zarya_jax checkpoint: expected {CONFIG_FILE} and {PARAMS_DIR}/ inside it")


def _read_meta(path: str) -> dict:
    _check_layout(path)
    file = os.path.join(path, CONFIG_FILE)
    try:
        with open(file) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"cannot read checkpoint config {file!r}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{file!r}: expected format {FORMAT!r}, found {meta.get('format') if isinstance(meta, dict) else meta!r}")
    return meta


def load_config(path: str | os.PathLike) -> ModelConfig:
    path = os.path.abspath(os.fspath(path))
    try:
        return model_config_from_dict(_read_meta(path)["model"])
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path!r}: {CONFIG_FILE} has no valid model config ({e})") from None


def load_zarya_config(path: str | os.PathLike) -> ZaryaConfig | None:
    """The Zarya hyperparameters stored with the checkpoint, or None if it has none."""
    zarya = _read_meta(os.path.abspath(os.fspath(path)))["zarya"]
    return None if zarya is None else ZaryaConfig(**zarya)


def load_prompt_format(path: str | os.PathLike) -> PromptFormat | None:
    """How the checkpoint's training records were rendered, or None if it does not say (e.g. a converted
    Hugging Face model: render with the default `PromptFormat()`)."""
    prompt = _read_meta(os.path.abspath(os.fspath(path))).get("prompt")
    try:
        return None if prompt is None else PromptFormat(**prompt)
    except TypeError as e:
        raise ValueError(f"checkpoint {os.fspath(path)!r}: bad prompt format {prompt!r}: {e}") from None


def tokenizer_dir(path: str | os.PathLike) -> str | None:
    """The checkpoint's tokenizer directory (for `load_tokenizer`), or None if it has none."""
    directory = os.path.join(os.path.abspath(os.fspath(path)), TOKENIZER_DIR)
    return directory if os.path.isdir(directory) else None


def load(path: str | os.PathLike, shardings: Any = None, *, mesh: jax.sharding.Mesh | None = None,
         verify: bool = True) -> tuple[dict, ModelConfig]:
    """Restores (params as jax arrays, ModelConfig).

    shardings: None (first local device), one `jax.sharding.Sharding` for every leaf, or a pytree of
    them shaped like the params; arrays are read straight into their shards. mesh (instead of
    shardings): each param's NamedSharding on `mesh` from the project's rules
    (`train.sharding.tree_shardings`), so a model larger than one device (or spanning hosts: each
    process reads only its shards) loads straight onto the mesh. verify: check every array and file
    against `checksums.json`. Raises `CheckpointError` (naming `path`) for a damaged, truncated or
    unverifiable checkpoint.
    """
    if mesh is not None and shardings is not None:
        raise ValueError("checkpoint.load: give shardings or mesh, not both")
    path = os.path.abspath(os.fspath(path))
    sums = checksums(path) if verify else None
    config = load_config(path)
    ckptr = _checkpointer()
    params_dir = os.path.join(path, PARAMS_DIR)
    stored = _stored(ckptr, params_dir, config, path)
    if mesh is not None:
        shardings = mesh_shardings(stored, mesh)
    if shardings is None:
        shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, stored)
    try:
        target = jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), stored, shardings)
    except ValueError as e:
        raise ValueError(f"shardings do not match the params tree of {path!r}: {e}") from e
    # One leaf per restore: TensorStore's read buffers then hold one param at a time, not the model.
    params: dict = {}
    for leaf_path, leaf in hf_params.leaves(target):
        arg = ocp.checkpoint_utils.construct_restore_args({"x": leaf})["x"]
        try:
            value = _restore_leaf(ckptr, params_dir, leaf_path, leaf, arg)
        except Exception as e:  # a truncated or corrupt data file fails somewhere inside TensorStore
            raise CheckpointError(f"checkpoint {path!r} is damaged: cannot read param {'/'.join(leaf_path)} "
                                  f"({describe_error(e)})") from None
        hf_params.set_path(params, leaf_path, value)
    if sums is not None:
        compare(sums["arrays"], array_checksums(params), repr(path))
    return params, config


def mesh_shardings(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings on `mesh` for a params-like tree (arrays, ShapeDtypeStructs or Orbax metadata: leaves
    with `.shape`), by the rules the trainer shards the same params with."""
    from .train.sharding import tree_shardings  # imported here: the trainer imports this module

    return tree_shardings(jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree), mesh)


def _stored(ckptr: ocp.Checkpointer, params_dir: str, config: ModelConfig, path: str) -> dict:
    """The stored params' metadata tree (leaves with `.shape`, `.dtype`), checked against the config."""
    try:
        stored = ckptr.metadata(params_dir).item_metadata.tree
    except Exception as e:  # Orbax/TensorStore raise many types for unreadable metadata
        raise CheckpointError(f"checkpoint {path!r} is damaged: cannot read {params_dir} "
                              f"({describe_error(e)})") from None
    hf_params.check_params(stored, config)
    return stored


def _restore_leaf(ckptr: ocp.Checkpointer, params_dir: str, leaf_path: tuple[str, ...], leaf, arg):
    item: dict = {}
    hf_params.set_path(item, leaf_path, leaf)
    restore_args: dict = {}
    hf_params.set_path(restore_args, leaf_path, arg)
    restored = ckptr.restore(params_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True))
    return hf_params.get_path(restored, leaf_path)


def param_shapes(path: str | os.PathLike) -> dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]]:
    """{param path: (shape, dtype)} of a checkpoint, read from its metadata (no array is loaded)."""
    path = os.path.abspath(os.fspath(path))
    stored = _stored(_checkpointer(), os.path.join(path, PARAMS_DIR), load_config(path), path)
    return {p: (tuple(m.shape), np.dtype(m.dtype)) for p, m in hf_params.leaves(stored)}


def checksums(path: str | os.PathLike) -> dict:
    """The checkpoint's recorded checksums, after checking its side files against them (for readers that
    stream params one at a time with `read_param(..., sums=)`). Raises `CheckpointError`."""
    path = os.path.abspath(os.fspath(path))
    _check_layout(path)
    sums = _read_checksums(path)
    verify_files(path, sums)
    return sums


def read_param(path: str | os.PathLike, leaf_path: tuple[str, ...], sums: dict | None = None) -> np.ndarray:
    """One param of a checkpoint as a host numpy array (e.g. `("layers", "q_proj", "kernel")`), read alone:
    memory holds that param only (the converters stream a checkpoint this way). With `sums` (from
    `checksums`) the array is checked against the checksum written at save."""
    path = os.path.abspath(os.fspath(path))
    params_dir = os.path.join(path, PARAMS_DIR)
    try:
        arr = _restore_leaf(_checkpointer(), params_dir, tuple(leaf_path), 0, ocp.RestoreArgs(restore_type=np.ndarray))
    except Exception as e:  # a truncated or corrupt data file fails somewhere inside TensorStore
        raise CheckpointError(f"checkpoint {path!r} is damaged: cannot read param {'/'.join(leaf_path)} "
                              f"({describe_error(e)})") from None
    if sums is not None:
        item: dict = {}
        hf_params.set_path(item, tuple(leaf_path), arr)
        got = array_checksums(item)
        compare({k: sums["arrays"][k] for k in got if k in sums["arrays"]}, got, repr(path))
    return arr
