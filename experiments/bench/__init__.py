"""Benchmarks, one command with a subcommand each (`python -m experiments.bench NAME --help`):

    python -m experiments.bench forward     [--layers 4 --hidden 512 --seq 512 --batch-sizes 1,4]
    python -m experiments.bench train       [--presets tiny,100m --batch 8 --length 256 --steps 3]
    python -m experiments.bench generate    [--batch-sizes 1,8,32 --max-new-tokens 32 [--ckpt CKPT --no-hf]]
    python -m experiments.bench spec        [--ckpt CKPT [--adapter DIR]] [--modes spec-lora,spec-self] ...
    python -m experiments.bench transforms  [--preset tiny --batch 8 --length 256]
    python -m experiments.bench plan        [--presets qwen3-0.6b --devices 8,64]
    python -m experiments.bench aot         [--target tpu:v5e:4x4 --presets qwen3-1.7b]
    python -m experiments.bench device      [--smoke]
    python -m experiments.bench check       [--smoke]            # the device check: measured beside predicted
    python -m experiments.bench cycle       [--ckpt CKPT --adapter DIR --data test.jsonl] [--batch 1] [--smoke]
    python -m experiments.bench live        [--live 1024 --factors 8 --prompt 1024 --new 8192]

Every subcommand writes `<out>/<name>.json` and `<out>/<name>.md` (`--out`, default runs/bench, given
before or after the subcommand) and prints the Markdown table; every JSON records the code's provenance
(commit, dirty tree, package versions, machine). Each subcommand parses its flags into the benchmark's
settings and makes one call into `zarya_jax.bench`, where the measurements live (`harness`: the shared
command line). `forward` and `generate` time the JAX side and the Hugging Face baseline (at its best
configuration) each in a process of its own, alternating. They run unchanged on GPU/TPU (the HF side stays
on the CPU). The manual: docs/benchmarks.md.
"""
