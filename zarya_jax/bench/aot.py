"""Compile for the target, not for the host: every program a pod run executes, per chip, from the target's compiler.

For each target (`zarya_jax.target`: `tpu:GENERATION:SHAPE` compiles with the TPU compiler through libtpu on any
host, no TPU needed; `gpu:MODEL[xN]` with XLA:GPU through the CUDA plugin, no GPU needed; `cpu` with this host's
devices) and preset, on the project's own mesh (`train.sharding.make_mesh` over the target's devices,
`AotSettings.mesh`), rules and donation, `jax.jit(...).lower(abstract inputs).compile()` of

- the train steps, as the trainers build them (`train.step.build_steps`: AdamW, fp32 master weights and
  moments, the state donated): Zarya slotted and non-slotted (`zarya`, `zarya-nonslotted`), Uno's LoRA drafter
  on the frozen base (`drafter`), a draft model distilled from the base at the adapter's parameter budget
  (`draft-model`), GRPO (`grpo`, rollouts of `new`-capped completions after a quarter-length prompt), and the
  evaluation forward of the Zarya loss (`eval`) — at `batch` rows of `seq` tokens;
- every decoder `generate()` runs (`sampling.generate.lower`, params in the compute dtype): AR, mode A,
  mode B, Ψ-Spec two-pass with the self and the LoRA drafter, and fused with both — at `decode_batch`
  prompts of `prompt` tokens and `new` new tokens (Uno's 1024 + 8192 by default);

and reports per program (`AotRow`): compiled, or the compiler's first error line (a program larger than the
chip's HBM is refused by the TPU compiler; XLA:GPU compiles it, and `fits` says no); per-chip memory from the
target's buffer assignment (arguments, outputs, temporaries, total = arguments + outputs − donated +
temporaries) against the chip's HBM; the compile time; and the attention kernel (`splash` when the program
holds the Pallas kernel, `cudnn` cuDNN's fused attention, else `dense`).

What the numbers are: the TPU compiler's own per-chip buffer assignment for that chip and mesh — the same the
chip would run, short of runtime fragmentation; on a GPU, XLA:GPU's for the target config's GPU, short of the
workspaces cuDNN sizes only on a device. `bench.plan` (XLA:CPU on virtual devices) is the fallback
without libtpu; its numbers are the CPU compiler's.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import time

import jax
import jax.numpy as jnp

from .. import lora as lora_lib
from .. import model as model_lib
from .. import target as target_lib
from ..config import ConfigError, LoraConfig, ZaryaConfig
from ..nn import attention as attention_lib
from ..objectives.distill import DistillConfig, distill_objective
from ..objectives.drafter import DrafterConfig, drafter_objective
from ..objectives.zarya import zarya_objective
from ..rl import grpo
from ..rl.trainer import BATCH_KEYS as GRPO_KEYS, grpo_objective
from ..sampling.config import LAYER_LOOPS, GenerationConfig
from ..nn import kv_cache
from ..nn.partitioning import spec_for
from ..sampling import passes
from ..sampling.modes import MODES
from ..train import sharding as shd
from ..train.checkpoints import abstract_like
from ..train.draft_model import draft_model_config, lora_budget, sized_to
from ..train.optim import OptimConfig
from ..train.metrics import train_flops_per_token
from ..train.step import build_steps
from . import roofline as rl
from .results import GIB, markdown_table
from .train import TOTAL_STEPS, abstract_batch, model_config, token_shapes

generate_lib = importlib.import_module("zarya_jax.sampling.generate")  # the module, not the function

TRAIN = ("zarya", "zarya-nonslotted", "drafter", "draft-model", "grpo", "eval")
# Every decoding mode at its default knobs, but the one that needs a second (draft) model's weights.
DECODE = {name: GenerationConfig(mode=name) for name, cls in MODES.items() if not cls.decoder.uses_draft_model}
PROGRAMS = TRAIN + tuple(DECODE)


@dataclasses.dataclass(frozen=True)
class AotSettings:
    """What `compile_rows` compiles: each program of `programs` for each preset of `presets` on each target of
    `targets`, on `mesh` (default: FSDP over all chips); train programs at `batch` × `seq`, decoders at
    `decode_batch` prompts of `prompt` tokens + `new`, their layers run by `layer_loop`
    (`GenerationConfig.layer_loop`); every model with `attention` and `remat`. roofline: each program's
    roofline row too (`costed_row`: more compiles, of two- and four-layer programs)."""

    targets: tuple[str, ...] = ("tpu:v5e:4x4",)
    presets: tuple[str, ...] = ("qwen3-1.7b", "qwen3-4b")
    programs: tuple[str, ...] = PROGRAMS
    mesh: shd.MeshConfig = shd.MeshConfig(data=1, fsdp=-1, tensor=1)
    seq: int = 4096
    batch: int = 64
    decode_batch: int = 64
    prompt: int = 1024
    new: int = 8192
    attention: str = "auto"
    remat: bool = True
    layer_loop: str = "auto"
    roofline: bool = True

    def check(self) -> None:
        """ValueError naming the first bad setting (before anything compiles)."""
        for name in ("seq", "batch", "decode_batch", "prompt", "new"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: expected a positive integer")
        bad = [n for n in self.programs if n not in PROGRAMS]
        if bad or not self.programs:
            raise ValueError(f"--programs {','.join(self.programs)!r}: expected 'all' or a comma-separated subset "
                             f"of {','.join(PROGRAMS)}")
        for t in self.targets:
            target_lib.parse(t)
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(f"--layer-loop={self.layer_loop!r}: expected one of {', '.join(LAYER_LOOPS)}")


@dataclasses.dataclass(frozen=True)
class AotRow:
    """One compiled (or refused) program, per chip; sizes in GiB. `as_json()` is the row of `aot.json`."""

    target: str
    preset: str
    program: str
    mesh: str  # data/fsdp/tensor sizes
    shape: str  # "rows × seq", or "batch × prompt+new" for a decoder
    hbm_gib: float | None  # the chip's memory (None: unknown, e.g. a CPU)
    status: str  # "compiled" or "error"
    compile_s: float
    kernel: str | None = None  # None when lowering failed
    error: str | None = None  # the compiler's first error line
    arguments_gib: float | None = None
    outputs_gib: float | None = None
    temporaries_gib: float | None = None
    total_gib: float | None = None
    fits: bool | None = None
    roofline: dict | None = None  # `costed_row`'s, for a compiled program when asked

    def as_json(self) -> dict:
        row = {k: getattr(self, k) for k in ("target", "preset", "program", "mesh", "shape", "hbm_gib")}
        if self.kernel is not None:
            row["kernel"] = self.kernel
        row["status"] = self.status
        if self.status == "error":
            return {**row, "error": self.error, "compile_s": self.compile_s}
        return {**row, "compile_s": self.compile_s,
                **{k: getattr(self, k) for k in ("arguments_gib", "outputs_gib", "temporaries_gib", "total_gib",
                                                 "fits")}, **({"roofline": self.roofline} if self.roofline else {})}


def _weights(cfg, mesh, lora: LoraConfig | None = None):
    """Abstract params in the compute dtype (as a converted checkpoint holds them), on the mesh; with `lora`,
    (params, adapter)."""
    c = cfg.replace(param_dtype=cfg.dtype)
    params = jax.eval_shape(lambda k: model_lib.init_params(c, k), jax.random.PRNGKey(0))
    params = abstract_like(params, shd.tree_shardings(params, mesh))
    if lora is None:
        return params
    adapter = jax.eval_shape(lambda k: lora_lib.init_lora(cfg, lora, k), jax.random.PRNGKey(0))
    return params, abstract_like(adapter, shd.tree_shardings(adapter, mesh))


def _train_lowered(objective, init_trainable, frozen, mesh, batch: dict, evaluate: bool = False):
    """The trainer's step for `objective` (`train.step.build_steps`, as `train.loop.train` builds it), lowered on
    abstract inputs: trainable = `init_trainable(key)`, `frozen` abstract and placed (or None)."""
    frozen_sh = None if frozen is None else jax.tree.map(lambda x: x.sharding, frozen)
    steps = build_steps(objective, OptimConfig(lr=1e-4, warmup_steps=0), TOTAL_STEPS, init_trainable, mesh,
                        tuple(batch), jax.random.PRNGKey(0), frozen_shardings=frozen_sh)
    static = objective.static_at(0, TOTAL_STEPS)
    state = abstract_like(steps.abstract_state, steps.shardings)
    if not evaluate:
        return steps.cache.train(static).lower(state, frozen, batch)
    rep = shd.replicated(mesh)
    scalar = lambda dtype, shape=(): jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
    return steps.cache.eval(static).lower(state["params"], state.get("carry"), frozen, batch,
                                          scalar(jnp.uint32, (2,)), scalar(jnp.int32))


def _train_program(program: str, cfg, mesh, rows: int, seq: int, new: int, layers: int | None = None):
    """(objective, init_trainable, frozen, batch, the config whose FLOPs the objective's `forward_passes` count)
    of the train-side `program` for model `cfg`; at `layers` layers, unrolled, when given (the roofline's
    compiles: a draft model keeps the size the whole model gives it, unrolled)."""
    tokens = abstract_batch(mesh, token_shapes(rows, seq))
    base = cfg if layers is None else rl.unrolled(cfg, layers)
    init = lambda k: model_lib.init_params(base, k)  # noqa: E731
    if program in ("zarya", "zarya-nonslotted", "eval"):
        zc = ZaryaConfig(slotted_training=program != "zarya-nonslotted")
        return zarya_objective(base, zc), init, None, tokens, cfg
    if program == "drafter":
        lora = LoraConfig()
        return (drafter_objective(base, lora, DrafterConfig()), lambda k: lora_lib.init_lora(base, lora, k),
                _weights(base, mesh), tokens, cfg)
    if program == "draft-model":
        student = draft_model_config(cfg, sized_to(cfg, lora_budget(cfg, LoraConfig())))
        costed = student if layers is None else rl.unrolled(student, student.num_layers)
        return (distill_objective(costed, base, DistillConfig()), lambda k: model_lib.init_params(costed, k),
                _weights(base, mesh), tokens, student)
    if program == "grpo":
        g = min(new, seq - seq // 4)  # completions after a quarter-length prompt, within the sequence
        shapes = {"tokens": ((rows, seq), jnp.int32), "prompt_lengths": ((rows, 1), jnp.int32),
                  "completions": ((rows, g), jnp.int32), "mask": ((rows, g), bool),
                  "old_logprobs": ((rows, g), jnp.float32), "advantages": ((rows, 1), jnp.float32),
                  "ref_logprobs": ((rows, g), jnp.float32)}
        assert tuple(shapes) == GRPO_KEYS
        return grpo_objective(base, grpo.GRPOConfig(), 1.0), init, None, abstract_batch(mesh, shapes), cfg
    raise ConfigError(f"program {program!r}: expected one of {PROGRAMS}")


def train_lowered(program: str, cfg, mesh, rows: int, seq: int, new: int, layers: int | None = None):
    """The lowered train-side `program` (one of `TRAIN`) for model `cfg` at `rows` × `seq` on `mesh` (at
    `layers` layers, unrolled, when given)."""
    objective, init, frozen, batch, _ = _train_program(program, cfg, mesh, rows, seq, new, layers)
    return _train_lowered(objective, init, frozen, mesh, batch, program == "eval")


def decode_lowered(program: str, cfg, mesh, batch: int, prompt: int, new: int, layer_loop: str = "auto"):
    """The lowered `generate()` program of decoding mode `program` (one of `DECODE`)."""
    gc = DECODE[program].replace(max_new_tokens=new, layer_loop=layer_loop)
    if getattr(gc.mode, "drafter", None) == "lora":
        lora = LoraConfig()
        params, adapter = _weights(cfg, mesh, lora)
        return generate_lib.lower(params, cfg, gc, batch, prompt, mesh=mesh, lora_params=adapter, lora=lora)
    return generate_lib.lower(_weights(cfg, mesh), cfg, gc, batch, prompt, mesh=mesh)


def pass_lowered(cfg, mesh, batch: int, window: int, rows: int):
    """One cached decode pass (`sampling.passes.cached_pass`, the cache donated) of `window` rows at `batch`
    against a cache of `rows` rows read densely (`cache_block=0`: what the live read of that many rows reads,
    in a form the compiler counts), lowered on `mesh`: params in the compute dtype as the rules place them,
    the cache's rows split over the batch axes and its K/V heads over the tensor axis."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    c = cfg.replace(cache_block=0)
    spec = lambda shape, axes: spec_for(shape, axes, mesh)  # noqa: E731
    at = lambda x, *parts: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(*parts)))  # noqa: E731
    cache = jax.eval_shape(lambda: kv_cache.init(c, batch, rows))
    b = spec((batch,), ("batch",))[0]
    heads = spec((c.num_kv_heads,), ("kv_heads",))[0]
    cache = {"k": at(cache["k"], None, b, heads), "v": at(cache["v"], None, b, heads), "length": at(cache["length"], b)}
    tokens = at(jax.ShapeDtypeStruct((batch, window), jnp.int32), b, None)
    return jax.jit(passes.cached_pass, static_argnames=("config",), donate_argnames=("cache",)).lower(
        _weights(c, mesh), cache, tokens, tokens, config=c)


def _costed(lower_at, layers: int) -> tuple[rl.Counts, str]:
    """(counts at `layers` layers extrapolated from `rl.LAYERS`, the attention kernel) of `lower_at(depth)`."""
    found, kern = [], "dense"
    for depth in rl.LAYERS:
        lowered = lower_at(depth)
        text = lowered.as_text()
        found.append(rl.counts(lowered.compile(), text))
        kern = kernel(text)
    return rl.extrapolate(*found, layers), kern


@functools.lru_cache(maxsize=256)
def pass_counts(cfg, mesh, batch: int, window: int, rows: int) -> rl.Counts:
    """The compiler's counts of one decode pass (`pass_lowered`) at the model's depth (one compile per depth of
    `rl.LAYERS`, shared by every decoder that runs that pass)."""
    return _costed(lambda depth: pass_lowered(rl.unrolled(cfg, depth), mesh, batch, window, rows), cfg.num_layers)[0]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def costed_row(program: str, cfg, mesh, s: AotSettings) -> dict | None:
    """The roofline of `program` per chip by the target's cost model (`bench.roofline`; None for a chip the
    tables do not know): a train step's counts at the model's depth, with the hand bound 6N + attention
    FLOPs ÷ peak and the MFU bound it gives (hand ÷ roofline time); a decoder's cycle (its passes,
    `passes.cycle_windows`, each at the mean live context of a `prompt` + `new` decode: mode A and B, whose
    cycles these do not cost, one pass) with the hand bound weights + live K/V ÷ bandwidth, every pass listed."""
    chip = rl.Chip.of(mesh.devices.flat[0])
    if chip is None:
        return None
    chips = mesh.devices.size
    if program in DECODE:
        gc = DECODE[program].replace(max_new_tokens=s.new)
        cycle = passes.cycle_windows(gc)
        windows = cycle or (passes.window_rows(gc),)
        rows = rl.live_rows(s.prompt + s.new // 2, cfg.cache_block)
        per = {w: pass_counts(cfg, mesh, s.decode_batch, w, rows) for w in windows}
        total = functools.reduce(lambda a, b: a + b, (per[w] for w in windows))
        least = rl.decode_hand_bytes(cfg, chips, s.decode_batch, rows)  # what each pass must read per chip
        return {"counted": ("cycle of passes " + "+".join(map(str, windows))) if cycle else f"pass of {windows[0]}",
                "live_rows": rows, **_figures(chip, total, len(windows) * least),
                "hand_ms": _ms(len(windows) * least / chip.bandwidth), "kernel": "dense",
                "passes": [{"window": w, **_figures(chip, per[w], least), "hand_ms": _ms(least / chip.bandwidth)}
                           for w in sorted(per)]}
    counted, kern = _costed(lambda depth: train_lowered(program, cfg, mesh, s.batch, s.seq, s.new, depth),
                            cfg.num_layers)
    objective, _, _, _, flops_cfg = _train_program(program, cfg, mesh, s.batch, s.seq, s.new)
    flops = train_flops_per_token(flops_cfg, s.seq, objective.forward_passes) * s.batch * s.seq / chips
    hand = (flops / 3 if program == "eval" else flops) / chip.peak  # the evaluation runs the forward only
    row = {"counted": "step", **_figures(chip, counted), "hand_ms": _ms(hand),
           "mfu_bound": hand / chip.seconds(counted), "kernel": kern}
    if kern == "splash":
        row["note"] = "splash attention is a custom call: its FLOPs and bytes are not in the counts"
    return row


def _figures(chip: rl.Chip, c: rl.Counts, least_bytes: float = 0.0) -> dict:
    """The counts and their roofline; a decoder's bytes no fewer than its passes must read (`least_bytes`)."""
    return {"gflops": c.flops / 1e9, "gbytes": c.bytes / 1e9, "roofline_ms": _ms(chip.seconds(c, least_bytes)),
            "bound": chip.bound(c, least_bytes), "optimal_ms": _ms(c.optimal_s), "loops": c.loops}


def kernel(text: str) -> str:
    """The attention kernel a program's text holds: 'splash' (a Pallas TPU kernel, the only one attention uses),
    'cudnn' (cuDNN's fused attention: named only in the compiled program, the lowered one holds a partitioning
    callback), else 'dense'."""
    return "splash" if "tpu_custom_call" in text else "cudnn" if "__cudnn$fmha" in text else "dense"


def _cudnn_attention(cfg) -> bool:
    """Whether a GPU runs `cfg`'s causal attention with cuDNN's kernel (`nn.attention`: dot_product in bf16/fp16)."""
    return (attention_lib.resolve(cfg.attention, "gpu", cfg.jnp_dtype, attention_lib.SPLASH_BLOCK, cfg.head_dim)
            == "dot_product" and cfg.jnp_dtype in (jnp.bfloat16, jnp.float16))


def compile_row(program: str, target: str, preset_name: str, mesh, s: AotSettings) -> AotRow:
    """`program` of `preset_name` compiled for `mesh` (of `target`'s devices); the compiler's refusal is a row too."""
    cfg = model_config(preset_name, remat=s.remat, attention=s.attention)
    decode = program in DECODE
    hbm = target_lib.hbm_bytes(mesh.devices.flat[0])
    row = dict(target=target, preset=preset_name, program=program,
               mesh="/".join(str(mesh.shape[a]) for a in shd.MESH_AXES),
               shape=f"{s.decode_batch} × {s.prompt}+{s.new}" if decode else f"{s.batch} × {s.seq}",
               hbm_gib=None if hbm is None else hbm / GIB)
    t0 = time.perf_counter()
    try:
        lowered = (decode_lowered(program, cfg, mesh, s.decode_batch, s.prompt, s.new, s.layer_loop) if decode
                   else train_lowered(program, cfg, mesh, s.batch, s.seq, s.new))
        row["kernel"] = kernel(lowered.as_text())
        compiled = lowered.compile()
        if row["kernel"] == "dense":  # cuDNN's kernel shows only in the compiled program
            row["kernel"] = kernel(compiled.as_text())
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the result
        lines = [line for line in str(e).splitlines() if line.strip()]
        return AotRow(**row, status="error", error=(lines[0] if lines else type(e).__name__)[:300],
                      compile_s=time.perf_counter() - t0)
    m = target_lib.memory(compiled)
    compile_s = time.perf_counter() - t0
    roofline = None
    if s.roofline:
        try:
            roofline = costed_row(program, cfg, mesh, s)
        except Exception as e:  # noqa: BLE001 - a costing compile refused is reported, the program still compiled
            roofline = {"error": ([line for line in str(e).splitlines() if line.strip()] or [type(e).__name__])[0][:300]}
    return AotRow(**row, status="compiled", compile_s=compile_s,
                  **{f"{k}_gib": v / GIB for k, v in m.items() if k != "aliased"},
                  fits=None if hbm is None else m["total"] <= hbm, roofline=roofline)


def _check_cudnn(s: AotSettings) -> None:
    """A ConfigError when a GPU target would trace cuDNN's attention without the cuDNN library installed."""
    cudnn = [name for name in s.presets if _cudnn_attention(model_config(name, attention=s.attention))]
    gpus = [t for t in s.targets if target_lib.parse(t)[0] == "gpu"]
    if cudnn and gpus:
        target_lib.devices(gpus[0])  # starts the CUDA plugin, which loads cuDNN where it is installed
        if not target_lib.has_cudnn():
            raise ConfigError(f"--target {','.join(s.targets)}: {','.join(cudnn)} with attention={s.attention!r} "
                              "runs cuDNN's flash attention on a GPU, and JAX reads the cuDNN library's version to "
                              "trace it: pip install --no-deps 'nvidia-cudnn-cu12>=9.8,<10' (no GPU needed), or "
                              "--attention dense")


def compile_rows(s: AotSettings, log=print) -> list[AotRow]:
    """Every (target, preset, program) of `s` compiled, in that order; `log` gets a line per program."""
    s.check()
    _check_cudnn(s)
    rows = []
    for t in s.targets:
        mesh = shd.make_mesh(s.mesh, target_lib.devices(t))
        for name in s.presets:
            for program in s.programs:
                rows.append(compile_row(program, t, name, mesh, s))
                log(f"{t} {name} {program}: {rows[-1].status} ({rows[-1].compile_s:.0f} s)")
    return rows


def markdown(rows: list[AotRow]) -> str:
    table = [r.as_json() for r in rows]
    columns = ["target", "preset", "program", "mesh", "shape", "status", "kernel", "arguments_gib", "outputs_gib",
               "temporaries_gib", "total_gib", "hbm_gib", "fits", "compile_s"]
    md = ["Per chip, from the target's compiler (GiB; total = arguments + outputs − donated + temporaries):", "",
          markdown_table(table, columns)]
    costed = [{**{k: r[k] for k in ("target", "preset", "program", "shape")}, **r["roofline"]}
              for r in table if r.get("roofline")]
    if costed:
        md += ["Roofline per chip, by the target compiler's cost model (not a measurement; `zarya_jax.bench.roofline`): "
               "GFLOPs and GB accessed, roofline ms = max(bytes ÷ HBM bandwidth, FLOPs ÷ peak), the compiler's "
               "optimal ms where positive, and the hand bound (a train step: 6N + attention FLOPs ÷ peak, and the MFU "
               "bound hand ÷ roofline; a decoder: weights + live K/V ÷ bandwidth per pass) for a train step or "
               "a decoder's cycle at the mean live context; `loops`: loop bodies the counts hold once:", "",
               markdown_table(costed, ["target", "preset", "program", "shape", "counted", "gflops", "gbytes",
                                       "roofline_ms", "bound", "optimal_ms", "hand_ms", "mfu_bound", "loops",
                                       "kernel", "note", "error"])]
        per_pass = [{**{k: r[k] for k in ("target", "preset", "program")}, "live_rows": r["live_rows"], **p}
                    for r in costed if "passes" in r for p in r["passes"]]
        if per_pass:
            md += ["Each decoder's passes (window rows; the cache read densely at `live_rows`):", "",
                   markdown_table(per_pass, ["target", "preset", "program", "window", "live_rows", "gflops",
                                             "gbytes", "roofline_ms", "bound", "optimal_ms", "hand_ms"])]
    errors = [r for r in table if r["status"] == "error"]
    if errors:
        md += ["First error line of each program that did not compile:", "",
               markdown_table(errors, ["target", "preset", "program", "error"])]
    return "\n".join(md)


def run(s: AotSettings) -> tuple[dict, str]:
    """(results: {'rows': [AotRow.as_json()]}, Markdown)."""
    rows = compile_rows(s, log=lambda line: print(line, flush=True))
    return {"rows": [r.as_json() for r in rows]}, markdown(rows)
