"""Data: tokenizers (`tokenizer`: bytes or a Hugging Face directory), prompt rendering (`render`: records →
the prompt text, the same for training, evaluation and generation), the supervised batch format (`batch`:
padding, packing) and the grain pipelines from JSONL (`pipeline`: DataConfig, load_splits, make_dataset)."""
