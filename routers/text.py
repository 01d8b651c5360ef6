"""Answer scoring shared by synthesis filters and QA evaluation: LoCoMo/SQuAD-style token F1."""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, articles and extra spaces (the LoCoMo/SQuAD normalization)."""
    text = str(text).lower().replace(",", "")
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def answers_correctly(prediction: str, gold: str, f1_threshold: float = 0.5) -> bool:
    """Correct if token F1 reaches the threshold or the normalized gold appears in the prediction."""
    g = normalize_answer(gold)
    return token_f1(prediction, gold) >= f1_threshold or (bool(g) and g in normalize_answer(prediction))
