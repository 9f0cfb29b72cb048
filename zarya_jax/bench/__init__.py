"""Benchmarks as library calls: each module measures one thing from a small frozen dataclass of settings and
returns its results (the rows `python -m experiments.bench NAME` writes as JSON) and their Markdown.

    results.py     timing helpers, Markdown tables, the result files with provenance
    baseline.py    child processes (each side of a comparison alone on the machine) and the HF baseline's setups
    train.py       the real sharded train step (`train.step.build_steps`), timed; device-count scaling
    plan.py        memory and FLOPs per device, compiled ahead of time on virtual CPU devices
    aot.py         every program a pod run executes, compiled for a target's chips (TPU, GPU, CPU)
    device.py      one accelerator: train MFU, the pass-cost curve against the window, decode vs the roofline
    forward.py     the jitted forward vs Hugging Face's PyTorch Qwen3, same weights
    generate.py    decoding throughput of AR, mode A and mode B; AR vs HF at its best
    spec.py        Ψ-Spec (spec-self, spec-lora) against the AR sampler
    cycle.py       where a two-pass Ψ-Spec cycle's time goes: each step of the compiled cycle against AR's pass
    transforms.py  the Zarya training transforms next to the model's forward + backward
    vocab.py       the losses and one decode pass at Qwen3's vocabulary

A notebook calls e.g. `zarya_jax.bench.aot.compile_rows(AotSettings(targets=("tpu:v5e:2x2",), presets=("tiny",)))`;
the command line (`experiments.bench`) parses its flags into the same settings. The manual: docs/benchmarks.md.
"""
