"""Data: tokenizers (`tokenizer`: bytes or a Hugging Face directory), JSONL records (`records`: line-by-line
reading, validation, the strict `read_jsonl`), prompt rendering (`render`: records → the prompt text, the
same for training, evaluation and generation), the supervised batch format (`batch`: padding, packing,
per-row layout), the grain pipelines from JSONL (`pipeline`: DataConfig, load_splits, make_dataset) and
Qwen3's tokenizer built offline (`qwen3_tokenizer`). Depends only on `zarya_jax.config`."""
