"""PEFT adapters both ways (`conversion.lora_to_peft`, `conversion.peft_to_lora`), checked with the `peft`
package: the Hugging Face Qwen3 exported by `conversion.jax_to_hf` plus the converted adapter, merged by PEFT,
gives the JAX drafter's gate-on logits; an adapter made by PEFT itself imports to the same logits; both
round trips are exact and keep the noise convention."""
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

from conversion import ConversionError, jax_to_hf, lora_to_peft, peft_to_lora
from conversion.peft import to_peft
from zarya_jax import checkpoint, lora
from zarya_jax.config import LoraConfig
from zarya_jax.model import apply, init_params
from zarya_jax.nn.integrity import array_checksums
from zarya_jax.testing import TINY

CONFIG = TINY.replace(tie_word_embeddings=False)
TOKENS = np.random.default_rng(0).integers(0, 256, (2, 12)).astype(np.int32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A random checkpoint, its Hugging Face export, and an adapter with random (non-zero) factors."""
    d = tmp_path_factory.mktemp("peft")
    params = init_params(CONFIG, jax.random.PRNGKey(1))
    checkpoint.save(d / "ckpt", params, CONFIG)
    assert jax_to_hf.main(["--ckpt", str(d / "ckpt"), "--out", str(d / "hf")]) == 0
    cfg = LoraConfig(rank=4, alpha=8.0, noise="mask")
    adapter = lora.init_lora(CONFIG, cfg, jax.random.PRNGKey(2))
    keys = iter(jax.random.split(jax.random.PRNGKey(3), len(lora.PROJECTIONS)))
    adapter = {"layers": {p: {"a": f["a"], "b": 0.05 * jax.random.normal(next(keys), f["b"].shape)}
                          for p, f in adapter["layers"].items()}}
    lora.save(d / "adapter", adapter, cfg)
    assert lora_to_peft.main(["--adapter", str(d / "adapter"), "--out", str(d / "peft")]) == 0
    return {"dir": d, "params": params, "adapter": adapter, "lora": cfg}


def gate_on_logits(params, adapter, cfg) -> np.ndarray:
    logits, _ = apply(params, CONFIG, jnp.asarray(TOKENS), lora_params=adapter, lora=cfg,
                      gate=jnp.ones(TOKENS.shape, bool))
    return np.asarray(logits)


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(TOKENS).long()).logits.float().numpy()


def test_exported_adapter_merged_by_peft_matches_the_gate_on_drafter(models):
    d = models["dir"]
    config = json.loads((d / "peft" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    names = load_file(str(d / "peft" / "adapter_model.safetensors"))
    assert names["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (4, CONFIG.hidden_size)
    assert names["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"].shape == (CONFIG.hidden_size, 4)

    base = AutoModelForCausalLM.from_pretrained(d / "hf", dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, d / "peft").merge_and_unload()
    want = gate_on_logits(models["params"], models["adapter"], models["lora"])
    diff = float(np.abs(hf_logits(merged) - want).max())
    print(f"max |PEFT merged − JAX gate-on| logits = {diff:.2e}")
    assert diff < 1e-4
    assert np.abs(want - gate_on_logits(models["params"], None, None)).max() > 1e-2  # the adapter matters

    # ours → PEFT → ours is exact, noise convention included
    assert peft_to_lora.main(["--peft", str(d / "peft"), "--out", str(d / "back"), "--base", str(d / "ckpt")]) == 0
    back, cfg = lora.load(d / "back")
    assert cfg == models["lora"]
    for p in lora.PROJECTIONS:
        for k in ("a", "b"):
            np.testing.assert_array_equal(np.asarray(back["layers"][p][k]),
                                          np.asarray(models["adapter"]["layers"][p][k], np.float32))


def test_adapter_made_by_peft_imports_exactly(models, tmp_path):
    d = models["dir"]
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(d / "hf", dtype=torch.float32)
    peft_model = get_peft_model(base, PeftLoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj"],
                                                     layers_to_transform=[1], use_rslora=True, init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "made")
    want = hf_logits(peft_model)
    assert peft_to_lora.main(["--peft", str(tmp_path / "made"), "--out", str(tmp_path / "ours"),
                              "--base", str(d / "ckpt")]) == 0
    adapter, cfg = lora.load(tmp_path / "ours")
    assert (cfg.rank, cfg.noise) == (2, "uniform") and cfg.alpha == pytest.approx(6 * 2 ** 0.5)
    assert not np.asarray(adapter["layers"]["k_proj"]["b"]).any() and not np.asarray(adapter["layers"]["q_proj"]["a"][0]).any()
    assert np.abs(gate_on_logits(models["params"], adapter, cfg) - want).max() < 1e-4

    # PEFT → ours → PEFT: the same tensors (zero factors of untargeted modules added) and scale
    assert lora_to_peft.main(["--adapter", str(tmp_path / "ours"), "--out", str(tmp_path / "again")]) == 0
    before, after = load_file(str(tmp_path / "made" / "adapter_model.safetensors")), load_file(
        str(tmp_path / "again" / "adapter_model.safetensors"))
    for name, arr in before.items():
        np.testing.assert_array_equal(after[name], arr)
    assert not any(after[n].any() for n in set(after) - set(before))


def test_adapter_on_some_layers_exports_as_layers_to_transform(models, tmp_path):
    """`LoraConfig.layers="top"` (layer 1 of 2): PEFT gets that layer's factors and layers_to_transform=[1], and
    its merged model is our gate-on drafter (whose layer 0 runs the base, whatever its entries hold)."""
    d = models["dir"]
    cfg = LoraConfig(rank=4, alpha=8.0, noise="mask", layers="top")
    lora.save(tmp_path / "top", models["adapter"], cfg)
    assert lora_to_peft.main(["--adapter", str(tmp_path / "top"), "--out", str(tmp_path / "peft")]) == 0
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["layers_to_transform"] == [1]
    assert {int(re.search(r"layers\.(\d+)\.", n).group(1)) for n in load_file(
        str(tmp_path / "peft" / "adapter_model.safetensors"))} == {1}
    base = AutoModelForCausalLM.from_pretrained(d / "hf", dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, tmp_path / "peft").merge_and_unload()
    want = gate_on_logits(models["params"], models["adapter"], cfg)
    assert np.abs(hf_logits(merged) - want).max() < 1e-4
    assert np.abs(want - gate_on_logits(models["params"], models["adapter"], models["lora"])).max() > 1e-3
    assert peft_to_lora.main(["--peft", str(tmp_path / "peft"), "--out", str(tmp_path / "back")]) == 0
    assert lora.load(tmp_path / "back")[1] == LoraConfig(rank=4, alpha=8.0, noise="mask", layers=(1,))  # PEFT lists ids


def test_unsupported_peft_adapters_are_one_error_line(models, tmp_path, capsys):
    d = models["dir"]
    bad = tmp_path / "dora"
    bad.mkdir()
    (bad / "adapter_model.safetensors").write_bytes((d / "peft" / "adapter_model.safetensors").read_bytes())
    config = json.loads((d / "peft" / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    capsys.readouterr()
    assert peft_to_lora.main(["--peft", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "use_dora=True is not supported" in err[0]
    assert lora_to_peft.main(["--adapter", str(d / "adapter"), "--out", str(d / "peft")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "already exists" in err[0]
    assert not (tmp_path / "o").exists()


def test_non_finite_adapters_are_refused_both_ways(models, tmp_path, capsys):
    """No conversion writes what no training produces: `lora_to_peft` refuses an adapter with a NaN array
    (valid checksums) and `to_peft` an alpha of NaN, so adapter_config.json is always strict JSON;
    `peft_to_lora` refuses NaN/inf lora_alpha, a boolean r and NaN factors. One error line each, naming
    the file and the field, nothing written."""
    d = models["dir"]
    strict = json.loads((d / "peft" / "adapter_config.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"{c} in adapter_config.json"))
    assert strict["lora_alpha"] == 8

    poisoned = {"layers": {**models["adapter"]["layers"], "k_proj": {
        "a": jnp.full_like(models["adapter"]["layers"]["k_proj"]["a"], jnp.nan),
        "b": models["adapter"]["layers"]["k_proj"]["b"]}}}
    flat = {f"layers.{p}.{k}": np.asarray(v, np.float32) for p, f in poisoned["layers"].items() for k, v in f.items()}
    (tmp_path / "nan").mkdir()
    meta = {**lora.metadata(d / "adapter"), "checksums": json.dumps(array_checksums(flat))}
    save_file(flat, str(tmp_path / "nan" / lora.ADAPTER_FILE), metadata=meta)
    with pytest.raises(ConversionError, match="alpha=nan"):
        to_peft(models["adapter"], LoraConfig(rank=4, alpha=float("nan")))

    config = json.loads((d / "peft" / "adapter_config.json").read_text())
    weights = load_file(str(d / "peft" / "adapter_model.safetensors"))

    def peft_dir(name, cfg=config, tensors=weights):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps(cfg))  # json writes NaN as NaN
        save_file(tensors, str(tmp_path / name / "adapter_model.safetensors"))
        return str(tmp_path / name)

    nan_factor = dict(weights)
    name = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"
    nan_factor[name] = np.full_like(weights[name], np.nan)
    runs = [
        (lora_to_peft, ["--adapter", str(tmp_path / "nan")], r"layers\.k_proj\.a holds \d+ non-finite"),
        (peft_to_lora, ["--peft", peft_dir("alpha-nan", {**config, "lora_alpha": float("nan")})],
         "field 'lora_alpha' is nan: expected a finite number > 0"),
        (peft_to_lora, ["--peft", peft_dir("alpha-inf", {**config, "lora_alpha": float("inf")})],
         "field 'lora_alpha' is inf"),
        (peft_to_lora, ["--peft", peft_dir("r-bool", {**config, "r": True})], "field 'r' is True"),
        (peft_to_lora, ["--peft", peft_dir("nan-factor", tensors=nan_factor)],
         r"adapter_model\.safetensors\).*layers\.up_proj\.b holds \d+ non-finite"),
    ]
    for i, (command, args, message) in enumerate(runs):
        capsys.readouterr()
        assert command.main(args + ["--out", str(tmp_path / f"out{i}")]) == 2, args
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
        assert re.search(message, err[0]) and args[1] in err[0], (message, err[0])
        assert not (tmp_path / f"out{i}").exists()
