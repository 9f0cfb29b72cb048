"""The console scripts (pyproject.toml's `[project.scripts]`): each runs the `main` of its `python -m` module and
ends the process as that module does (`cli.main`: the exit status, and after a signal no interpreter teardown,
which crashes while XLA's threads still run)."""
from .cli import script

quickstart = script("experiments.quickstart")
train = script("experiments.train")
train_drafter = script("experiments.train_drafter")
train_draft_model = script("experiments.train_draft_model")
generate = script("experiments.generate")
evaluate = script("experiments.evaluate")
lm_eval = script("experiments.lm_eval")
sweep = script("experiments.sweep")
bench = script("experiments.bench.__main__")
speed = script("experiments.speed")
tasks = script("experiments.tasks")
rehearse = script("experiments.rehearse")
rl = script("experiments.rl")
hf_to_jax = script("conversion.hf_to_jax")
jax_to_hf = script("conversion.jax_to_hf")
lora_to_peft = script("conversion.lora_to_peft")
peft_to_lora = script("conversion.peft_to_lora")
memcheck = script("conversion.memcheck")
qwen3_tokenizer = script("conversion.qwen3_tokenizer")
