"""Orbax checkpointing of a training run: train state + grain iterator state + a small JSON record.

Layout: WORKDIR/checkpoints/<step>/{state, data, meta}. Kept: the latest `keep` checkpoints plus the
`keep_best` ones with the lowest eval loss (only checkpoints saved at an eval step carry one). Saves
are asynchronous when enabled (the state arrays are copied, then written in the background); the
grain iterator state is captured synchronously at save time. Directories appear under their final
name only once complete (Orbax writes to a temporary name, then renames), so a killed run resumes
from the last complete checkpoint.
"""
from __future__ import annotations

import os

import grain
import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm


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
            item_handlers={"state": ocp.StandardCheckpointHandler(), "data": grain.checkpoint.CheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator, meta: dict, eval_loss: float | None = None) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=grain.checkpoint.CheckpointSave(data_iterator),
                                  meta=ocp.args.JsonSave(meta))
        metrics = {"eval_loss": float(eval_loss)} if eval_loss is not None else None
        self.manager.save(step, args=args, metrics=metrics, force=True)

    def restore(self, step: int, abstract_state, data_iterator):
        """Restores the state onto the shardings of `abstract_state` (ShapeDtypeStructs with
        `.sharding`) and sets `data_iterator` to its saved position. Returns (state, meta)."""
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator),
            meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree, shardings):
    """ShapeDtypeStructs carrying the target shardings (restore straight onto the mesh)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
