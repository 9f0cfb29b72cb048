"""Evaluation: every decoding mode on a JSONL set (`evaluate`), answer extraction and exact match
(`answers`), and the embedded arithmetic task generator (`tasks`)."""
