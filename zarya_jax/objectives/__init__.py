"""Training objectives on top of `nn` and `data`: the `Objective` protocol the trainer runs (`base`),
Zarya's hybrid AR + MDM objective (`zarya`, built from `curriculum`, `slots`, `noise`, `losses`;
docs/algorithms.md §2–§3), the plain next-token baseline (`ar`) and Uno's gated-LoRA drafter objective (`drafter`,
docs/algorithms.md §7)."""
