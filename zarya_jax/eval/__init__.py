"""Evaluation: every decoding mode on a JSONL set (`evaluate`), answer extraction and exact match
(`answers`), the embedded arithmetic task generator (`tasks`), and the lm-evaluation-harness model
`zarya` (`harness`; needs the `eval` extra, imported only by `experiments.lm_eval`)."""
