"""Eval metrics against hand-computed values, threshold calibration, and the eval job end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from eval.metrics import (binary_metrics, calibrate_threshold, expected_calibration_error, reliability_bins,
                          threshold_metrics)

# Five samples; bins (width 0.1): {0.12, 0.18} -> bin 1, {0.55} -> bin 5, {0.95, 1.0} -> bin 9.
Y = np.array([0, 1, 0, 1, 1])
S = np.array([0.12, 0.18, 0.55, 0.95, 1.0])


def row_at(rows, tau):
    return next(r for r in rows if r["tau"] == pytest.approx(tau))


def test_ece_hand_computed():
    # bin1: acc 1/2, conf 0.15 -> 0.35 (w 2/5); bin5: acc 0, conf 0.55 (w 1/5); bin9: acc 1, conf 0.975 (w 2/5)
    assert expected_calibration_error(Y, S) == pytest.approx((2 * 0.35 + 0.55 + 2 * 0.025) / 5)
    bins = reliability_bins(Y, S)
    assert [b["count"] for b in bins] == [0, 2, 0, 0, 0, 1, 0, 0, 0, 2]
    assert bins[0]["accuracy"] is None and bins[9]["confidence"] == pytest.approx(0.975)
    # One bin: |acc 1/2 - mean conf 0.5175|; perfectly calibrated extremes -> 0.
    assert expected_calibration_error([0, 1, 1, 0], [0.5, 0.5, 0.55, 0.52]) == pytest.approx(0.5175 - 0.5)
    assert expected_calibration_error([0, 0, 1], [0.0, 0.0, 1.0]) == 0.0


def test_binary_metrics_hand_computed():
    m = binary_metrics(Y, S, taus=[0.15, 0.5])
    assert m["n"] == 5 and m["n_positive"] == 3 and m["n_over_budget"] == 0
    assert m["brier"] == pytest.approx((0.12**2 + 0.82**2 + 0.55**2 + 0.05**2 + 0.0) / 5)
    assert m["auroc"] == pytest.approx(5 / 6)  # positives beat negatives in 5 of 6 pairs
    assert m["ap"] == pytest.approx((1 + 1 + 3 / 4) / 3)
    assert m["ece"] == pytest.approx(0.26)
    r = row_at(m["per_tau"], 0.5)  # stop on 0.55, 0.95, 1.0: tp=2 fp=1 fn=1 tn=1
    assert (r["tp"], r["fp"], r["fn"], r["tn"], r["n"]) == (2, 1, 1, 1, 5)
    assert r["accuracy"] == pytest.approx(0.6) and r["early_termination_rate"] == pytest.approx(0.6)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    r = row_at(m["per_tau"], 0.15)  # tau is inclusive: 0.18 stops, 0.12 continues
    assert r["accuracy"] == pytest.approx(0.8) and r["early_termination_rate"] == pytest.approx(0.8)
    assert r["recall"] == 1.0


def test_threshold_metrics_no_stop_has_undefined_precision():
    r = threshold_metrics(Y, S, 1.01)
    assert r["early_termination_rate"] == 0.0 and r["precision"] is None and r["accuracy"] == pytest.approx(0.4)


def test_nan_scores_are_over_budget_and_continue():
    y, s = [1, 0, 1], [float("nan"), 0.2, 0.9]
    m = binary_metrics(y, s, taus=[0.0, 0.5])
    assert m["n_over_budget"] == 1
    assert m["brier"] == pytest.approx((1 + 0.04 + 0.01) / 3)  # NaN scored as 0.0
    assert m["auroc"] == pytest.approx(0.5)
    # Even at tau = 0 the over-budget sample continues, like SufficiencyRouter.decide.
    r0 = row_at(m["per_tau"], 0.0)
    assert r0["early_termination_rate"] == pytest.approx(2 / 3) and r0["fn"] == 1
    assert row_at(m["per_tau"], 0.5)["early_termination_rate"] == pytest.approx(1 / 3)
    json.dumps(m, allow_nan=False)  # strict JSON


def test_single_class_does_not_crash():
    m = binary_metrics([1, 1], [0.3, 0.7], taus=[0.5])
    assert m["auroc"] is None and m["ap"] == 1.0 and m["brier"] == pytest.approx((0.49 + 0.09) / 2)
    assert m["per_tau"][0]["precision"] == 1.0
    m = binary_metrics([0, 0], [0.3, 0.7], taus=[0.5])
    assert m["auroc"] is None and m["ap"] is None and m["per_tau"][0]["recall"] is None
    json.dumps(m, allow_nan=False)


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        binary_metrics([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError):
        binary_metrics([0, 1], [0.1])
    with pytest.raises(ValueError):
        binary_metrics([], [])
    with pytest.raises(ValueError):
        calibrate_threshold(Y, S)
    with pytest.raises(ValueError):
        calibrate_threshold(Y, S, target_precision=0.9, target_early_termination=0.3)


def test_calibrate_target_precision():
    # Precision of "stop if s >= tau" over the grid: .12 -> 3/5, .18 -> 3/4, .55 -> 2/3, .95 -> 1, 1.0 -> 1.
    c = calibrate_threshold(Y, S, target_precision=0.7)
    assert c["threshold"] == c["tau"] == pytest.approx(0.18)  # non-monotone: .55 would fail, .18 passes
    assert c["precision"] == pytest.approx(0.75) and c["early_termination_rate"] == pytest.approx(0.8)
    assert c["reachable"] is True and c["method"] == "max_early_termination_at_precision"
    assert c["target_precision"] == 0.7 and c["target_early_termination"] is None
    c = calibrate_threshold(Y, S, target_precision=0.9)
    assert c["tau"] == pytest.approx(0.95) and c["early_termination_rate"] == pytest.approx(0.4)


def test_calibrate_target_precision_unreachable():
    c = calibrate_threshold([0, 0, 1], [0.9, 0.8, 0.1], target_precision=0.5)
    assert c["reachable"] is False and c["tau"] == 1.0
    assert c["early_termination_rate"] == 0.0 and c["precision"] is None


def test_calibrate_target_early_termination():
    c = calibrate_threshold(Y, S, target_early_termination=0.4)
    assert c["tau"] == pytest.approx(0.95) and c["early_termination_rate"] == pytest.approx(0.4)
    assert c["method"] == "early_termination_quantile" and c["reachable"] is True
    c = calibrate_threshold([0, 1, 1], [0.2, 0.5, 0.7], target_early_termination=0.0)
    assert c["tau"] == 1.0 and c["early_termination_rate"] == 0.0
    # NaN (over budget) never stops: with 3 of 4 in budget, ET 1.0 is unreachable.
    s = [float("nan"), 0.2, 0.9, 0.5]
    c = calibrate_threshold([1, 0, 1, 0], s, target_early_termination=0.5)
    assert c["tau"] == pytest.approx(0.5) and c["early_termination_rate"] == pytest.approx(0.5)
    c = calibrate_threshold([1, 0, 1, 0], s, target_early_termination=1.0)
    assert c["reachable"] is False and c["tau"] == pytest.approx(0.2)
    assert c["early_termination_rate"] == pytest.approx(0.75) and c["n_over_budget"] == 1


def test_plots_write_png(tmp_path):
    from eval.plots import early_termination_curve, reliability_diagram

    p = reliability_diagram({"a": (Y, S), "b": (Y, 1 - S)}, tmp_path / "r.png")
    rows = binary_metrics(Y, S)["per_tau"]
    q = early_termination_curve({"a": rows}, tmp_path / "sub" / "e.png")
    for f in (p, q):
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.png", "sub"]  # no temp files left


# -- end to end ----------------------------------------------------------------------------------------
def _eval_records(n_long_words: int):
    recs = []
    for i in range(8):
        label = i % 2
        ctx = f"Step {i}: Alice said she moved to Paris in {2010 + i}." if label else f"Step {i}: Bob likes tea."
        recs.append({"schema_version": 1, "id": f"conv-0/q{i}/{'pos' if label else 'none'}0",
                     "question": f"When did Alice move to Paris? ({i})", "context": ctx, "label": label,
                     "variant": "positive" if label else ("partial" if i % 4 == 0 else "none")})
    recs[0]["context"] = " ".join(["filler"] * n_long_words)  # over the trained router's budget
    return recs


def test_sufficiency_eval_end_to_end(tmp_path, tiny_llama_dir, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.sufficiency import calibrate_main, main
    from routers.sufficiency import SufficiencyRouter

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    export = tmp_path / "router"
    SufficiencyRouter.from_model(model, tok, max_input_tokens=256, base_model=tiny_llama_dir).save_pretrained(export)
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _eval_records(400)))
    out = tmp_path / "out"

    metrics = main(["--router", str(export), "--base_model", tiny_llama_dir, "--data", str(data),
                    "--output_dir", str(out), "--taus", "0.3", "0.5", "0.7", "--batch_size", "3",
                    "--target_early_termination", "0.25", "--write_calibration_to_router", "true",
                    "--min_calibration_samples", "7", "--min_calibration_per_class", "3"])  # 4 + 3 in budget

    for name in ("metrics.json", "scores.jsonl", "calibration.json", "reliability.png", "early_termination.png",
                 "resolved_config.yaml"):
        assert (out / name).is_file(), name
    on_disk = json.loads((out / "metrics.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert on_disk["n_samples"] == 8 and on_disk["n_positive"] == 4
    assert set(on_disk["models"]) == {"base", "trained"}
    assert {"platform", "cpu_count"} <= set(on_disk["machine"]) and "torch" in on_disk["versions"]
    for m in on_disk["models"].values():
        assert {"auroc", "ap", "brier", "ece", "per_tau", "n_over_budget", "timing"} <= set(m)
        assert [r["tau"] for r in m["per_tau"]] == [0.3, 0.5, 0.7]
        assert m["timing"]["seconds_per_sample"] > 0
    assert on_disk["models"]["trained"]["n_over_budget"] == 1 and on_disk["models"]["base"]["n_over_budget"] == 0
    assert metrics["models"]["trained"]["auroc"] == on_disk["models"]["trained"]["auroc"]

    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and rows[0]["trained"] is None and rows[0]["base"] is not None
    # Same weights on both sides: the export reproduces the base model's scores.
    np.testing.assert_allclose([r["base"] for r in rows[1:]], [r["trained"] for r in rows[1:]], atol=1e-5)

    cal = json.loads((export / "calibration.json").read_text())
    assert cal == json.loads((out / "calibration.json").read_text())
    assert cal["method"] == "early_termination_quantile" and cal["model"] == "trained"
    assert cal["early_termination_rate"] == pytest.approx(0.25)
    assert SufficiencyRouter.from_pretrained(export).config.threshold == pytest.approx(cal["threshold"])
    assert "AUROC" in capsys.readouterr().out

    cal2 = calibrate_main(["--scores", str(out / "scores.jsonl"), "--output", str(tmp_path / "c.json"),
                           "--score_field", "base", "--target_precision", "0.0", "--min_calibration_samples", "8",
                           "--min_calibration_per_class", "4"])
    assert cal2["tau"] == pytest.approx(min(r["base"] for r in rows)) and cal2["early_termination_rate"] == 1.0
    assert json.loads((tmp_path / "c.json").read_text())["model"] == "base"


def test_eval_reads_base_from_router_and_names_bad_line(tmp_path, tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.io import RecordError
    from eval.sufficiency import main
    from routers.sufficiency import SufficiencyRouter

    export = tmp_path / "router"
    SufficiencyRouter.from_model(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                                 AutoTokenizer.from_pretrained(tiny_llama_dir),
                                 base_model=tiny_llama_dir).save_pretrained(export)
    data = tmp_path / "eval.jsonl"
    recs = _eval_records(5)[:4]
    data.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"id": "x", "question": "q"}\n')
    with pytest.raises(RecordError, match=r"eval.jsonl:5: missing field"):
        main(["--router", str(export), "--data", str(data), "--output_dir", str(tmp_path / "o")])
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    m = main(["--router", str(export), "--data", str(data), "--output_dir", str(tmp_path / "o"),
              "--max_samples", "3"])
    assert m["resolved_base_model"] == tiny_llama_dir and m["n_samples"] == 3
    assert set(m["models"]) == {"base", "trained"}
    assert json.loads((export / "calibration.json").read_text()) == {"threshold": 0.5}  # untouched
    assert m["calibration"] is None and "too few samples" in m["calibration_skipped"]  # 3 samples: refused
    assert not math.isnan(m["models"]["trained"]["brier"])
