"""``memroute bench`` on the tiny model: files, keys and ratio arithmetic (never timing magnitudes)."""

from __future__ import annotations

import json
import math

import pytest

from eval.bench import BENCHMARKS, figure, main
from routers.config import ConfigError

ENVELOPE = ("schema_version", "machine", "versions", "git_revision", "config", "data")
FIGURE_KEYS = ("name", "unit", "value", "baseline", "ratio", "ratio_definition", "target", "meets_target")


def _check_ratio(f: dict) -> None:
    value, baseline, ratio = f["value"], f["baseline"], f["ratio"]
    if value is None:  # a target whose evaluation has not been run yet: n/a, never met
        assert ratio is None and f["description"].startswith("n/a") and f.get("meets_target") is False
        return
    if baseline is None:  # a reported number without a comparison (e.g. query encoding time)
        assert ratio is None and "target" not in f
        return
    assert value is not None and baseline is not None and ratio is not None
    assert value > 0 and baseline > 0
    expected = value / baseline if f["ratio_definition"] == "value/baseline" else baseline / value
    assert f["ratio_definition"] in ("value/baseline", "baseline/value")
    assert math.isclose(ratio, expected, rel_tol=1e-12)
    if "target" not in f:
        return
    op, bound = f["target"]["op"], f["target"]["value"]
    assert f["meets_target"] is {">=": ratio >= bound, "<=": ratio <= bound, ">": ratio > bound}[op]


@pytest.fixture(scope="module")
def bench_run(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results"
    argv = ["--model_name_or_path", tiny_llama_dir, "--n_samples", "2", "--train_steps", "1",
            "--generate_new_tokens", "4", "--batch_size", "2", "--warmup_steps", "0",
            "--data", str(tmp / "missing.jsonl"), "--output_dir", str(out), "--device", "cpu",
            "--train_top_layers", "1", "--precision_seq_len", "8", "--index_steps", "300", "--memagent_memories", "30",
            "--memagent_encoder", "none",
            # no evaluation has run in this fresh directory: quality targets are reported as n/a
            *[arg for key in ("sufficiency", "retrieval", "progressive_locomo", "progressive_textworld", "memagent")
              for arg in (f"--{key}_metrics", str(tmp / f"{key}.json"))]]
    return main(argv), out


def test_bench_writes_reports(bench_run):
    report, out = bench_run
    names = list(BENCHMARKS)
    assert {p.name for p in out.iterdir()} >= {f"{n}.json" for n in names} | {"report.json", "report.md"}
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["benchmarks"].keys() == set(names)
    for key in ENVELOPE:
        assert key in on_disk
    machine = on_disk["machine"]
    assert {"platform", "cpu_count", "torch_threads", "device"} <= machine.keys() and machine["device"] == "cpu"
    assert "torch" in on_disk["versions"] and "transformers" in on_disk["versions"]
    assert on_disk["config"]["n_samples"] == 2 and on_disk["config"]["generate_new_tokens"] == 4
    assert on_disk["data"]["n_samples"] == 2 and "LoCoMo" in on_disk["data"]["source"]
    assert isinstance(on_disk["meets_all_targets"], bool)
    assert report["meets_all_targets"] == on_disk["meets_all_targets"]

    for name in names:
        res = json.loads((out / f"{name}.json").read_text())
        assert "error" not in res, res.get("traceback")
        for key in ENVELOPE:
            assert key in res
        assert res["benchmark"] == name
        assert isinstance(res["target"], str) and res["target"]
        assert isinstance(res["meets_target"], bool)
        assert res["figures"]
        for f in res["figures"]:
            for key in FIGURE_KEYS[:6]:
                assert key in f, (name, key)
            assert ("target" in f) is ("meets_target" in f)
            _check_ratio(f)
        assert res["meets_target"] is all(f["meets_target"] for f in res["figures"] if "target" in f)
        assert res == on_disk["benchmarks"][name] | {k: on_disk[k] for k in ENVELOPE}

    md = (out / "report.md").read_text()
    assert "| benchmark | figure | value | baseline | ratio | target | meets |" in md
    for row in on_disk["summary"]:
        assert f"| {row['benchmark']} | {row['name']} |" in md


def test_bench_details(bench_run):
    _, out = bench_run
    lat = json.loads((out / "router_latency.json").read_text())
    gen = lat["generate_baseline"]
    assert gen["max_new_tokens"] == gen["min_new_tokens"] == 4
    assert gen["new_tokens_generated"] == {"min": 4, "max": 4}
    assert lat["router"]["n"] == gen["n"] == 2
    fig = {f["name"]: f for f in lat["figures"]}
    assert fig["decision_latency_p50"]["value"] == lat["router"]["p50_s"]
    assert fig["decision_latency_p50"]["baseline"] == gen["p50_s"]

    dist = json.loads((out / "distill_step.json").read_text())
    modes = dist["modes"]
    assert set(modes) == {"base", "distill_no_cache", "distill_cached"}
    assert all(m["n"] == 1 and len(m["losses"]) == 1 and math.isfinite(m["losses"][0]) for m in modes.values())
    assert modes["base"]["lambda_rep"] == 0 and modes["distill_cached"]["teacher_cache"] is True
    assert modes["distill_cached"]["cached_states"] == 2 and modes["distill_no_cache"]["cached_states"] == 0
    fig = {f["name"]: f for f in dist["figures"]}
    assert fig["step_time_distill_cached"]["baseline"] == modes["base"]["mean_s"]
    assert fig["step_time_distill_cached"]["value"] == modes["distill_cached"]["mean_s"]
    assert fig["step_time_distill_no_cache"]["value"] == modes["distill_no_cache"]["mean_s"]

    prec = json.loads((out / "precision_step.json").read_text())
    assert set(prec["modes"]) == {"fp32", "bf16_autocast"} and all(m["n"] == 1 for m in prec["modes"].values())
    assert prec["auto_pick"] == ("bf16_autocast" if prec["bf16_native"] else "fp32") and prec["seq_len"] == 8
    fig = {f["name"]: f for f in prec["figures"]}
    assert fig["step_time_bf16_autocast"]["baseline"] == prec["modes"]["fp32"]["mean_s"]
    assert fig["step_time_auto_pick"]["value"] == prec["modes"][prec["auto_pick"]]["mean_s"]
    assert fig["step_time_auto_pick"]["baseline"] == min(m["mean_s"] for m in prec["modes"].values())


    step = json.loads((out / "frozen_prefix_step.json").read_text())
    assert {m: v["lora_dropout"] for m, v in step["modes"].items()} == {"lora_dropout_0.05": 0.05, "lora_dropout_0": 0.0}
    assert step["train_top_layers"] == 1 and step["split"] >= 1 and step["samples"] == 2 and step["tokens"] > 0
    assert all(m["n"] == 1 for m in step["modes"].values())
    (fig,) = step["figures"]
    assert fig["baseline"] == step["modes"]["lora_dropout_0.05"]["mean_s"]
    assert fig["value"] == step["modes"]["lora_dropout_0"]["mean_s"]


def test_figure_ratio_and_missing_numbers():
    f = figure("x", "s", 2.0, 8.0, "baseline/value", (">=", 10.0))
    assert f["ratio"] == 4.0 and f["meets_target"] is False
    f = figure("x", "s", 1.0, 1.0, "value/baseline", ("<=", 1.1))
    assert f["ratio"] == 1.0 and f["meets_target"] is True
    f = figure("x", "s", None, 1.0, "value/baseline", ("<=", 1.1))
    assert f["ratio"] is None and f["meets_target"] is False


def test_unknown_options_are_errors(tmp_path):
    with pytest.raises(ConfigError):
        main(["--which", "nope", "--output_dir", str(tmp_path)])
    with pytest.raises(ConfigError):
        main(["--no_such_option", "1"])
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("n_samples: 2\nbogus: 1\n")
    with pytest.raises(ConfigError):
        main([str(recipe)])


def test_registry_reports_missing_and_failing_benchmarks(tmp_path, monkeypatch, memroute_log):
    """An unavailable module or a raising benchmark is an error entry; the rest runs, the report is written."""
    from eval import bench

    def boom(cfg, records, device):
        raise ValueError("kaboom")

    monkeypatch.setitem(bench.BENCHMARKS, "ghost", "eval.no_such_benchmark_module:run")
    monkeypatch.setitem(bench.BENCHMARKS, "boom", boom)
    out = tmp_path / "r"
    argv = ["--which", "ghost", "index_latency", "boom", "--index_steps", "200", "--n_samples", "1",
            "--output_dir", str(out), "--device", "cpu"]
    report = main(argv)
    assert list(report["benchmarks"]) == ["ghost", "index_latency", "boom"]
    assert report["errors"]["ghost"].startswith("unavailable: ModuleNotFoundError")
    assert report["errors"]["boom"] == "error: ValueError: kaboom" and "index_latency" not in report["errors"]
    assert report["meets_all_targets"] is False and report["data"]["n_samples"] == 0
    idx = json.loads((out / "index_latency.json").read_text())
    assert idx["index"]["steps"] == 200 and idx["figures"]
    md = (out / "report.md").read_text()
    assert "| ghost | error | unavailable: ModuleNotFoundError" in md and "| boom | error | error: ValueError: kaboom" in md
    assert "| index_latency | query_latency_p50 |" in md and "versions: python" in md
    assert "2 benchmark(s) failed or unavailable: ['boom', 'ghost']" in memroute_log.text
    with pytest.raises(RuntimeError, match="ghost"):
        main([*argv, "--strict", "true", "--which", "ghost"])
    assert json.loads((out / "report.json").read_text())["errors"].keys() == {"ghost"}


def test_quality_targets_read_eval_outputs(tmp_path):
    """Targets come from the evaluation files: exact ratios, and a missing file is n/a, not a crash."""
    from eval.bench import BenchConfig
    from eval.bench.targets import bench_quality_targets

    suff = tmp_path / "suff.json"
    suff.write_text(json.dumps({"models": {"trained": {"auroc": 0.935}, "base": {"auroc": 0.5}}}))
    prog = tmp_path / "prog.json"
    prog.write_text(json.dumps({"test_at_dev_tau": {"tau": 0.5, "router": "trained", "score": 40.0,
                                                    "slow_score": 41.0, "t_mem": 3.0, "slow_t_mem": 6.0},
                                "early_termination_range": {"test": {"trained": {"range": 80.0},
                                                                     "base": {"range": 20.0}}}}))
    mem = tmp_path / "mem.json"
    mem.write_text(json.dumps({"best_single_provider": "expel",
                               "baselines": {"None": {"success_rate": 0.25}, "expel": {"success_rate": 0.5}},
                               "routed": {"success_rate": 0.5, "overhead": {"share": 0.002}}}))
    cfg = BenchConfig(sufficiency_metrics=str(suff), retrieval_metrics=str(tmp_path / "missing.json"),
                      progressive_locomo_metrics=str(prog), progressive_textworld_metrics=None,
                      memagent_metrics=str(mem))
    res = bench_quality_targets(cfg, [], "cpu")
    figs = {f["name"]: f for f in res["figures"]}
    assert figs["sufficiency_auroc_vs_0.85"]["ratio"] == pytest.approx(0.935 / 0.85)
    assert figs["sufficiency_auroc_vs_0.85"]["meets_target"] is True
    assert figs["sufficiency_auroc_trained_vs_base"]["ratio"] == pytest.approx(1.87)
    assert figs["retriever_recall@5_trained_vs_base"]["value"] is None
    assert "missing.json not found" in figs["retriever_recall@5_trained_vs_base"]["description"]
    assert figs["retriever_recall@5_trained_vs_base"]["meets_target"] is False
    assert figs["progressive_locomo_t_mem_vs_slow"]["ratio"] == pytest.approx(0.5)
    assert figs["progressive_locomo_t_mem_vs_slow"]["meets_target"] is True
    assert figs["progressive_locomo_score_plus_2_vs_slow"]["ratio"] == pytest.approx(42 / 41)
    assert figs["progressive_locomo_et_range_trained_vs_base"]["ratio"] == pytest.approx(4.0)
    assert "not configured" in figs["progressive_textworld_t_mem_vs_slow"]["description"]
    assert figs["memagent_routed_vs_best_single"]["ratio"] == pytest.approx(1.0)
    assert figs["memagent_routed_vs_best_single"]["meets_target"] is True
    assert figs["memagent_routed_vs_no_memory"]["ratio"] == pytest.approx(2.0)
    assert figs["memagent_routing_overhead_share"]["ratio"] == pytest.approx(0.2)
    assert res["meets_target"] is False          # the missing retrieval figures count as not met
