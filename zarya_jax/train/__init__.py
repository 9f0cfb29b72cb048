"""One objective-agnostic trainer: the run config (`config`), optimizer (`optim`), mesh and shardings
(`sharding`), the jitted sharded step (`step`), the loop (`loop.train`) with its hooks (`hooks`:
logging, progress, eval, checkpoints, export), the stop on a signal agreed across hosts (`preemption`),
divergence detection beside the NaN guard (`divergence`), what makes a workdir "the same run"
(`identity`), what a run takes from the checkpoint it starts from (`inherit`: its tokenizer, a base run's
data shapes), the per-device memory estimate checked before compiling (`memory`), run checkpoints
(`checkpoints`), metrics (`metrics`), experiment trackers (`trackers`: W&B, trackio), the LoRA drafter
run (`drafter`) and the draft model run (`draft_model`: sized to a budget, then trained)."""
