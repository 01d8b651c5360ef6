"""The no-reading sufficiency baseline (eval/surface_baseline.py): step splitting, exact features, and that it
finds a distractor-composition shortcut when one exists and nothing when none does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.surface_baseline import FEATURES, split_steps, surface_baseline, surface_features
from tests.numerics import assert_close_to_scale


class KeywordEncoder:
    """Unit vectors by keyword: 'apple' texts point along x, everything else along y (questions name apples)."""

    def encode(self, texts, batch_size=64, normalize_embeddings=True):
        out = []
        for t in texts:
            v = np.array([1.0, 0.0]) if "apple" in t else np.array([0.0, 1.0])
            if "half" in t:
                v = np.array([1.0, 1.0]) / math.sqrt(2)
            out.append(v)
        return np.array(out)


def test_split_steps_cuts_at_step_ids_that_open_a_line():
    rec = {"context": "[T1] > go north\nYou see [T3] on a sign.\n[T3] > take apple\nTaken.",
           "context_step_ids": ["T1", "T3"]}
    assert split_steps(rec) == ["[T1] > go north\nYou see [T3] on a sign.", "[T3] > take apple\nTaken."]
    assert split_steps({"context": "a\n\nb\n"}) == ["a", "b"]  # no ids: one step per non-empty line
    assert split_steps({"context": "no ids here", "context_step_ids": ["x9"]}) == ["no ids here"]


def test_surface_features_exact():
    rec = {"question": "where is the apple?", "context": "[s1] the apple\n[s2] a half apple? no: half\n[s3] a door",
           "context_step_ids": ["s1", "s2", "s3"]}
    (row,) = surface_features([rec], KeywordEncoder())
    cos = np.array([1.0, 1 / math.sqrt(2), 0.0])
    assert FEATURES == ("n_steps", "log_chars", "cos_mean", "cos_min", "cos_max", "cos_std")
    assert_close_to_scale(row, [3, math.log1p(len(rec["context"])), cos.mean(), 0.0, 1.0, cos.std()])


def _records(n: int, shortcut: bool) -> list[dict]:
    """Positives and negatives with the same evidence step; with ``shortcut`` only positives carry an unrelated step."""
    out = []
    for i in range(n):
        label = i % 2
        steps = ["[e] the apple is in the fridge", "[h] an apple pie recipe"]
        steps.append("[r] the door is locked" if (label and shortcut) else "[r2] apple juice spilled")
        out.append({"question": f"where is the apple {i}?", "context": "\n".join(steps),
                    "context_step_ids": ["e", "h", "r" if (label and shortcut) else "r2"], "label": label,
                    "variant": "positive" if label else "partial"})
    return out


def test_the_baseline_finds_a_composition_shortcut():
    result = surface_baseline(_records(20, shortcut=True), _records(10, shortcut=True), KeywordEncoder())
    assert result["auroc"] == 1.0 and result["n"] == 10
    assert result["auroc_by_negative"] == {"partial": {"n": 5, "auroc": 1.0}}
    assert result["coef"]["cos_min"] < 0  # an unrelated step (low min cosine) is what marks a positive


def test_the_baseline_is_at_chance_without_one():
    result = surface_baseline(_records(20, shortcut=False), _records(10, shortcut=False), KeywordEncoder())
    assert result["auroc"] == 0.5  # identical features for both labels: one score for every sample


def test_one_label_training_file_is_a_clear_error():
    recs = [r for r in _records(6, shortcut=True) if r["label"] == 1]
    with pytest.raises(ValueError, match="both labels"):
        surface_baseline(recs, _records(4, shortcut=True), KeywordEncoder())
