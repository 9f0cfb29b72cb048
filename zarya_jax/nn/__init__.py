"""The network and its files: the Qwen3 Linen model (`model`, each parameter created with its logical
axes), its attention kernels (`attention`: dense, cuDNN, TPU splash), attention masks (`masks`), the
static KV cache (`kv_cache`), the mesh axes, logical-axis rules and declarations (`partitioning`),
gated-LoRA adapters and their noise convention (`lora`), the one HF ⇄ JAX tensor map (`hf_params`),
Orbax model checkpoints (`checkpoint`) and their per-array checksums (`integrity`). Depends only on
`zarya_jax.config` and `zarya_jax.files`."""
