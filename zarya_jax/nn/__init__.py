"""The network's parts, below `zarya_jax.model`, `checkpoint` and `lora`: attention kernels (`attention`:
dense, cuDNN, TPU splash), attention masks (`masks`), the static KV cache (`kv_cache`), the mesh axes,
logical-axis rules and declarations (`partitioning`), the one HF ⇄ JAX tensor map (`hf_params`) and
per-array checksums (`integrity`). Depends only on `zarya_jax.config`."""
