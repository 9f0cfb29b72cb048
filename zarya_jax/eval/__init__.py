"""Evaluation: every decoding mode on a JSONL set (`evaluate`), answer extraction and exact match
(`answers`), the decoding frontier of a checkpoint and the knobs chosen on validation (`frontier`), why a
mode loses accuracy (`diagnose`: teacher-forced head accuracy, where outputs go wrong), the embedded
arithmetic task generator (`tasks`), what makes two evaluations the same one (`identity`), and the
lm-evaluation-harness model `zarya` (`harness`; needs the `eval` extra, imported only by
`experiments.lm_eval`)."""
