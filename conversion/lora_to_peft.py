"""Uno's gated-LoRA drafter adapter → a PEFT LoRA adapter directory (`conversion.peft`).

    python -m conversion.lora_to_peft --adapter DIR --out DIR [--base-model NAME_OR_PATH]

Writes `adapter_config.json` (r, lora_alpha, the seven target modules), `adapter_model.safetensors`
(PEFT's names, `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, …) and `zarya_lora.json`
(the adapter's noise convention). With the model exported by `conversion.jax_to_hf` it loads with
`peft.PeftModel.from_pretrained(model, DIR)`; merged, it is the drafter with the gate on for every token.
"""
from __future__ import annotations

import argparse

from zarya_jax import lora as lora_lib
from zarya_jax.config import ConfigError

from . import ConversionError, check_new_output, run_cli, staging_dir
from . import peft


def convert(adapter_dir: str, out: str, base_model: str | None = None) -> str:
    """Writes the PEFT directory `out` (which must not exist) from our adapter directory."""
    out = check_new_output(out, {"--adapter": adapter_dir, "--base-model": base_model})
    try:
        adapter, lora = lora_lib.load(adapter_dir)
    except (ConfigError, ValueError) as e:
        raise ConversionError(f"--adapter {adapter_dir!r}: {e}") from e
    tensors, config = peft.to_peft(adapter, lora, base_model)
    with staging_dir(out) as tmp:
        peft.write(tmp, tensors, config, lora.noise)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conversion.lora_to_peft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", required=True, help="adapter directory (zarya_jax.lora.save, e.g. WORKDIR/adapter)")
    parser.add_argument("--out", required=True, help="PEFT adapter directory to create (must not exist)")
    parser.add_argument("--base-model", default=None,
                        help="base_model_name_or_path to record (e.g. the directory written by conversion.jax_to_hf)")

    def run(args_list):
        args = parser.parse_args(args_list)
        print(f"wrote {convert(args.adapter, args.out, args.base_model)}")

    return run_cli(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
