"""The quickstart pipeline end to end on the tiny model (no answer model, BM25/entity miner only)."""

from __future__ import annotations

import json


def test_quickstart_end_to_end_tiny(tiny_llama_dir, tmp_path, capsys):
    from eval.quickstart import main

    out = tmp_path / "qs"
    summary = main(["--output_dir", str(out), "--model_name_or_path", tiny_llama_dir, "--encoder", "none",
                    "--answer_models", "none", "--max_qa_per_episode", "2", "--max_eval_qa_per_episode", "3", "--eval_episodes", "conv-26", "conv-30",
                    "--max_steps", "2", "--per_device_train_batch_size", "2", "--bf16", "false"])
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert set(summary["timings"]) == {"synthesis_s", "training_s", "evaluation_s", "total_s"}
    assert summary["data"]["eval"]["samples"] == 12  # 2 held-out conversations x 3 questions x (pos + neg)
    assert summary["training"]["steps"] == 2
    assert (out / "router" / "router_config.json").exists() and (out / "router" / "calibration.json").exists()
    assert (out / "eval" / "reliability.png").stat().st_size > 0
    assert (out / "eval" / "early_termination.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "AUROC" in printed
    # the closing report: base vs trained, where the plots and the router are, how to use it, what the full recipe does
    assert "base     AUROC" in printed and "trained  AUROC" in printed and "router: " + str(out / "router") in printed
    assert "load_router(" in printed and "router.decide(router.score(" in printed and "0.86" in printed
    assert "the router keeps tau 0.5" in printed
    # the no-reading baseline beside the routers (fitted on the training file, scored on the same held-out file)
    surface = json.loads((out / "eval" / "surface_baseline.json").read_text())
    assert surface["n"] == 12 and set(surface["coef"]) >= {"cos_min", "log_chars"} and "surface  AUROC" in printed
    assert summary["config"]["positive_hard_fraction"] == 1.0 and summary["config"]["refill_match_length"] is True
    assert summary["training"]["frozen_prefix"]["trained_layers"] >= 1  # the default path is the CPU-efficient one
    assert metrics["n_samples"] == 12 and set(metrics["models"]) == {"base", "trained"}
    # the quickstart asks for the calibration to be written into its router, but 12 samples are too few:
    # refused, said so, and the export keeps the tau it was saved with
    assert summary["calibration_written_to_router"] is False and "too few samples" in summary["calibration_skipped"]
    assert json.loads((out / "router" / "calibration.json").read_text()) == {"threshold": 0.5}
    assert metrics["config"]["write_calibration_to_router"] is True
