"""A PEFT LoRA adapter directory → Uno's gated-LoRA drafter adapter (`conversion.peft`).

    python -m conversion.peft_to_lora --peft DIR --out DIR [--base CKPT] [--noise uniform|mask]

Reads `adapter_config.json` and `adapter_model.safetensors` (Qwen3 module names) and writes
`DIR/adapter.safetensors` for `zarya_jax.lora.load`, `experiments.generate --lora` and `evaluate --lora`.
The noise convention comes from `--noise`, else the `zarya_lora.json` side file written by
`conversion.lora_to_peft`, else "uniform". `--base` checks the shapes against a checkpoint and sizes the
zero factors of projections the adapter does not target.
"""
from __future__ import annotations

import argparse

from zarya_jax import checkpoint
from zarya_jax import lora as lora_lib
from zarya_jax.config import LORA_NOISE

from . import ConversionError, check_new_output, run_cli
from . import peft


def convert(peft_dir: str, out: str, base: str | None = None, noise: str | None = None) -> str:
    """Writes our adapter directory `out` (which must not exist) from a PEFT adapter directory."""
    out = check_new_output(out, {"--peft": peft_dir, "--base": base})
    tensors, config, side_noise = peft.read(peft_dir)
    noise = noise or side_noise or "uniform"
    if noise not in LORA_NOISE:
        raise ConversionError(f"noise convention {noise!r}: expected one of {LORA_NOISE}")
    try:
        model_config = checkpoint.load_config(base) if base else None
    except ValueError as e:
        raise ConversionError(f"--base {base!r}: {e}") from e
    adapter, lora = peft.from_peft(tensors, config, noise, model_config, where=f"PEFT adapter {peft_dir!r}")
    lora_lib.save(out, adapter, lora)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.peft_to_lora", description=__doc__.split("\n\n")[0])
    parser.add_argument("--peft", required=True, help="PEFT adapter directory (adapter_config.json + "
                        "adapter_model.safetensors)")
    parser.add_argument("--out", required=True, help="adapter directory to create (must not exist)")
    parser.add_argument("--base", default=None, help="the zarya_jax checkpoint the adapter belongs to (shape check)")
    parser.add_argument("--noise", choices=LORA_NOISE, default=None,
                        help="draft-input convention (default: zarya_lora.json's, else uniform)")

    def run(args_list):
        args = parser.parse_args(args_list)
        print(f"wrote {convert(args.peft, args.out, args.base, args.noise)}")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
