"""Orbax checkpointing of a training run: train state + grain iterator state + a small JSON record.

Layout: WORKDIR/checkpoints/<step>/{state, data, meta}. Kept: the latest `keep` checkpoints plus the
`keep_best` ones with the lowest eval loss (only checkpoints saved at an eval step carry one). Saves
are asynchronous when enabled (the state arrays are copied, then written in the background); the
grain iterator state is captured synchronously at save time. Directories appear under their final
name only once complete (Orbax writes to a temporary name, then renames), so a killed run resumes
from the last complete checkpoint.

Another mesh: a checkpoint restores onto any mesh, device count or host count (Orbax reads each array
into the shardings it is asked for; the data iterator's state is the same on every host, `DataHandler`),
so a run preempted on one slice continues on another with the same global batch.

Integrity (`nn.integrity`): the meta record of every checkpoint holds a checksum of each array of the
state, computed from the live state when the save starts, and of the data iterator's state. A restore
first checks the saved shapes against the state it is asked to fill (a config that changes them is
refused in one line, before anything is read), then, unless `verify=False`, recomputes every checksum
on what was read. Damage is one `CheckpointError` naming the checkpoint directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from ..nn.integrity import CheckpointError, array_checksums, compare, describe_error, json_checksum


class DataHandler(grain.checkpoint.CheckpointHandler):
    """grain's iterator handler (one `process_<i>-of-<n>.json` per host) that also restores a checkpoint
    written by another number of hosts.

    The training pipeline's iterator state is the same on every host whatever their number
    (`data.pipeline.make_dataset`: host p of P takes its rows of each global batch, so the state counts
    global batches), so a host with no file of its own takes the saved one, after checking that every
    saved host's state is the same (a pipeline with per-host positions would be refused, not misread)."""

    def restore(self, directory, item=None, args=None):
        item = item or args.item
        if (directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json").exists():
            return super().restore(directory, item=item)
        state = shared_data_state(directory)
        item.set_state(json.loads(state) if isinstance(item, grain.DatasetIterator) else state.encode())
        item.start_prefetch()
        return item


@ocp.args.register_with_handler(DataHandler, for_save=True)
@dataclasses.dataclass
class DataSave(ocp.args.CheckpointArgs):
    item: Any


@ocp.args.register_with_handler(DataHandler, for_restore=True)
@dataclasses.dataclass
class DataRestore(ocp.args.CheckpointArgs):
    item: Any


def shared_data_state(directory) -> str:
    """The iterator state (JSON text) that every host of the saving run wrote to `directory`; raises
    CheckpointError when there is none or when the hosts' states differ."""
    files = sorted(directory.glob("process_*-of-*.json"))
    states = {f.read_text() for f in files}
    if len(states) != 1:
        raise CheckpointError(f"data iterator state in {directory}: " + (
            "no process_*-of-*.json file" if not files else
            f"the {len(files)} hosts that saved it hold different positions, so it cannot be restored on "
            "another number of hosts"))
    return states.pop()


class RunCheckpointer:
    def __init__(self, workdir: str, *, keep: int, keep_best: int, async_save: bool):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        policies = [cm.LatestN(n=keep)]
        # BestN keeps the last n after sorting; descending order puts the lowest eval losses last.
        if keep_best:
            policies.append(cm.BestN(get_metric_fn=lambda m: m["eval_loss"], reverse=True, n=keep_best,
                                     keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=cm.AnyPreservationPolicy(policies), enable_async_checkpointing=async_save,
            create=True)
        self.manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "data", "meta"),
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": DataHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator, meta: dict, eval_loss: float | None = None) -> None:
        meta = {**meta, "checksums": array_checksums(state), "data_checksum": json_checksum(data_iterator.get_state())}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=DataSave(data_iterator),
                                  meta=ocp.args.JsonSave(meta))
        metrics = {"eval_loss": float(eval_loss)} if eval_loss is not None else None
        self.manager.save(step, args=args, metrics=metrics, force=True)

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def read_meta(self, step: int) -> dict:
        """The checkpoint's meta record (step, loss, checksums) without reading the state."""
        try:
            meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:  # a missing or corrupt record fails in Orbax with many error types
            raise CheckpointError(f"checkpoint {self.step_dir(step)} is damaged: cannot read its meta record "
                                  f"({describe_error(e)})") from None
        if not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {self.step_dir(step)} is damaged: its meta record is not a mapping")
        return meta

    def restore(self, step: int, abstract_state, data_iterator, verify: bool = True):
        """Restores the state onto the shardings of `abstract_state` (ShapeDtypeStructs with
        `.sharding`) and sets `data_iterator` to its saved position. Returns (state, meta).

        Raises CheckpointError when the saved state does not fit `abstract_state` (checked before any
        array is read), cannot be read, or (verify) differs from the checksums written at save."""
        where = self.step_dir(step)
        meta = self.read_meta(step)
        saved = meta.get("checksums")
        if saved is not None:
            _check_fits(saved, abstract_state, where)
        elif verify:
            raise CheckpointError(f"checkpoint {where} has no checksums (written before checkpoints carried "
                                  "them): cannot verify it; pass --no-verify (train.verify_checkpoints=false)")
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=DataRestore(data_iterator)))
        except Exception as e:  # truncated / corrupt files fail deep inside TensorStore or grain
            raise CheckpointError(f"checkpoint {where} is damaged: {describe_error(e)}") from None
        if verify:
            compare(saved, array_checksums(out["state"]), where)
            if jax.process_count() == 1 and meta.get("data_checksum") != json_checksum(data_iterator.get_state()):
                raise CheckpointError(f"checkpoint {where} is damaged: the data iterator position differs from "
                                      "the checksum written at save")
        return out["state"], {k: v for k, v in meta.items() if k not in ("checksums", "data_checksum")}

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _check_fits(saved: dict, abstract_state, where: str) -> None:
    """The saved arrays' shapes and dtypes against the state a restore should fill."""
    want = {jax.tree_util.keystr(p): (list(x.shape), np.dtype(x.dtype).name)
            for p, x in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
    got = {k: (v["shape"], v["dtype"]) for k, v in saved.items()}
    diffs = [f"{k} saved as {got[k][1]}{tuple(got[k][0])}, expected {want[k][1]}{tuple(want[k][0])}"
             for k in want if k in got and got[k] != want[k]]
    diffs += [f"{k} is not in the checkpoint" for k in want if k not in got]
    diffs += [f"{k} is in the checkpoint but not in this run's state" for k in got if k not in want]
    if diffs:
        raise CheckpointError(f"checkpoint {where} holds a train state that does not fit this run's config "
                              f"({len(diffs)} difference(s), e.g. {diffs[0]})")


def abstract_like(tree, shardings):
    """ShapeDtypeStructs carrying the target shardings (restore straight onto the mesh)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
