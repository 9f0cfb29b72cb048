"""The network and its files: the Qwen3 Linen model (`model`), attention masks (`masks`), the static KV
cache (`kv_cache`), gated-LoRA adapters and their noise convention (`lora`), the one HF ⇄ JAX tensor
map (`hf_params`) and Orbax model checkpoints (`checkpoint`). Depends only on `zarya_jax.config`."""
