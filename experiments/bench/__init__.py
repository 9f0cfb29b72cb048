"""Benchmarks, one command with a subcommand each (`python -m experiments.bench NAME --help`):

    python -m experiments.bench forward     [--layers 4 --hidden 512 --seq 512 --batch-sizes 1,4]
    python -m experiments.bench train       [--presets tiny,100m --batch 8 --length 256 --steps 3]
    python -m experiments.bench generate    [--batch-sizes 1,8,32 --max-new-tokens 32 [--ckpt CKPT --no-hf]]
    python -m experiments.bench spec        [--ckpt CKPT [--adapter DIR]] [--draft-lengths 4,8,16] ...
    python -m experiments.bench transforms  [--preset tiny --batch 8 --length 256]

Every subcommand writes `<out>/<name>.json` and `<out>/<name>.md` (`--out`, default runs/bench, given
before the subcommand) and prints the Markdown table; `harness` holds the shared command line, timing
helpers and result files; every JSON records the code's provenance (commit, dirty tree, package
versions, machine). `forward` and `generate` time the JAX side and the Hugging Face baseline (at its
best configuration) each in a process of its own, alternating. They run unchanged on GPU/TPU (the HF
side stays on the CPU). The manual: docs/benchmarks.md.
"""
