"""The real Qwen3 path rehearsed offline (`experiments.rehearse`): Qwen3's tokenizer and 151,936-row
embedding through conversion (the mask token in its first unused row), Zarya training on chat-rendered GSM8K records, every decoding mode, lm-eval,
export to transformers (logits and greedy text checked there) and the PEFT drafter, on a tiny model."""
import json

from experiments import rehearse


def test_rehearsal_end_to_end(tmp_path, capsys):
    work = tmp_path / "rehearsal"
    assert rehearse.main(["--workdir", str(work), "--hidden-size", "64", "--num-layers", "1", "--steps", "2",
                          "--records", "8"]) == 0
    report = json.loads((work / "rehearsal.json").read_text())
    stages = [s["stage"] for s in report["stages"]]
    assert stages == ["imports", "tokenizer", "hf_model", "hf_to_jax", "train", "drafter", "evaluate", "lm_eval",
                      "jax_to_hf", "transformers", "peft"]
    assert set(report["checks"]["evaluate"]) == set(rehearse.MODES)
    assert report["checks"]["transformers"]["max_abs_logit_diff"] <= 1e-4
    assert report["checks"]["peft"]["max_abs_logit_diff"] <= 1e-4
    assert all(s["wall_s"] >= 0 and s.get("peak_rss_mb", 1) > 0 for s in report["stages"])
    assert (work / "rehearsal.md").read_text().startswith("Rehearsal: vocab 151936")
    capsys.readouterr()
    assert rehearse.main(["--workdir", str(work)]) == 2  # never over a previous rehearsal
    assert "already holds a rehearsal" in capsys.readouterr().err
