"""``memroute check-device`` on the CPU: the same checks a GPU user runs, with the tiny models."""

from __future__ import annotations

import json

import pytest

from eval import device_check


@pytest.fixture(scope="module")
def report(tmp_path_factory, smollm2_tokenizer, one_torch_thread):
    out = tmp_path_factory.mktemp("device-check")
    tok = out / "tok"
    smollm2_tokenizer.save_pretrained(tok)
    return device_check.main(["--output_dir", str(out), "--tokenizer", str(tok), "--steps", "3", "--bf16", "false"]), out


@pytest.mark.slow  # ~17 s on a 2-core CPU: run `pytest -m slow tests/test_device_check.py` before a device session
def test_every_router_trains_exports_and_reloads_exactly(report):
    rep, out = report
    assert rep["ok"], {k: v["problems"] for k, v in rep["routers"].items()}
    assert set(rep["routers"]) == {"sufficiency", "retriever", "memagent"}
    for name, r in rep["routers"].items():
        assert r["param_device"] == "cpu" and r["mixed_precision"] == "no" and r["steps"] == 3, name
        assert r["weights_changed"] and r["reload_bit_identical"] and r["n_scores"] > 0, name
        assert r["max_abs_diff_device_vs_cpu"] == 0.0, name  # same device: same kernels
    assert r["n_scores"] == 1 + 3 + 1 + 3  # memagent: None + 3 providers, p(Query), one p(yes) per provider
    saved = json.loads((out / "device_check.json").read_text())
    assert saved["ok"] and saved["machine"]["library_versions"]["torch"]


def test_verdict_names_each_problem():
    bad = {"loss_finite": False, "param_device": "cpu", "mixed_precision": "no", "weights_changed": False,
           "reload_bit_identical": False, "scores_finite": True, "max_abs_diff_device_vs_cpu": 0.5}
    problems = device_check._verdict(bad, want_bf16=True, device="cuda")
    assert len(problems) == 6
    assert any("instead of cuda" in p for p in problems) and any("instead of bf16" in p for p in problems)
    assert any("0.5" in p or "5.00e-01" in p for p in problems)
