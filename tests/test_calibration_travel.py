"""Calibration travel (eval/calibration_travel.py): tau from the training corpora, judged on a left-out one."""

from __future__ import annotations

import pytest

from eval.calibration_travel import recalibrate_with_labels, travel


def _rows(pairs):
    return [{"id": str(i), "label": y, "trained": s} for i, (s, y) in enumerate(pairs)]


def test_tau_from_the_training_corpora_is_judged_on_the_left_out_one():
    calibration = _rows([(0.9, 1), (0.8, 1), (0.7, 0), (0.6, 1), (0.2, 0)])
    target = _rows([(0.95, 0), (0.85, 1), (0.5, 1), (0.3, 0)])
    t = travel(calibration, target, target_precision=0.9)
    assert t["tau"] == pytest.approx(0.8)  # the smallest tau with precision >= 0.9 on the calibration rows
    assert t["calibration_precision"] == pytest.approx(1.0)
    assert t["precision"] == pytest.approx(0.5) and t["early_termination_rate"] == pytest.approx(0.5)
    assert t["recall"] == pytest.approx(0.5) and t["n"] == 4 and t["n_calibration"] == 5
    assert t["travels"] is False and t["precision_gap"] == pytest.approx(-0.4)
    assert t["oracle_tau"] == 1.0  # no tau reaches 0.9 on the target: "never stop"


def test_a_tau_that_stops_nothing_is_not_called_a_precision_failure():
    t = travel(_rows([(0.9, 1), (0.1, 0)]), _rows([(0.5, 1), (0.4, 0)]))
    assert t["tau"] == pytest.approx(0.9) and t["early_termination_rate"] == 0.0
    assert t["precision"] is None and t["travels"] is None
    above = travel(_rows([(0.9, 1), (0.1, 0)]), _rows([(0.95, 1), (0.4, 0)]))
    assert above["precision"] == 1.0 and above["travels"] is True  # above the target is not a failure


def test_recalibration_with_a_few_labels():
    separable = _rows([(0.6 + 0.01 * i, 1) for i in range(20)] + [(0.1 + 0.01 * i, 0) for i in range(20)])
    r = recalibrate_with_labels(separable, k=10, draws=30, seed=1)
    assert r["k"] == 10 and r["draws"] == 30
    # a draw's tau may sit on a negative as long as the draw's precision is >= 0.9, so a few draws stop a
    # few negatives of the rest; none stops nothing (every draw of 10 holds a positive here)
    assert r["mean_precision"] == pytest.approx(0.99286, abs=1e-4) and r["share_no_stop"] == 0.0
    assert r["share_travels"] == pytest.approx(29 / 30)
    assert 0.4 < r["mean_early_termination_rate"] <= 0.5
    assert recalibrate_with_labels(separable, k=40) is None  # nothing left to judge on
    inverted = _rows([(0.9, 0), (0.8, 0), (0.7, 1), (0.6, 1)] * 5)
    bad = recalibrate_with_labels(inverted, k=8, draws=20)
    assert bad["share_travels"] == 0.0  # the scores are inverted: no tau reaches 0.9, each draw stops nothing
    assert bad["share_no_stop"] == 1.0 and bad["mean_precision"] is None


def test_auroc_against_each_kind_of_negative():
    from eval.metrics import auroc_by_negative_kind

    rows = [{"label": 1, "variant": "positive", "trained": 0.9},
            {"label": 1, "variant": "prefix_positive", "trained": 0.6},
            {"label": 0, "variant": "none", "trained": 0.1}, {"label": 0, "variant": "none", "trained": 0.2},
            {"label": 0, "variant": "partial", "trained": 0.7}, {"label": 0, "variant": "partial", "trained": None}]
    by = auroc_by_negative_kind(rows, "trained")
    assert by["none"] == {"n": 2, "auroc": 1.0}
    # partial: 0.7 beats the positive at 0.6 (one of four pairs lost); over budget (None) counts as score 0
    assert by["partial"] == {"n": 2, "auroc": 0.75}
