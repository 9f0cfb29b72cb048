"""Answer extraction and exact-match scoring for evaluation.

Three methods:
- `final` (default): the text after the last `####` marker (GSM8K style), first line only; when
  the text has no marker, there is no prediction (counted wrong).
- `regex`: a user pattern; the last match wins, its first group if it has one.
- `exact`: the whole text, stripped.
Numbers are normalised before comparison (`1,000` == `1000`, `7.0` == `7`, `+3` == `3`), so a
numeric answer is matched by value, not by spelling; other strings compare after whitespace collapse.
"""
from __future__ import annotations

import re

METHODS = ("final", "regex", "exact")
_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?$")


def normalize(text: str | None) -> str | None:
    """Canonical form: collapsed whitespace; numbers without commas, sign '+' or a zero fraction."""
    if text is None:
        return None
    text = " ".join(text.strip().split())
    text = text.rstrip(".") if _NUMBER.match(text.rstrip(".")) else text
    if _NUMBER.match(text):
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("+-").replace(",", "")
        if "." in digits:
            whole, frac = digits.split(".")
            frac = frac.rstrip("0")
            digits = whole if not frac else f"{whole}.{frac}"
        digits = digits.lstrip("0") or "0"
        if digits.startswith("."):
            digits = "0" + digits
        return sign + digits if digits != "0" else "0"
    return text


def extract(text: str, method: str = "final", pattern: str | None = None) -> str | None:
    """The answer string in `text` per `method`, normalised; None when there is none."""
    if method not in METHODS:
        raise ValueError(f"unknown answer extraction method {method!r}: expected one of {METHODS}")
    if method == "final":
        if "####" not in text:
            return None
        tail = text.rsplit("####", 1)[1].strip()
        answer = tail.splitlines()[0] if tail else ""
        return normalize(answer) or None
    if method == "regex":
        if not pattern:
            raise ValueError("answer extraction method 'regex' needs a pattern (--answer-regex)")
        matches = list(re.finditer(pattern, text))
        if not matches:
            return None
        m = matches[-1]
        return normalize(m.group(1) if m.groups() else m.group(0))
    return normalize(text)


def reference(answer: str, method: str = "final", pattern: str | None = None) -> str | None:
    """The gold answer of a record: extracted like a prediction; a `final`-method reference without
    a `####` line is taken whole (plain short-answer datasets)."""
    gold = extract(answer, method, pattern)
    if gold is None and method == "final":
        gold = normalize(answer)
    return gold


def is_correct(prediction_text: str, answer: str, method: str = "final", pattern: str | None = None) -> bool:
    """Exact match of the extracted prediction against the extracted reference."""
    pred = extract(prediction_text, method, pattern)
    gold = reference(answer, method, pattern)
    return pred is not None and pred == gold
