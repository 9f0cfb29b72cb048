"""The network and its files: the Qwen3 Linen model (`model`), its attention kernels (`attention`: dense,
cuDNN, TPU splash), attention masks (`masks`), the static KV cache (`kv_cache`), the mesh axes and
logical-axis rules (`partitioning`), gated-LoRA adapters and their noise convention (`lora`), the one
HF ⇄ JAX tensor map (`hf_params`) and Orbax model checkpoints (`checkpoint`). Depends only on
`zarya_jax.config`."""
