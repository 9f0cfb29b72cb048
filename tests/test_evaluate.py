"""Answer extraction and exact-match scoring, mode and knob parsing, the summary table (the evaluate pipeline
end to end runs in test_quickstart, its outputs and progress in test_evaluate_outputs)."""
import dataclasses

import pytest

from zarya_jax import overrides as ov
from zarya_jax.eval import answers, evaluate
from zarya_jax.eval.results import ModeResult
from zarya_jax.sampling import GenerationConfig, modes


@pytest.mark.parametrize("text,expected", [
    ("7+5=12\n12-3=9\n#### 9", "9"),
    ("#### 9\n#### 10", "10"),                      # the last marker wins
    ("steps...\n####   1,234\nextra text", "1234"),  # first line after the marker, commas dropped
    ("#### -0042", "-42"),
    ("#### +3", "3"),
    ("#### 7.50", "7.5"),
    ("#### 7.0", "7"),
    ("#### 12.", "12"),
    ("#### the  answer is   blue", "the answer is blue"),
    ("7+5=12\n12-3=9\n", None),                      # no marker: no prediction
    ("#### ", None),
])
def test_final_line(text, expected):
    assert answers.extract(text, "final") == expected


def test_regex_and_exact():
    assert answers.extract("so x = 4 and then x = 17.", "regex", r"x = (\d+)") == "17"
    assert answers.extract("The answer: 12", "regex", r"\d+") == "12"
    assert answers.extract("nothing here", "regex", r"(\d+)") is None
    assert answers.extract("  Paris \n", "exact") == "Paris"
    with pytest.raises(ValueError, match="needs a pattern"):
        answers.extract("x", "regex")
    with pytest.raises(ValueError, match="unknown answer extraction method 'fuzzy'"):
        answers.extract("x", "fuzzy")


def test_is_correct():
    gold = "7+5=12\n12-3=9\n#### 9"
    assert answers.is_correct("7+5=12\n12-3=9\n#### 9", gold)
    assert answers.is_correct("wrong work\n#### 9.0", gold)        # only the final answer is scored
    assert not answers.is_correct("7+5=12\n12-3=9\n#### 8", gold)
    assert not answers.is_correct("7+5=12\n12-3=9", gold)           # truncated output
    assert not answers.is_correct("#### 19", gold)
    assert answers.is_correct("#### 42", "42")                      # a plain short-answer reference
    assert answers.is_correct("Paris", "Paris", "exact")


def test_mode_and_knob_parsing():
    assert evaluate.parse_modes("ar, slotted,spec-self") == ["ar", "slotted", "spec-self"]
    assert evaluate.MODES == tuple(modes.MODES)  # one list of names: the registry's
    with pytest.raises(ValueError, match=r"unknown mode\(s\) \['beam'\]"):
        evaluate.parse_modes("ar,beam")
    knobs = evaluate.parse_knobs(["slotted.slot_size=4", "*.temperature=0.5", "top_p=0.9", "spec-self.draft_length=3",
                                  "spec-self.temperature=1"])
    assert knobs == {"slotted": {"slot_size": 4}, "*": {"temperature": 0.5, "top_p": 0.9},
                     "spec-self": {"draft_length": 3, "temperature": 1.0}}
    with pytest.raises(ValueError, match="expected MODE.FIELD=VALUE"):
        evaluate.parse_knobs(["slot_size"])
    with pytest.raises(ValueError, match="unknown mode 'beam'"):
        evaluate.parse_knobs(["beam.width=3"])
    # knobs are typed from the mode's dataclass: a field it does not have names its fields, a bad value its type
    with pytest.raises(ValueError, match=r"knob slotted.slot_sise: mode 'slotted' has no field 'slot_sise' "
                                         r"\(did you mean \['slot_size'.*its fields are \['slot_size', "):
        evaluate.parse_knobs(["slotted.slot_sise=4"])
    with pytest.raises(ValueError, match=r"knob ar.slot_size: mode 'ar' has no field 'slot_size'; its fields are \[\]"):
        evaluate.parse_knobs(["ar.slot_size=4"])
    with pytest.raises(ValueError, match=r"knob \*.slot_size: not a shared sampling field; it is a field of mode\(s\) "
                                         r"\['slotted'\]"):
        evaluate.parse_knobs(["slot_size=4"])
    with pytest.raises(ValueError, match="slotted.slot_size='four': expected an integer"):
        evaluate.parse_knobs(["slotted.slot_size=four"])
    with pytest.raises(ValueError, match="has no field 'mode'"):  # the mode is chosen, never a knob
        evaluate.parse_knobs(["ar.mode=mdm"])
    gc = evaluate.generation_config("slotted", 16, evaluate.parse_knobs(["*.top_k=2", "slotted.slot_size=4"]))
    assert gc == GenerationConfig(mode=modes.mode("slotted", slot_size=4), max_new_tokens=16, temperature=0.0, top_k=2)
    with pytest.raises(ValueError, match="knobs for unknown mode"):
        evaluate.check_mode_knobs(["ar"], {"beam": {"width": 3}})
    with pytest.raises(ValueError, match=r"knobs.slotted.slot_size=0: expected an integer ≥ 1"):
        evaluate.EvalConfig(modes=("slotted",), knobs=evaluate.mode_knobs({"slotted": {"slot_size": 0}}))


def test_every_mode_field_is_a_knob_everywhere():
    """A mode's fields reach `--knob`, `eval.knobs` and the `--help` listing from the registry alone: no list
    of fields outside the mode's own file."""
    rows = {k: (t, d) for k, t, d in ov.keys(evaluate.EvalConfig)}
    for name, cls in modes.MODES.items():
        for f in dataclasses.fields(cls):
            value = f.default
            knobs = evaluate.parse_knobs([f"{name}.{f.name}={value}"])
            assert evaluate.generation_config(name, 64, knobs).mode == cls()  # typed: the default, parsed back
            assert getattr(ov.apply(evaluate.EvalConfig(), {f"knobs.{name}.{f.name}": value}).knobs.as_dict()[name],
                           "get")(f.name) == value
        assert rows[f"knobs.{name}.FIELD"][1] == "-"
    assert set(evaluate.ModeKnobs().as_dict()) == set(modes.MODES)


def test_summary_table_shows_compile_time():
    """The printed summary carries each mode's compile seconds (at batch 1 too), not only summary.json."""
    row = ModeResult(mode="ar", label="AR", examples=2, accuracy=0.5, tokens_per_forward=1.0, tokens_per_s=10.0,
                     generated_tokens=20, wall_s=2.0, compile_s=None, batch_size=8, generation_config={},
                     speedup_vs_ar=1.0)
    table = evaluate.summary_markdown([dataclasses.replace(row, compile_s=12.34)])
    assert table.splitlines()[0].endswith("| compile s |") and table.splitlines()[2].endswith("| 12.3 |")
    both = evaluate.summary_markdown([dataclasses.replace(row, compile_s=12.34, tokens_per_s_batch1=3.0,
                                                          speedup_vs_ar_batch1=1.0, compile_s_batch1=2.0)])
    assert both.splitlines()[2].endswith("| 12.3 + 2.0 |")
    assert "compile s" not in evaluate.summary_markdown([row])
