"""Compile for the target, not for the host: every program a pod run executes, per chip, from the target's compiler.

    python -m experiments.bench aot --target tpu:v5e:4x4 --presets qwen3-1.7b,qwen3-4b --mesh 1,-1,4 \\
        --seq 4096 --batch 64 --decode-batch 64 --prompt 1024 --new 8192

For each target (`zarya_jax.target`: `tpu:GENERATION:SHAPE` compiles with the TPU compiler through libtpu on any
host, no TPU needed; `gpu:MODEL[xN]` with XLA:GPU through the CUDA plugin, no GPU needed; `cpu` with this host's
devices) and preset, on the project's own mesh
(`train.sharding.make_mesh` over the target's devices, `--mesh data,fsdp,tensor`), rules and donation,
`jax.jit(...).lower(abstract inputs).compile()` of

- the train steps, as the trainers build them (`train.step`: AdamW, fp32 master weights and moments, the state
  donated): Zarya slotted and non-slotted (`zarya`, `zarya-nonslotted`), Uno's LoRA drafter on the frozen base
  (`drafter`), a draft model distilled from the base at the adapter's parameter budget (`draft-model`),
  GRPO (`grpo`, rollouts of `--new`-capped completions after a quarter-length prompt), and the evaluation
  forward of the Zarya loss (`eval`) — at `--batch` rows of `--seq` tokens;
- every decoder `generate()` runs (`sampling.generate.lower`, params in the compute dtype): AR, mode A,
  mode B, Ψ-Spec two-pass with the self and the LoRA drafter, and fused with both — at `--decode-batch`
  prompts of `--prompt` tokens and `--new` new tokens (Uno's 1024 + 8192 by default);

and reports per program: compiled, or the compiler's first error line (a program larger than the chip's HBM is
refused by the TPU compiler; XLA:GPU compiles it, and `fits` says no); per-chip memory from the target's buffer
assignment (arguments, outputs, temporaries, total = arguments + outputs − donated + temporaries) against the
chip's HBM; the compile time; and the attention kernel (`splash` when the program holds the Pallas kernel,
`cudnn` cuDNN's fused attention, else `dense`).

What the numbers are: the TPU compiler's own per-chip buffer assignment for that chip and mesh — the same the
chip would run, short of runtime fragmentation; on a GPU, XLA:GPU's for the target config's GPU, short of the
workspaces cuDNN sizes only on a device. `bench plan` (XLA:CPU on virtual devices) is the fallback
without libtpu; its numbers are the CPU compiler's.
"""
from __future__ import annotations

import argparse
import importlib
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from zarya_jax import target as target_lib
from zarya_jax.config import ConfigError, LoraConfig, ZaryaConfig
from zarya_jax.nn import attention as attention_lib
from zarya_jax import lora as lora_lib
from zarya_jax import model as model_lib
from zarya_jax.objectives.distill import DistillConfig, distill_objective
from zarya_jax.objectives.drafter import DrafterConfig, drafter_objective
from zarya_jax.objectives.zarya import zarya_objective
from zarya_jax.rl import grpo
from zarya_jax.rl.trainer import BATCH_KEYS as GRPO_KEYS, grpo_objective
from zarya_jax.sampling.config import GenerationConfig
from zarya_jax.sampling.modes import MODES
from zarya_jax.train import sharding as shd
from zarya_jax.train.checkpoints import abstract_like
from zarya_jax.train.draft_model import draft_model_config, lora_budget, sized_to
from zarya_jax.train.loop import BATCH_KEYS
from zarya_jax.train.optim import OptimConfig
from zarya_jax.train.step import StepCache, build_optimizer, init_state, make_eval_step, make_train_step, state_shardings

from .harness import markdown_table
from .plan import _mesh_config
from .train import model_config

generate_lib = importlib.import_module("zarya_jax.sampling.generate")  # the module, not the function

GIB = 1 << 30
TRAIN = ("zarya", "zarya-nonslotted", "drafter", "draft-model", "grpo", "eval")
# Every decoding mode at its default knobs, but the one that needs a second (draft) model's weights.
DECODE = {name: GenerationConfig(mode=name) for name, cls in MODES.items() if not cls.decoder.uses_draft_model}
PROGRAMS = TRAIN + tuple(DECODE)
TOTAL_STEPS = 1000


def _placed(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _weights(cfg, mesh, lora: LoraConfig | None = None):
    """Abstract params in the compute dtype (as a converted checkpoint holds them), on the mesh; with `lora`,
    (params, adapter)."""
    c = cfg.replace(param_dtype=cfg.dtype)
    params = jax.eval_shape(lambda k: model_lib.init_params(c, k), jax.random.PRNGKey(0))
    params = _placed(params, shd.tree_shardings(params, mesh))
    if lora is None:
        return params
    adapter = jax.eval_shape(lambda k: lora_lib.init_lora(cfg, lora, k), jax.random.PRNGKey(0))
    return params, _placed(adapter, shd.tree_shardings(adapter, mesh))


def _batch(mesh, shapes: dict) -> dict:
    sharding = shd.batch_sharding(mesh)
    return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for k, (shape, dtype) in shapes.items()}


def _train_lowered(objective, init_trainable, frozen, mesh, batch: dict, evaluate: bool = False):
    """The trainer's step for `objective` (`train.step`, as `train.loop.train` builds it), lowered on abstract
    inputs: trainable = `init_trainable(key)`, `frozen` abstract and placed (or None)."""
    key = jax.random.PRNGKey(0)
    optim = OptimConfig(lr=1e-4, warmup_steps=0)
    optimizer, mask = build_optimizer(optim, TOTAL_STEPS, jax.eval_shape(init_trainable, key))
    abstract = jax.eval_shape(lambda k: init_state(init_trainable(k), optimizer, k, objective.init_carry), key)
    sh = state_shardings(abstract, optimizer, mesh)
    frozen_sh = None if frozen is None else jax.tree.map(lambda x: x.sharding, frozen)
    steps = StepCache(make_train_step(objective, optimizer, optim, TOTAL_STEPS, mesh, mask),
                      make_eval_step(objective, TOTAL_STEPS, mesh), sh, frozen_sh, mesh, tuple(batch))
    static = objective.static_at(0, TOTAL_STEPS)
    state = abstract_like(abstract, sh)
    if not evaluate:
        return steps.train(static).lower(state, frozen, batch)
    rep = shd.replicated(mesh)
    scalar = lambda dtype, shape=(): jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
    return steps.eval(static).lower(state["params"], state.get("carry"), frozen, batch, scalar(jnp.uint32, (2,)),
                                    scalar(jnp.int32))


def train_lowered(program: str, cfg, mesh, rows: int, seq: int, new: int):
    """The lowered train-side `program` (one of `TRAIN`) for model `cfg` at `rows` × `seq` on `mesh`."""
    tokens = {k: ((rows, seq), bool if k == "answer_mask" else jnp.int32) for k in BATCH_KEYS}
    init = lambda k: model_lib.init_params(cfg, k)
    if program in ("zarya", "zarya-nonslotted", "eval"):
        zc = ZaryaConfig(slotted_training=program != "zarya-nonslotted")
        return _train_lowered(zarya_objective(cfg, zc), init, None, mesh, _batch(mesh, tokens), program == "eval")
    if program == "drafter":
        lora = LoraConfig()
        base = _weights(cfg, mesh)
        return _train_lowered(drafter_objective(cfg, lora, DrafterConfig()), lambda k: lora_lib.init_lora(cfg, lora, k),
                              base, mesh, _batch(mesh, tokens))
    if program == "draft-model":
        student = draft_model_config(cfg, sized_to(cfg, lora_budget(cfg, LoraConfig())))
        return _train_lowered(distill_objective(student, cfg, DistillConfig()),
                              lambda k: model_lib.init_params(student, k), _weights(cfg, mesh), mesh,
                              _batch(mesh, tokens))
    if program == "grpo":
        g = min(new, seq - seq // 4)  # completions after a quarter-length prompt, within the sequence
        shapes = {"tokens": ((rows, seq), jnp.int32), "prompt_lengths": ((rows, 1), jnp.int32),
                  "completions": ((rows, g), jnp.int32), "mask": ((rows, g), bool),
                  "old_logprobs": ((rows, g), jnp.float32), "advantages": ((rows, 1), jnp.float32),
                  "ref_logprobs": ((rows, g), jnp.float32)}
        assert tuple(shapes) == GRPO_KEYS
        return _train_lowered(grpo_objective(cfg, grpo.GRPOConfig(), 1.0), init, None, mesh, _batch(mesh, shapes))
    raise ConfigError(f"program {program!r}: expected one of {PROGRAMS}")


def decode_lowered(program: str, cfg, mesh, batch: int, prompt: int, new: int):
    """The lowered `generate()` program of decoding mode `program` (one of `DECODE`)."""
    gc = DECODE[program].replace(max_new_tokens=new)
    if getattr(gc.mode, "drafter", None) == "lora":
        lora = LoraConfig()
        params, adapter = _weights(cfg, mesh, lora)
        return generate_lib.lower(params, cfg, gc, batch, prompt, mesh=mesh, lora_params=adapter, lora=lora)
    return generate_lib.lower(_weights(cfg, mesh), cfg, gc, batch, prompt, mesh=mesh)


def kernel(text: str) -> str:
    """The attention kernel a program's text holds: 'splash' (a Pallas TPU kernel, the only one attention uses),
    'cudnn' (cuDNN's fused attention: named only in the compiled program, the lowered one holds a partitioning
    callback), else 'dense'."""
    return "splash" if "tpu_custom_call" in text else "cudnn" if "__cudnn$fmha" in text else "dense"


def _cudnn_attention(cfg) -> bool:
    """Whether a GPU runs `cfg`'s causal attention with cuDNN's kernel (`nn.attention`: dot_product in bf16/fp16)."""
    return (attention_lib.resolve(cfg.attention, "gpu", cfg.jnp_dtype, attention_lib.SPLASH_BLOCK, cfg.head_dim)
            == "dot_product" and cfg.jnp_dtype in (jnp.bfloat16, jnp.float16))


def compile_row(program: str, target: str, preset_name: str, mesh, args) -> dict:
    cfg = model_config(preset_name, remat=args.remat == "true", attention=args.attention)
    decode = program in DECODE
    row = {"target": target, "preset": preset_name, "program": program,
           "mesh": "/".join(str(mesh.shape[a]) for a in shd.MESH_AXES),
           "shape": f"{args.decode_batch} × {args.prompt}+{args.new}" if decode else f"{args.batch} × {args.seq}"}
    hbm = target_lib.hbm_bytes(mesh.devices.flat[0])
    row["hbm_gib"] = None if hbm is None else hbm / GIB
    t0 = time.perf_counter()
    try:
        lowered = (decode_lowered(program, cfg, mesh, args.decode_batch, args.prompt, args.new) if decode
                   else train_lowered(program, cfg, mesh, args.batch, args.seq, args.new))
        row["kernel"] = kernel(lowered.as_text())
        compiled = lowered.compile()
        if row["kernel"] == "dense":  # cuDNN's kernel shows only in the compiled program
            row["kernel"] = kernel(compiled.as_text())
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the result
        lines = [line for line in str(e).splitlines() if line.strip()]
        row.update(status="error", error=(lines[0] if lines else type(e).__name__)[:300],
                   compile_s=time.perf_counter() - t0)
        return row
    m = target_lib.memory(compiled)
    row.update(status="compiled", compile_s=time.perf_counter() - t0,
               **{f"{k}_gib": v / GIB for k, v in m.items() if k != "aliased"})
    row["fits"] = None if hbm is None else m["total"] <= hbm
    return row


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tpu:v5e:4x4",
                   help="comma-separated targets: tpu:GENERATION:SHAPE (v4, v5e, v5p, v6e; needs the tpu extra), "
                   f"gpu:MODEL[xN] ({', '.join(target_lib.GPU_MODELS)}; needs the gpu extra) or cpu")
    p.add_argument("--presets", default="qwen3-1.7b,qwen3-4b", help="comma-separated model presets")
    p.add_argument("--programs", default="all", help=f"comma-separated subset of {','.join(PROGRAMS)}, or all")
    p.add_argument("--mesh", default="", help="data,fsdp,tensor sizes (one may be -1); default FSDP over all chips")
    p.add_argument("--seq", type=int, default=4096, help="training sequence length")
    p.add_argument("--batch", type=int, default=64, help="global training batch (rows)")
    p.add_argument("--decode-batch", type=int, default=64, help="prompts per generate() call")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens per decoding row")
    p.add_argument("--new", type=int, default=8192, help="new tokens per decoding row")
    p.add_argument("--attention", default="auto", help="model.attention for every program")
    p.add_argument("--remat", default="true", choices=("true", "false"), help="recompute each layer in the backward")


def _programs(text: str) -> list[str]:
    names = list(PROGRAMS) if text == "all" else [n for n in text.split(",") if n]
    bad = [n for n in names if n not in PROGRAMS]
    if bad or not names:
        raise ValueError(f"--programs {text!r}: expected 'all' or a comma-separated subset of {','.join(PROGRAMS)}")
    return names


def run(args) -> tuple[dict, str]:
    """`python -m experiments.bench aot` → (results, markdown)."""
    for name in ("seq", "batch", "decode_batch", "prompt", "new"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")
    programs = _programs(args.programs)
    targets = [t for t in args.target.split(",") if t]
    for t in targets:
        target_lib.parse(t)
    presets = [p for p in args.presets.split(",") if p]
    cudnn = [name for name in presets if _cudnn_attention(model_config(name, attention=args.attention))]
    gpus = [t for t in targets if target_lib.parse(t)[0] == "gpu"]
    if cudnn and gpus:
        target_lib.devices(gpus[0])  # starts the CUDA plugin, which loads cuDNN where it is installed
        if not target_lib.has_cudnn():
            raise ConfigError(f"--target {args.target}: {','.join(cudnn)} with attention={args.attention!r} runs "
                              "cuDNN's flash attention on a GPU, and JAX reads the cuDNN library's version to trace "
                              "it: pip install --no-deps 'nvidia-cudnn-cu12>=9.8,<10' (no GPU needed), or "
                              "--attention dense")
    mesh_config = _mesh_config(args.mesh)
    rows = []
    for t in targets:
        mesh = shd.make_mesh(mesh_config, target_lib.devices(t))
        for name in presets:
            for program in programs:
                rows.append(compile_row(program, t, name, mesh, args))
                print(f"{t} {name} {program}: {rows[-1]['status']} ({rows[-1]['compile_s']:.0f} s)", flush=True)
    columns = ["target", "preset", "program", "mesh", "shape", "status", "kernel", "arguments_gib", "outputs_gib",
               "temporaries_gib", "total_gib", "hbm_gib", "fits", "compile_s"]
    md = ["Per chip, from the target's compiler (GiB; total = arguments + outputs − donated + temporaries):", "",
          markdown_table(rows, columns)]
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        md += ["First error line of each program that did not compile:", "",
               markdown_table(errors, ["target", "preset", "program", "error"])]
    return {"rows": rows}, "\n".join(md)
