"""Training objectives on top of `nn` and `data`: the `Objective` protocol the trainer runs (`base`),
Zarya's hybrid AR + MDM objective (`zarya`, built from `curriculum`, `slots`, `noise`, `losses`, and
`reconstruction`, Eso-LM's sequential pass in the MDM convention; docs/algorithms.md §2–§3), the plain
next-token baseline (`ar`), Uno's gated-LoRA drafter objective (`drafter`, docs/algorithms.md §7), its
discrete consistency distillation (`dcd`, §7.7) and a separate draft model distilled from a frozen base
(`distill`, §7.6)."""
