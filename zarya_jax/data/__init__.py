"""Data: tokenizers (`tokenizer`: bytes or a Hugging Face directory), the supervised batch format
(`batch`: padding, packing) and the grain pipelines from JSONL (`pipeline`: DataConfig, load_splits,
make_dataset)."""
