"""The quickstart end to end in its --smoke setting: real training, a real Orbax checkpoint, every
decoding mode, report files with real numbers. The AR outputs are checked against an independent
greedy decode with full (uncached) forwards, and lossless self-speculation against AR."""
import dataclasses
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import quickstart
from zarya_jax.eval import answers, tasks
from zarya_jax.experiment.report import render_report
from zarya_jax.sampling import passes


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("qs"))
    assert quickstart.main(["--smoke", "--workdir", workdir, "--no-progress"]) == 0
    with open(os.path.join(workdir, "report.json")) as f:
        report = json.load(f)
    preds = [json.loads(l) for l in open(os.path.join(workdir, "eval", "predictions.jsonl"))]
    return workdir, report, preds


def test_report_files_and_numbers(smoke_run):
    workdir, report, preds = smoke_run
    for name in ("report.json", "report.md", "report.png"):
        assert os.path.getsize(os.path.join(workdir, name)) > 0
    assert open(os.path.join(workdir, "report.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.isdir(os.path.join(workdir, "train", "final"))          # the Orbax checkpoint
    assert report["train"]["step"] == 4 and math.isfinite(report["train"]["loss"])
    assert [s for s, _ in report["loss_curve"]] == [1, 2, 3, 4]
    assert [r["mode"] for r in report["modes"]] == ["ar", "mdm", "slotted", "spec-self", "spec-lora", "spec-self-fused",
                                                    "spec-lora-fused"]
    for r in report["modes"]:
        assert r["examples"] == 4
        assert 0.0 <= r["accuracy"] <= 1.0
        assert r["tokens_per_forward"] > 0 and r["tokens_per_s"] > 0 and math.isfinite(r["tokens_per_s"])
        assert r["speedup_vs_ar"] == pytest.approx(r["tokens_per_s"] / report["modes"][0]["tokens_per_s"])
        # Accuracy recomputed from the per-example file with the extraction rules.
        rows = [p for p in preds if p["mode"] == r["mode"]]
        assert len(rows) == 4
        assert r["accuracy"] == sum(answers.is_correct(p["output"], p["reference"]) for p in rows) / 4
    ar = report["modes"][0]
    assert ar["tokens_per_forward"] == pytest.approx(1.0)  # one token per pass (prefill counts as one)
    md = open(os.path.join(workdir, "report.md")).read()
    assert "| AR |" in md and "mode B (slotted)" in md and "spec, self drafter" in md and "spec, LoRA drafter" in md
    assert "spec, LoRA drafter, fused" in md and "× the tokens per forward of spec, self drafter" in md
    for r in report["modes"][3:]:  # the speculative rows carry the acceptance pooled over their batches
        f = r["generation_config"]["draft_length"]
        fused = r["mode"].endswith("-fused")  # its drafts are d1 … dK; two-pass counts c0 (always kept)
        assert (0.0 if fused else 1.0) <= r["accepted_per_cycle"] <= f and len(r["acceptance_by_position"]) == f
        assert fused or r["acceptance_by_position"][0] == 1.0
    assert "drafts accepted / cycle" in md
    assert os.path.isfile(os.path.join(workdir, "drafter", "adapter", "adapter.safetensors"))
    # The held-out split is the generator's (seed + 1); train, validation and test are disjoint.
    test, val, train = (tasks.read_jsonl(os.path.join(workdir, "data", f"{k}.jsonl")) for k in ("test", "val", "train"))
    assert test == tasks.generate(4, seed=1, difficulty=1) and len(val) == 4
    prompts = [{r["prompt"] for r in split} for split in (train, val, test)]
    assert not (prompts[0] & prompts[1] or prompts[0] & prompts[2] or prompts[1] & prompts[2])
    # Tied to the code that produced it.
    assert set(report["provenance"]) >= {"commit", "dirty", "packages"} and report["provenance"]["packages"]["jax"]
    assert report["config"]["zarya"]["diffusion_loss_proportion"] == 0.3


def test_report_rendered_again_from_report_json(smoke_run):
    """report.md and report.png come from report.json alone: drawn again, without training or evaluation."""
    workdir = smoke_run[0]
    md = open(os.path.join(workdir, "report.md")).read()
    assert "| target | exact match (%) | exact match − AR's (points) | tokens / forward |" in md
    for name in ("report.md", "report.png"):
        os.remove(os.path.join(workdir, name))
    render_report(workdir)
    assert open(os.path.join(workdir, "report.md")).read() == md
    assert open(os.path.join(workdir, "report.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_knobs_chosen_on_validation_frontier(smoke_run):
    """Every grid point was decoded on the validation split; each mode's test knobs are the point with the
    most tokens per forward among those losing no validation example to AR (recomputed here)."""
    workdir, report, preds = smoke_run
    front, tol = report["frontier"], report["config"]["frontier"]["tolerance"]
    points = front["points"]
    assert front["validation_examples"] == 4
    assert sum(p["mode"] == "slotted" for p in points) == 4   # 1 S × 1 NB × 1 τs × 2 τt × 2 rules
    assert sum(p["mode"] == "mdm" for p in points) == 2 and sum(p["mode"] == "spec-self" for p in points) == 1
    assert sum(p["mode"] == "spec-lora" for p in points) == 1
    assert [p["knobs"] for p in points if p["mode"].endswith("-fused")] == [{"draft_length": 2, "scenarios": 0}] * 2
    ar_val = next(p for p in points if p["mode"] == "ar")
    assert all(len(p["correct"]) == 4 and sum(p["correct"]) == 4 * p["accuracy"] for p in points)
    for row in report["modes"]:
        cands = [p for p in points if p["mode"] == row["mode"]]
        ok = [p for p in cands if sum(a and not c for a, c in zip(ar_val["correct"], p["correct"])) <= tol * 4]
        if not ok:  # none loses no example: the most accurate
            top = max(p["accuracy"] for p in cands)
            ok = [p for p in cands if p["accuracy"] == top]
        best = max(p["tokens_per_forward"] for p in ok)
        assert row["knobs"] in [p["knobs"] for p in ok if p["tokens_per_forward"] == best]
        assert row["generation_config"] | row["knobs"] == row["generation_config"]  # decoded with them
    diag = report["diagnostics"]
    assert set(diag["first_errors"]) == {r["mode"] for r in report["modes"]}
    drafter = diag["drafter"]  # teacher-forced agreement and decode-time acceptance, by draft position
    f = drafter["draft_length"]
    assert drafter["teacher_forced"][0] is None and len(drafter["teacher_forced"]) == f
    assert all(x is None or 0.0 <= x <= 1.0 for x in drafter["teacher_forced"])
    assert drafter["decode"] == next(r for r in report["modes"] if r["mode"] == "spec-lora")["acceptance_by_position"]
    test = tasks.read_jsonl(os.path.join(workdir, "data", "test.jsonl"))
    assert diag["heads"]["4"]["overall"]["n"] == sum(len(r["answer"].encode()) + 1 for r in test)  # + EOS
    md = open(os.path.join(workdir, "report.md")).read()
    assert "## Diagnostics" in md and "## Frontier" in md and "tokens / s (batch 1)" in md


def test_ar_matches_uncached_greedy_and_spec_is_lossless(smoke_run):
    from zarya_jax.data.tokenizer import ByteTokenizer
    from zarya_jax import checkpoint
    from zarya_jax.model import forward

    workdir, report, preds = smoke_run
    params, config = checkpoint.load(os.path.join(workdir, "train", "final"))
    tok = ByteTokenizer()
    max_new = report["config"]["eval"]["max_new_tokens"]
    length = 128  # fixed shape, right padding: causal attention makes the padding invisible
    fwd = jax.jit(lambda p, t: forward(p, config, t))
    ar = {p["index"]: p for p in preds if p["mode"] == "ar"}
    for i, p in ar.items():
        ids = tok.encode(p["prompt"])
        out = []
        for _ in range(max_new):
            seq = ids + out
            padded = np.full((1, length), tok.pad_id, np.int32)
            padded[0, : len(seq)] = seq
            logits = np.array(fwd(params, jnp.asarray(padded)))[0, len(seq) - 1]
            logits[config.mask_token_id] = -np.inf  # the mask token is never generated (docs/algorithms.md §4)
            nxt = int(np.argmax(logits))
            out.append(nxt)
            if nxt == config.eos_token_id:
                break
        assert p["output"] == tok.decode(out), f"example {i}"
        assert p["num_tokens"] == len(out)
    for mode in ("spec-self", "spec-lora", "spec-self-fused", "spec-lora-fused"):
        spec = {p["index"]: p["output_ids"] for p in preds if p["mode"] == mode}
        assert spec == {i: p["output_ids"] for i, p in ar.items()}, mode


def test_existing_checkpoint_skips_training(smoke_run, tmp_path):
    workdir, report, preds = smoke_run
    out = str(tmp_path / "again")
    ckpt = os.path.join(workdir, "train", "final")
    assert quickstart.main(["--smoke", "--workdir", out, "--ckpt", ckpt, "--modes", "ar", "--no-progress"]) == 0
    assert not os.path.exists(os.path.join(out, "train"))
    again = json.load(open(os.path.join(out, "report.json")))
    assert again["train"] is None
    assert [p["output"] for p in map(json.loads, open(os.path.join(out, "eval", "predictions.jsonl")))] == \
        [p["output"] for p in preds if p["mode"] == "ar"]


def test_ar_only_baseline(tmp_path, monkeypatch):
    """--objective ar trains the plain next-token baseline through the same pipeline, by default in its own
    workdir (runs/quickstart_ar), so it runs next to the default command's runs/quickstart."""
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "runs" / "quickstart_ar")
    assert quickstart.main(["--smoke", "--objective", "ar", "--modes", "ar", "--no-progress",
                            "--set", "frontier.enabled=false", "--set", "eval.batch1_examples=0"]) == 0
    assert not os.path.exists(tmp_path / "runs" / "quickstart")
    report = json.load(open(os.path.join(out, "report.json")))
    assert report["config"]["train"]["objective"] == "ar" and report["frontier"] is None
    rows = [json.loads(l) for l in open(os.path.join(out, "train", "metrics.jsonl"))]
    logged = [r for r in rows if "loss" in r]  # the training rows (others carry evaluations or timings)
    assert [r["step"] for r in logged] == list(range(1, report["train"]["step"] + 1))
    assert all("acc_seq" in r for r in logged) and not any("loss_dif" in r for r in rows)


def test_bad_flags_leave_no_output(tmp_path, capsys):
    out = str(tmp_path / "bad")
    assert quickstart.main(["--smoke", "--workdir", out, "--steps", "0"]) == 2
    assert "--steps=0" in capsys.readouterr().err
    assert quickstart.main(["--smoke", "--workdir", out, "--set", "zarya.no_such_knob=1"]) == 2
    assert "no_such_knob" in capsys.readouterr().err
    assert quickstart.main(["--smoke", "--workdir", out, "--ckpt", str(tmp_path / "missing")]) == 2
    assert not os.path.exists(os.path.join(out, "report.json"))


def test_rerun_is_a_no_op_and_a_moved_workdir_resumes(smoke_run, tmp_path, capsys):
    """The same command again changes nothing (and says it kept the report); the workdir moved elsewhere
    and evaluated in another way reuses its training (fingerprinted data, recorded numbers: never nulls)
    and re-evaluates."""
    from test_bad_inputs import snapshot

    workdir, report, preds = smoke_run
    before = snapshot(workdir)
    capsys.readouterr()
    assert quickstart.main(["--smoke", "--workdir", workdir, "--no-progress"]) == 0
    assert snapshot(workdir) == before
    printed = capsys.readouterr().out
    assert f"kept {workdir}/report.json" in printed and "wrote" not in printed
    moved = tmp_path / "moved"
    shutil.copytree(workdir, moved)
    metrics = open(moved / "train" / "metrics.jsonl").read()
    assert quickstart.main(["--smoke", "--workdir", str(moved), "--no-progress", "--modes", "ar",
                            "--set", "frontier.enabled=false", "--set", "eval.batch1_examples=0"]) == 0
    again = json.load(open(moved / "report.json"))
    assert again["train"] == report["train"]            # the training's own numbers, not a rerun's nulls
    assert open(moved / "train" / "metrics.jsonl").read() == metrics
    assert [r["mode"] for r in again["modes"]] == ["ar"] and again["modes"][0]["accuracy"] == report["modes"][0]["accuracy"]


def test_fastest_lossless_configuration_per_batch(smoke_run, capsys):
    """The choice for time: per calibrated batch size, AR, the lossless frontier points predicted fastest
    and each lossless mode's best predicted point timed on validation, AR kept unless a candidate beats it
    by the margin in every round, then timed against AR on test; `generate --mode auto` decodes with it."""
    from experiments import generate as generate_cli
    from zarya_jax.eval.speed import SpeedChoice, SpeedConfig, pick, to_time

    workdir, report, _ = smoke_run
    choice = SpeedChoice.load(os.path.join(workdir, "eval", "speed.json"))
    assert choice.to_json() == report["speed"]
    assert [c.batch for c in choice.choices] == [1, 2]
    lossless = {"ar", "spec-self", "spec-lora", "spec-self-fused", "spec-lora-fused"}
    windows = {(r["batch"], r["window"]) for r in choice.costs}
    failed = passes.failed_points(choice.costs)  # a noisy machine's failed points are marked, never priced
    assert all(r["ms_per_pass"] > 0 for r in choice.costs if (r["batch"], r["window"]) not in failed)
    assert all(r["ms_per_pass"] is None and r["failed"] for r in choice.costs if (r["batch"], r["window"]) in failed)
    for c in choice.choices:
        modes = {x.mode for x in c.candidates}  # every lossless point is priced, no lossy one
        assert modes == lossless if not any(b == c.batch for b, _ in failed) else "ar" in modes <= lossless
        assert c.candidates[0].mode == "ar" and c.candidates[0].predicted_speedup == 1.0
        assert (c.batch, 1) in windows
        timed = [x for x in c.candidates if x.tokens_per_s is not None]
        assert timed == c.candidates[:len(timed)] and timed[0].mode == "ar"
        # AR unless a candidate beat it by the margin in every round; of those the greatest median speed-up
        assert c.chosen == pick(timed, choice.margin) and choice.margin == SpeedConfig().margin
        assert all(len(x.round_speedups) == len(timed[0].round_speedups) for x in timed)
        # the timed ones: AR, the 3 best predicted and each lossless mode's best predicted point
        predicted = sorted(c.candidates, key=lambda x: (x.mode != "ar", -x.predicted_speedup))
        assert [(x.mode, x.point) for x in timed] == [(x.mode, x.point) for x in to_time(predicted, 3)]
        assert {x.mode for x in timed} == modes
        assert c.test_tokens_per_s > 0 and c.test_ar_tokens_per_s > 0
    assert "## Fastest lossless configuration per batch size" in open(os.path.join(workdir, "report.md")).read()
    # --mode auto: the choice at the calibrated batch nearest to the batch, said on stderr
    ckpt = os.path.join(workdir, "train", "final")
    capsys.readouterr()
    assert generate_cli.main(["--ckpt", ckpt, "--prompt", "Ann had 3 eggs", "--mode", "auto", "--speed",
                              os.path.join(workdir, "eval", "speed.json"), "--lora",
                              os.path.join(workdir, "drafter", "adapter"), "--max-new-tokens", "4"]) == 0
    chosen = choice.mode_for(1)[0]
    assert f"# auto: {chosen.name} {chosen.short()} for batch 1 (chosen at batch 1" in capsys.readouterr().err
    assert generate_cli.main(["--ckpt", ckpt, "--prompt", "x", "--mode", "auto"]) == 2
    assert "--mode auto needs --speed FILE" in capsys.readouterr().err
    assert generate_cli.main(["--ckpt", ckpt, "--prompt", "x", "--mode", "ar", "--speed", "f.json"]) == 2
    assert "--speed is read by --mode auto only" in capsys.readouterr().err


def test_choice_for_time_again_on_this_device(smoke_run, tmp_path, capsys):
    """`experiments.speed WORKDIR`: a finished experiment's choice made again on the device in use, from its
    report, checkpoint, drafter and splits (here a moved copy of the workdir: the recorded checkpoint path
    is gone, the workdir's own train/final is read), written where `generate --mode auto` reads it."""
    from experiments import speed as speed_cli
    from zarya_jax.eval.speed import SpeedChoice, SpeedConfig, pick, to_time

    workdir, report, _ = smoke_run
    moved = tmp_path / "moved"
    shutil.copytree(workdir, moved)
    doc = json.load(open(moved / "report.json"))
    doc["checkpoint"] = str(tmp_path / "gone" / "train" / "final")
    json.dump(doc, open(moved / "report.json", "w"))
    capsys.readouterr()
    assert speed_cli.main([str(moved), "--set", "batches=[1]", "--set", "confirm=2", "--set", "repeats=1",
                           "--set", "examples=2"]) == 0
    printed = capsys.readouterr().out
    choice = SpeedChoice.load(str(moved / "eval" / "speed-cpu.json"))
    assert [c.batch for c in choice.choices] == [1] and choice.device == "cpu"
    c = choice.choices[0]
    timed = [x for x in c.candidates if x.tokens_per_s is not None]
    # AR, the 2 predicted fastest and every other mode's predicted fastest point
    predicted = sorted(c.candidates, key=lambda x: (x.mode != "ar", -x.predicted_speedup))
    assert [(x.mode, x.point) for x in timed] == [(x.mode, x.point) for x in to_time(predicted, 2)]
    assert {x.mode for x in timed} == {x.mode for x in c.candidates} and timed[0].mode == "ar" and c.chosen in timed
    assert c.chosen == pick(timed, SpeedConfig().margin) and c.test_ar_tokens_per_s > 0
    # the candidates are the report's lossless frontier points, with the report's tokens per forward
    front = {(p["mode"], p["point"]): p["tokens_per_forward"] for p in report["frontier"]["points"]}
    assert all(front[x.mode, x.point] == x.tokens_per_forward for x in c.candidates)
    assert printed.count("**(chosen)**") == 1 and f"wrote {moved}/eval/speed-cpu.json" in printed
    # --points chosen: the frontier's chosen point of each lossless mode, every one timed
    out = str(tmp_path / "chosen.json")
    assert speed_cli.main([str(moved), "--points", "chosen", "--set", "batches=[1]", "--set", "repeats=1",
                           "--set", "examples=2", "--out", out, "--no-progress"]) == 0
    again = SpeedChoice.load(out)
    c = again.choices[0]
    lossless = {"ar", "spec-self", "spec-lora", "spec-self-fused", "spec-lora-fused"}
    chosen = {(m, p["point"]) for m, p in report["frontier"]["chosen"].items() if m in lossless}
    priced = {(x.mode, x.point) for x in c.candidates}
    # a point a loaded machine measured out of order is never used: only its candidates may be missing
    assert priced == chosen if not passes.failed_points(again.costs) else ("ar", "") in priced <= chosen
    assert all(x.tokens_per_s for x in c.candidates)
    # predicted for a TPU target at the model's own shape, with the acceptance the frontier measured
    assert speed_cli.main([str(moved), "--target", "tpu:v5e:2x2", "--preset", "tiny", "--batches", "2", "--prompt",
                           "16", "--new", "16", "--no-progress"]) == 0
    predicted = json.load(open(moved / "eval" / "predicted-tpu-v5e-2x2.json"))
    assert "validation frontier" in predicted["acceptance"] and "not measured" in predicted["label"]
    priced = {(x["mode"], x["knobs"]): x["tokens_per_forward"] for x in predicted["batches"][0]["candidates"]}
    assert {m for m, _ in priced} == lossless and all(front[k] == v for k, v in priced.items())
    # bad input: one error line, nothing written
    assert speed_cli.main([str(tmp_path / "nowhere")]) == 2
    assert "report.json: cannot read it" in capsys.readouterr().err
    assert speed_cli.main([str(moved), "--set", "batches=[0]", "--out", str(tmp_path / "x.json")]) == 2
    assert "speed.batches=[0]" in capsys.readouterr().err and not os.path.exists(tmp_path / "x.json")
    doc["frontier"] = None
    json.dump(doc, open(moved / "report.json", "w"))
    assert speed_cli.main([str(moved), "--out", str(tmp_path / "x.json")]) == 2
    assert "no validation frontier" in capsys.readouterr().err and not os.path.exists(tmp_path / "x.json")


def test_modes_take_turns_when_timed(smoke_run, capsys):
    """`evaluate` times the modes taking turns, `eval.repeats` rounds at the evaluation batch and at batch 1
    (the best of each counting), and every round decodes the same outputs as a single decode."""
    import re

    from zarya_jax.eval.evaluate import EvalConfig, evaluate
    from zarya_jax.inference import load_for_inference

    workdir, _, _ = smoke_run
    model = load_for_inference(os.path.join(workdir, "train", "final"))
    records = tasks.read_jsonl(os.path.join(workdir, "data", "test.jsonl"), model.prompt_format)[:4]
    ev = EvalConfig(modes=("ar", "spec-self"), max_new_tokens=8, batch_size=2, repeats=3, batch1_examples=2)
    capsys.readouterr()
    results, predictions = evaluate(model, records, ev, progress=True)
    bars = re.findall(r"eval ((?:ar|spec-self)(?: at batch 1)?):", capsys.readouterr().err)
    turns = [b for i, b in enumerate(bars) if i == 0 or b != bars[i - 1]]  # one entry per decode
    assert turns == ["ar", "spec-self"] * 3 + ["ar at batch 1", "spec-self at batch 1"] * 3
    once, once_predictions = evaluate(model, records, dataclasses.replace(ev, repeats=1), progress=False)
    assert [p.output_ids for p in predictions] == [p.output_ids for p in once_predictions]
    assert all(r.tokens_per_s > 0 and r.tokens_per_s_batch1 > 0 and r.batch1_examples == 2 for r in results)
    assert [r.tokens_per_forward for r in results] == [r.tokens_per_forward for r in once]
