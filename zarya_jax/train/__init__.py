"""One objective-agnostic trainer: the run config (`config`), optimizer (`optim`), mesh and shardings
(`sharding`), the jitted sharded step (`step`), the loop (`loop.train`) with its hooks (`hooks`:
logging, progress, eval, checkpoints, export), the stop on a signal agreed across hosts (`preemption`),
divergence detection beside the NaN guard (`divergence`), what makes a workdir "the same run"
(`identity`), run checkpoints (`checkpoints`), metrics (`metrics`), experiment trackers (`trackers`: W&B,
trackio) and the LoRA drafter run (`drafter`)."""
