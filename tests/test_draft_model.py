"""Independent draft models (docs/algorithms.md §7.6): sizing to a parameter budget, the distillation loss
against a direct computation, `experiments.train_draft_model` (both losses) into a checkpoint that
`experiments.evaluate --modes spec-model` decodes losslessly, bad inputs, and the quickstart with a
spec-model row."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import evaluate as evaluate_cli
from experiments import quickstart
from experiments import train_draft_model as train_cli
from zarya_jax import checkpoint
from zarya_jax.config import ConfigError, LoraConfig
from zarya_jax.eval import tasks
from zarya_jax.inference import load_for_inference
from zarya_jax.model import forward, init_params
from zarya_jax.objectives.distill import DistillConfig, distill_loss
from zarya_jax.testing import TINY, batch_of, synthetic_tokens
from zarya_jax.train import draft_model as draft_run

QUICKSTART_BASE = TINY.replace(hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, num_kv_heads=2,
                               head_dim=32)


def _count(params) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def test_sized_to_counts_every_parameter_and_fills_the_budget():
    """The chosen model's `num_params` is its params' real size (tied embedding once); it fits the budget,
    and no other model of the family (enumerated here by brute force) fits it more closely."""
    base = QUICKSTART_BASE
    lora = draft_run.lora_budget(base, LoraConfig(rank=16))
    assert lora == 4 * 16 * ((128 + 128) * 2 + (128 + 64) * 2 + (128 + 384) * 3)  # per layer: q, o; k, v; the MLP
    for budget in (lora, 3 * lora):
        cfg = draft_run.sized_to(base, budget)
        assert cfg.tie_word_embeddings and cfg.vocab_size == base.vocab_size and cfg.head_dim == base.head_dim
        assert (cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id) == (259, 258, 256)
        n = _count(jax.eval_shape(lambda k: init_params(cfg, k), jax.random.PRNGKey(0)))
        assert n == cfg.num_params() <= budget
        others = [base.replace(hidden_size=32 * h, intermediate_size=96 * h, num_layers=l, num_heads=h,
                               num_kv_heads=max(k for k in range(1, max(1, h // 2) + 1) if h % k == 0),
                               tie_word_embeddings=True).num_params()
                  for l in range(1, 5) for h in range(1, 17)]
        assert n == max(o for o in others if o <= budget)
    with pytest.raises(ConfigError, match="budget=100 parameters: below the smallest"):
        draft_run.sized_to(base, 100)


def test_distill_loss_is_the_total_variation_to_the_teacher():
    """On a batch whose answer is its second half: the mean over answer-predicting rows of Σ|q − p| (the
    mask token removed from both softmaxes), computed in NumPy from the two models' logits; zero for a
    student equal to the teacher."""
    teacher_cfg = TINY
    student_cfg = TINY.replace(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    teacher = init_params(teacher_cfg, jax.random.PRNGKey(1))
    student = init_params(student_cfg, jax.random.PRNGKey(2))
    batch = batch_of(synthetic_tokens(np.random.default_rng(0), 3, 12))
    batch["answer_mask"] = jnp.broadcast_to(jnp.arange(12) >= 6, (3, 12))
    cfg = DistillConfig(loss="tv", ce_weight=0.5)
    loss_of = jax.jit(lambda s, t, c: distill_loss(s, t, *c, batch, cfg), static_argnums=2)
    loss, m = loss_of(student, teacher, (student_cfg, teacher_cfg))

    def probs(params, c):
        z = np.asarray(forward(params, c, batch["tokens"]), np.float64)
        z[..., c.mask_token_id] = -np.inf
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)

    q, p = probs(student, student_cfg), probs(teacher, teacher_cfg)
    rows = q[:, 5:11], p[:, 5:11]  # rows 5 … 10 predict answer tokens 6 … 11
    tv = np.abs(rows[0] - rows[1]).sum(-1).mean()
    tokens = np.asarray(batch["tokens"])
    ce = -np.log(np.take_along_axis(rows[0], tokens[:, 6:12, None], -1)[..., 0]).mean()
    np.testing.assert_allclose(float(m["tv"]), tv, rtol=1e-4)
    np.testing.assert_allclose(float(m["ce"]), ce, rtol=1e-4)
    np.testing.assert_allclose(float(loss), tv + 0.5 * ce, rtol=1e-4)
    assert float(m["rows"]) == 18
    _, same = loss_of(teacher, teacher, (teacher_cfg, teacher_cfg))
    assert abs(float(same["tv"])) < 1e-5


@pytest.fixture(scope="module")
def base_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    ckpt = str(root / "base")
    checkpoint.save(ckpt, init_params(TINY, jax.random.PRNGKey(0)), TINY)
    tasks.write_jsonl(str(root / "train.jsonl"), tasks.generate(32, seed=0))
    tasks.write_jsonl(str(root / "test.jsonl"), tasks.generate(3, seed=1))
    return root, ckpt


# the experiment's keys (`draft_model.*`: the same section as the quickstart's and the sweeps')
COMMON = ["--set", "draft_model.steps=2", "--set", "draft_model.batch_size=8", "--set", "data.max_length=96",
          "--set", "train.eval_every=0", "--set", "train.save_every=0", "--set", "train.progress_bar=false",
          "--set", "draft_model.optim.warmup_steps=1"]


@pytest.mark.parametrize("loss", ["ntp", "tv"])
def test_trained_draft_model_decodes_losslessly(base_and_data, loss):
    """Both losses train a budget-sized draft model into a checkpoint of the base's ids; `evaluate` decodes
    with the distilled one exactly AR's outputs."""
    root, base = base_and_data
    work = str(root / f"dm_{loss}")
    assert train_cli.main(["--base", base, "--workdir", work, "--params-ratio", "3", "--lora-rank", "4",
                           "--set", f"draft_model.objective.loss={loss}", "--set", f"data.train={root / 'train.jsonl'}"]
                          + COMMON) == 0
    settings = json.load(open(os.path.join(work, "draft_model.json")))
    budget = 3 * draft_run.lora_budget(TINY, LoraConfig(rank=4))
    assert settings["draft"]["loss"] == loss and settings["params"] <= budget
    run = json.load(open(os.path.join(work, "run_config.json")))  # the section's steps, batch and optimizer ran
    assert (run["train"]["steps"], run["data"]["batch_size"], run["optim"]["lr"]) == (2, 8, 3e-3)
    model = load_for_inference(base, draft=os.path.join(work, "final"))
    assert model.draft_config.num_params() == settings["params"] and model.draft_config.vocab_size == 264
    if loss == "ntp":
        return
    out = str(root / f"eval_{loss}")
    assert evaluate_cli.main(["--ckpt", base, "--data", str(root / "test.jsonl"), "--modes", "ar,spec-model",
                              "--draft-ckpt", os.path.join(work, "final"), "--max-new-tokens", "6",
                              "--knob", "spec-model.draft_length=3", "--out", out]) == 0
    preds = [json.loads(line) for line in open(os.path.join(out, "predictions.jsonl"))]
    ar = {p["index"]: p["output_ids"] for p in preds if p["mode"] == "ar"}
    spec = {p["index"]: p["output_ids"] for p in preds if p["mode"] == "spec-model"}
    assert ar == spec and len(ar) == 3


def test_bad_draft_inputs_exit_2(base_and_data, tmp_path, capsys):
    root, base = base_and_data
    other = str(tmp_path / "other")
    wider = TINY.replace(vocab_size=300)
    checkpoint.save(other, init_params(wider, jax.random.PRNGKey(0)), wider)
    data = str(root / "test.jsonl")
    cases = [
        (evaluate_cli, ["--ckpt", base, "--data", data, "--modes", "spec-model", "--out", str(tmp_path / "e")],
         "needs --draft-ckpt"),
        (evaluate_cli, ["--ckpt", base, "--data", data, "--modes", "spec-model", "--draft-ckpt", other,
                        "--out", str(tmp_path / "e")], "vocab_size=300"),
        (evaluate_cli, ["--ckpt", base, "--data", data, "--modes", "spec-model", "--draft-ckpt",
                        str(tmp_path / "missing"), "--out", str(tmp_path / "e")], "does not exist"),
        (train_cli, ["--base", base, "--workdir", str(tmp_path / "w"), "--params", "10"], "below the smallest"),
        (train_cli, ["--base", base, "--workdir", str(tmp_path / "w"), "--set", "draft_model.objective.loss=kl"],
         "draft_model.objective.loss='kl'"),
        (train_cli, ["--base", base, "--workdir", str(tmp_path / "w"), "--set", "model.head_dim=8"],
         "the model's structure is the base checkpoint's"),
    ]
    # a key of the former layout names its new place
    cases += [(train_cli, ["--base", base, "--workdir", str(tmp_path / "w"), "--set", f"{old}=2"],
               f"config key {old!r} has moved: it is now {new!r}")
              for old, new in [("draft.loss", "draft_model.objective.loss"),
                               ("model.hidden_size", "draft_model.hidden_size"),
                               ("optim.lr", "draft_model.optim.lr"), ("train.steps", "draft_model.steps")]]
    for cli, argv, message in cases:
        assert cli.main(argv) == 2, argv
        assert message in capsys.readouterr().err, message
        assert not os.path.exists(tmp_path / "e") and not os.path.exists(tmp_path / "w")


def test_quickstart_with_a_draft_model_row(base_and_data, tmp_path):
    """The smoke quickstart on a checkpoint, with `spec-model` among its modes, trains the draft model for
    it, chooses F on validation and reports a lossless row."""
    _, base = base_and_data
    out = str(tmp_path / "qs")
    assert quickstart.main(["--smoke", "--workdir", out, "--ckpt", base, "--modes", "ar,spec-model", "--no-progress",
                            "--set", "eval.batch1_examples=0", "--set", "draft_model.objective.loss=ntp"]) == 0
    report = json.load(open(os.path.join(out, "report.json")))
    assert [m["mode"] for m in report["modes"]] == ["ar", "spec-model"]
    row = report["modes"][1]  # F = 4 (the smoke grid): 0 … 4 drafts kept per cycle, one rate per draft
    assert 0 <= row["accepted_per_cycle"] <= 4 and len(row["acceptance_by_position"]) == 4
    assert [p["mode"] for p in report["frontier"]["points"]] == ["ar", "spec-model"]
    lossless = [t for t in report["targets"] if "draft model" in t["target"]]
    assert len(lossless) == 1 and lossless[0]["met"], report["targets"]
    assert json.load(open(os.path.join(out, "draft_model", "draft_model.json")))["draft"]["loss"] == "ntp"


def test_draft_model_config_is_the_experiments_section_and_hashable():
    """The command line's `draft_model` section is the experiment's (`DraftModelRun`), sized alike (explicit or
    `params_ratio` × an adapter's parameters), and both configs hash, equal configs equal."""
    from zarya_jax import overrides as ov
    from zarya_jax.experiment.config import default_config

    size = {"draft_model.hidden_size": 32, "draft_model.intermediate_size": 64, "draft_model.num_layers": 1,
            "draft_model.num_heads": 2, "draft_model.num_kv_heads": 1, "draft_model.optim.lr": 1e-3}
    cfg = draft_run.load_config("tiny", size)
    exp = ov.apply(default_config(), size)
    assert cfg.draft_model == exp.draft_model and type(exp.draft_model) is draft_run.DraftModelRun
    model = cfg.draft_model.size(TINY, LoraConfig(rank=4))
    assert (model.hidden_size, model.num_layers, model.head_dim, model.vocab_size) == (32, 1, TINY.head_dim, 264)
    ratio = draft_run.load_config("tiny", {"draft_model.params_ratio": 2}).draft_model
    assert ratio.size(TINY, LoraConfig(rank=4)).num_params() <= 2 * draft_run.lora_budget(TINY, LoraConfig(rank=4))
    assert hash(cfg) == hash(draft_run.load_config("tiny", size)) and cfg != draft_run.load_config("tiny", {})
