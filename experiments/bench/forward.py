"""Benchmarks, one umbrella command with four subcommands:

    python -m experiments.bench forward  [--layers 4 --hidden 512 --seq 512 --batch-sizes 1,4]
    python -m experiments.bench train    ...   (experiments/bench_train.py)
    python -m experiments.bench generate ...   (experiments/bench_generate.py)
    python -m experiments.bench spec     ...   (experiments/bench_spec.py)

`forward` times the jitted JAX forward against Hugging Face transformers' PyTorch Qwen3 forward on
the same machine and the same random weights (the HF model is built first and its weights copied
into the JAX params, and the logits are compared), and reports the ratio measured in one run.
Every subcommand writes `<out>/<name>.json` and `<out>/<name>.md` and prints the Markdown table.
Runs unchanged on GPU/TPU (the HF side stays on the CPU).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def _csv_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def write_results(out_dir: str, name: str, results: dict, markdown: str) -> None:
    """Atomic JSON + Markdown write."""
    os.makedirs(out_dir, exist_ok=True)
    for ext, text in (("json", json.dumps(results, indent=2)), ("md", markdown)):
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, f"{name}.{ext}"))


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ forward

def hf_model(layers: int, hidden: int, heads: int, kv_heads: int, ffw: int, vocab: int, seed: int):
    """A random HF transformers Qwen3ForCausalLM (fp32, eager attention, CPU)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffw, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1_000_000.0,
                      attn_implementation="eager")
    model = Qwen3ForCausalLM(cfg).eval()
    return model, cfg


def params_from_hf(model, config):
    """Copies HF Qwen3 weights into the zarya_jax params pytree (see model.py for the layout)."""
    import jax.numpy as jnp

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    d, h, k, q, n = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim, config.num_layers

    def stack(fn):
        return jnp.asarray(np.stack([fn(i) for i in range(n)]))

    w = lambda i, name: sd[f"model.layers.{i}.{name}.weight"]  # noqa: E731
    layers = {
        "input_norm": {"scale": stack(lambda i: w(i, "input_layernorm"))},
        "post_attn_norm": {"scale": stack(lambda i: w(i, "post_attention_layernorm"))},
        "q_norm": {"scale": stack(lambda i: w(i, "self_attn.q_norm"))},
        "k_norm": {"scale": stack(lambda i: w(i, "self_attn.k_norm"))},
        "q_proj": {"kernel": stack(lambda i: w(i, "self_attn.q_proj").T.reshape(d, h, q))},
        "k_proj": {"kernel": stack(lambda i: w(i, "self_attn.k_proj").T.reshape(d, k, q))},
        "v_proj": {"kernel": stack(lambda i: w(i, "self_attn.v_proj").T.reshape(d, k, q))},
        "o_proj": {"kernel": stack(lambda i: w(i, "self_attn.o_proj").T.reshape(h, q, d))},
        "gate_proj": {"kernel": stack(lambda i: w(i, "mlp.gate_proj").T)},
        "up_proj": {"kernel": stack(lambda i: w(i, "mlp.up_proj").T)},
        "down_proj": {"kernel": stack(lambda i: w(i, "mlp.down_proj").T)},
    }
    return {"embed": jnp.asarray(sd["model.embed_tokens.weight"]),
            "final_norm": {"scale": jnp.asarray(sd["model.norm.weight"])}, "layers": layers}


def _time(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_forward(layers=4, hidden=512, heads=8, kv_heads=4, ffw=None, vocab=32768, seq=512,
                  batch_sizes=(4,), repeats=5, seed=0, hf=True) -> dict:
    """Median forward wall time of the jitted JAX model and (on CPU) HF's PyTorch model, same weights."""
    import jax
    import jax.numpy as jnp

    from zarya_jax.config import ModelConfig
    from zarya_jax.model import forward

    ffw = ffw or 3 * hidden
    model, _ = hf_model(layers, hidden, heads, kv_heads, ffw, vocab, seed)
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffw, num_layers=layers,
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                         max_position_embeddings=4096)
    params = params_from_hf(model, config)
    fwd = jax.jit(lambda p, t: forward(p, config, t))
    rows = []
    rng = np.random.default_rng(seed)
    for b in batch_sizes:
        tokens = rng.integers(0, vocab, size=(b, seq), dtype=np.int64)
        jt = jnp.asarray(tokens, jnp.int32)
        t0 = time.perf_counter()
        logits = fwd(params, jt).block_until_ready()
        compile_s = time.perf_counter() - t0
        row = {"batch": b, "seq": seq, "tokens": b * seq, "jax_compile_s": compile_s}
        jax_fn = lambda: fwd(params, jt).block_until_ready()  # noqa: E731
        jax_times = _time(jax_fn, repeats)
        row["jax_s"] = statistics.median(jax_times)
        row["jax_tokens_per_s"] = b * seq / row["jax_s"]
        if hf:
            import torch

            tt = torch.from_numpy(tokens)
            with torch.inference_mode():
                ref = model(tt).logits.float().numpy()
                row["max_abs_logit_diff"] = float(np.max(np.abs(np.asarray(logits) - ref)))

                def hf_fn():
                    model(tt)

                hf_fn()  # warm-up
                # Interleave so that machine load (shared cores) hits both sides alike.
                hf_times, jax_times2 = [], []
                for _ in range(repeats):
                    hf_times += _time(hf_fn, 1)
                    jax_times2 += _time(jax_fn, 1)
            row["hf_s"] = statistics.median(hf_times)
            row["jax_s"] = statistics.median(jax_times + jax_times2)
            row["jax_tokens_per_s"] = b * seq / row["jax_s"]
            row["hf_tokens_per_s"] = b * seq / row["hf_s"]
            row["speedup_vs_hf"] = row["hf_s"] / row["jax_s"]
        rows.append(row)
    import torch

    return {"benchmark": "forward", "backend": jax.default_backend(), "devices": str(jax.devices()),
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "config": {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffw": ffw,
                       "vocab": vocab, "seq": seq, "dtype": "float32", "repeats": repeats},
            "rows": rows}


def forward_markdown(results: dict) -> str:
    c = results["config"]
    head = (f"Forward, {c['layers']} layers, hidden {c['hidden']}, vocab {c['vocab']}, seq {c['seq']}, fp32, "
            f"backend {results['backend']}, median of {c['repeats']}\n\n")
    cols = ["batch", "tokens", "jax_s", "hf_s", "jax_tokens_per_s", "hf_tokens_per_s", "speedup_vs_hf",
            "max_abs_logit_diff"]
    return head + markdown_table(results["rows"], cols)


def add_forward_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffw", type=int, default=None, help="MLP width (default 3 × hidden)")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch-sizes", type=_csv_ints, default=[4], help="comma-separated, e.g. 1,4,16,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")


def run_forward(args) -> tuple[dict, str]:
    for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "seq", "repeats"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise ValueError(f"--hidden={args.hidden}, --heads={args.heads}, --kv-heads={args.kv_heads}: expected "
                         "hidden divisible by heads and heads by kv-heads")
    results = bench_forward(args.layers, args.hidden, args.heads, args.kv_heads, args.ffw, args.vocab, args.seq,
                            args.batch_sizes, args.repeats, args.seed, hf=not args.no_hf)
    return results, forward_markdown(results)


# ------------------------------------------------------------------------------------------ umbrella

# Subcommand -> module implementing `add_arguments(parser)` and `run(args) -> (results dict, markdown)`.
SUBMODULES = {"train": "experiments.bench_train", "generate": "experiments.bench_generate",
              "spec": "experiments.bench_spec"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A benchmark module with its own command line (a `main(argv)` and no `add_arguments`) gets the
    # rest of the arguments as they are.
    if argv and argv[0] in SUBMODULES:
        module = importlib.import_module(SUBMODULES[argv[0]])
        if not hasattr(module, "add_arguments") and hasattr(module, "main"):
            return module.main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench", help="directory for <name>.json and <name>.md")
    sub = p.add_subparsers(dest="command", required=True)
    add_forward_args(sub.add_parser("forward", help="jitted JAX forward vs HF transformers PyTorch forward"))
    runners = {"forward": run_forward}
    for name, module_name in SUBMODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue
        summary = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else None
        if not hasattr(module, "add_arguments"):
            sub.add_parser(name, help=f"{summary} (own options: python -m experiments.bench {name} --help)")
            continue
        sp = sub.add_parser(name, help=summary)
        module.add_arguments(sp)
        runners[name] = module.run
    args = p.parse_args(argv)
    try:
        results, md = runners[args.command](args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_results(args.out, args.command, results, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
