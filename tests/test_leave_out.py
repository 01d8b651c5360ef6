"""Leave-one-corpus-out evaluation (eval/leave_out.py) with a tiny Llama and three tiny corpora."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from eval.leave_out import main as leave_out_main
from eval.sufficiency import main as eval_sufficiency_main


def _records(corpus: str, split: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        label = i % 2
        lines = [f"[s{j}] user: we talked about item {rng.randint(0, 99)}." for j in range(2)]
        lines.insert(rng.randint(0, 2), "[s9] tool: the answer is here." if label else "[s9] tool: nothing useful.")
        out.append({"id": f"{corpus}/{split}/q{i}", "qa_id": f"{corpus}/q{i}", "episode_id": f"{corpus}-{i % 3}",
                    "question": f"What did {corpus} item {i} return?", "answer": "here", "context": "\n".join(lines),
                    "label": label, "variant": "positive" if label else "none", "category": "single-hop"})
    return out


def _write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("lo-data")
    files = {}
    for k, name in enumerate(("alpha", "beta", "gamma")):
        train = _write(root / name / "train.jsonl", _records(name, "train", 8, k))
        _write(root / name / "eval.jsonl", _records(name, "eval", 6, 10 + k))
        (root / name / "manifest.json").write_text(json.dumps({"config": {"corpus": name}}))
        files[name] = train
    return files


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, tiny_llama_dir):
    path = tmp_path_factory.mktemp("lo-recipe") / "tiny.yaml"
    path.write_text(f"model_name_or_path: {tiny_llama_dir}\nlearning_rate: 5.0e-3\nlora_r: 8\nmax_steps: 1\n"
                    "per_device_train_batch_size: 8\nreport_to: [none]\ndisable_tqdm: true\ndataloader_num_workers: 0\n"
                    "save_steps: 100\nlambda_rep: 0.0\n")
    return path


@pytest.fixture(scope="module")
def router_dir(tmp_path_factory, tiny_llama_dir):
    """An untrained router export of the tiny Llama (stands in for a router trained elsewhere)."""
    from routers.sufficiency import SufficiencyRouter

    out = tmp_path_factory.mktemp("lo-router") / "router"
    SufficiencyRouter.from_base(tiny_llama_dir).save_pretrained(str(out))
    return str(out)


def _counting(calls):
    from train.sufficiency import main as train_main

    def trainer(argv):
        calls.append(argv)
        return train_main(argv)
    return trainer


def test_leave_out_trains_without_scores_and_resumes(corpora, recipe, tiny_llama_dir, router_dir, tmp_path,
                                                     one_torch_thread):
    from data_synthesis.mix import MixConfig, mix

    manifest = tmp_path / "mix" / "train.manifest.json"
    mix(MixConfig(output=str(tmp_path / "mix" / "train.jsonl"), sources=[str(p) for p in corpora.values()]))
    calls: list = []
    argv = ["--leave_out", "all", "--manifest", str(manifest), "--train_recipe", str(recipe),
            "--train_top_layers", "1", "--router_in_corpus", f"beta={router_dir}",
            "--base_model", tiny_llama_dir, "--output_dir", str(tmp_path / "out"),
            "--eval_args", "--min_calibration_samples 1000"]
    result = leave_out_main(argv, kind="sufficiency", trainer=_counting(calls))
    assert len(calls) == 3 and all("--train_top_layers" in c for c in calls)
    for name, train in corpora.items():
        written = [json.loads(x) for x in (tmp_path / "out" / name / "train_without.jsonl").read_text().splitlines()]
        assert written and not any(r["id"].startswith(f"{name}/") for r in written)
        assert {r["id"].split("/")[0] for r in written} == set(corpora) - {name}
        row = result["results"][name]
        assert row["base"]["n"] == 6 and row["without"]["auroc"] is not None
        assert ("in_corpus" in row) == (name == "beta")
        cal = row["calibration"]  # tau from the other two corpora's held-out scores, judged on this one
        assert cal["calibrated_on"] == sorted(set(corpora) - {name})
        assert cal["travel"]["n_calibration"] == 12 and cal["travel"]["n"] == 6
        assert cal["recalibrated"] == []  # 20 / 40 labels: more than the 6 held-out samples
        by_negative = row["without"]["auroc_by_negative"]
        assert set(by_negative) == {"none"} and by_negative["none"]["n"] == 3
        assert row["surface"]["n"] == 6 and set(row["surface"]["coef"]) >= {"cos_min", "n_steps"}  # no-reading baseline
        assert (tmp_path / "out" / name / "surface.json").exists()
    assert "Calibration travel" in (tmp_path / "out" / "leave_out.md").read_text()
    assert "| alpha | without | " in (tmp_path / "out" / "leave_out.md").read_text()  # the by-negative table
    table = (tmp_path / "out" / "leave_out.md").read_text().split("\n\nAUROC of the positives")[0].splitlines()
    assert "base auroc" in table[0] and "without auroc" in table[0] and "in_corpus auroc" in table[0]
    assert "surface auroc" in table[0]
    assert [line.split("|")[1].strip() for line in table[2:]] == ["alpha", "beta", "gamma"]
    assert (tmp_path / "out" / "leave_out.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "leave_out.json").read_text())["results"].keys() == set(corpora)

    stamps = {n: (tmp_path / "out" / n / "surface.json").stat().st_mtime_ns for n in corpora}
    again = leave_out_main(argv, kind="sufficiency", trainer=_counting(calls))
    assert len(calls) == 3  # routers reused, not retrained
    for name in corpora:
        assert again["results"][name]["without"]["from_cache"] == 6  # every score reused
        assert again["results"][name]["without"]["auroc"] == result["results"][name]["without"]["auroc"]
        assert again["results"][name]["calibration"] == result["results"][name]["calibration"]
        assert again["results"][name]["surface"] == result["results"][name]["surface"]
        assert (tmp_path / "out" / name / "surface.json").stat().st_mtime_ns == stamps[name]  # not refitted


def test_extra_train_seeds_train_score_and_resume(corpora, recipe, tiny_llama_dir, tmp_path, one_torch_thread):
    """--extra_train_seeds: one more router without C per seed (its own folder, `--seed S` last), scored on C;
    the spread is reported and a rerun trains nothing."""
    import statistics

    from safetensors.numpy import load_file

    calls: list = []
    argv = ["--leave_out", "gamma", "--corpus_files", *(f"{n}={p}" for n, p in corpora.items()),
            "--train_recipe", str(recipe), "--train_args", "--seed 0", "--extra_train_seeds", "1", "2",
            "--base_model", tiny_llama_dir, "--output_dir", str(tmp_path / "o"), "--calibration_travel", "false",
            "--surface_baseline", "false", "--eval_args", "--min_calibration_samples 1000"]
    row = leave_out_main(argv, kind="sufficiency", trainer=_counting(calls))["results"]["gamma"]
    assert [c[-2:] for c in calls] == [["--seed", "0"], ["--seed", "1"], ["--seed", "2"]]
    assert [c[c.index("--export_dir") + 1] for c in calls] == [
        str(tmp_path / "o" / "gamma" / d / "router") for d in (".", "seed1", "seed2")]
    weights = [load_file(str(tmp_path / "o" / "gamma" / d / "router" / "model.safetensors"))
               for d in ("seed1", "seed2")]
    assert any((weights[0][k] != weights[1][k]).any() for k in weights[0])  # the seed reached the trainer
    seeds = row["without_seeds"]
    assert list(seeds["auroc"]) == ["main", "1", "2"] and seeds["auroc"]["main"] == row["without"]["auroc"]
    assert seeds["n_seeds"] == 3 and seeds["mean"] == statistics.fmean(seeds["auroc"].values())
    assert seeds["std"] == statistics.stdev(seeds["auroc"].values())
    table = (tmp_path / "o" / "leave_out.md").read_text()
    assert "| corpus | seed main | seed 1 | seed 2 | mean | std | base |" in table
    again = leave_out_main(argv, kind="sufficiency", trainer=_counting(calls))["results"]["gamma"]
    assert len(calls) == 3 and again["without_seeds"] == seeds  # reused: nothing trained twice
    with pytest.raises(ValueError, match="extra_train_seeds"):
        leave_out_main(argv + ["--router_without", str(tmp_path / "o" / "gamma" / "router")], kind="sufficiency")


def test_cli_dispatch_and_explicit_files(corpora, tiny_llama_dir, router_dir, tmp_path, one_torch_thread):
    """`eval sufficiency --leave_out` dispatches; --router_without skips training; --corpus_files names files."""
    argv = ["--leave_out", "gamma", "--corpus_files", *(f"{n}={p}" for n, p in corpora.items()),
            "--router_without", router_dir, "--base_model", tiny_llama_dir, "--output_dir", str(tmp_path / "o"),
            "--eval_args", "--min_calibration_samples 1000"]
    result = eval_sufficiency_main(argv)
    assert list(result["results"]) == ["gamma"] and result["results"]["gamma"]["models"]["without"] == router_dir
    assert not any(json.loads(x)["id"].startswith("gamma/")
                   for x in (tmp_path / "o" / "gamma" / "train_without.jsonl").read_text().splitlines())


def test_bad_input_fails_before_any_model(corpora, tmp_path):
    with pytest.raises(ValueError, match="choose among the corpora"):
        leave_out_main(["--leave_out", "delta", "--corpus_files", *(f"{n}={p}" for n, p in corpora.items()),
                        "--output_dir", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="train_recipe"):
        leave_out_main(["--leave_out", "alpha", "--corpus_files", *(f"{n}={p}" for n, p in corpora.items()),
                        "--output_dir", str(tmp_path / "o")])


def test_the_default_trainer_runs_in_a_child_process(monkeypatch):
    """Training corpus after corpus in one process kept every run's memory (20 GB by the third corpus, OOM-killed):
    the default trainer is a child process that ends with this one (tests/test_workers.py), and its failure is an
    error that says how to resume."""
    import routers.workers as W
    from eval.leave_out import _trainer

    calls = []
    monkeypatch.setattr(W, "run_module_in_child", lambda module, argv: calls.append([module, *argv]) or 0)
    _trainer("sufficiency")(["recipe.yaml", "--max_steps", "1"])
    assert calls == [["train.sufficiency", "recipe.yaml", "--max_steps", "1"]]
    monkeypatch.setattr(W, "run_module_in_child", lambda module, argv: 3)
    with pytest.raises(RuntimeError, match="exit code 3.*resume"):
        _trainer("retrieval")(["r.yaml"])
