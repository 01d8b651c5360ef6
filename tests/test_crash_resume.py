"""Crash safety: real jobs killed with SIGKILL mid-way, rerun with the same command, end exactly where an
uninterrupted run ends (no sample lost, none duplicated, same weights / metrics).

Sufficiency synthesis has its SIGKILL test in test_sufficiency_synthesis.py; this file covers retriever
synthesis, sufficiency training (killed after its first checkpoint), ``memroute eval sufficiency`` and
``memroute eval retrieval`` (their per-sample result caches), plus the pieces that make it work: the
checkpoint picker that skips a checkpoint killed mid-save, and the result cache itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from routers.io import RecordError, read_jsonl
from test_sufficiency_training import base_args, make_records, write_jsonl
from numerics import assert_close_to_scale

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def kill_when(cmd: list[str], ready, timeout: float = 240) -> None:
    """Start ``cmd``, SIGKILL it as soon as ``ready()`` is true; fail if it ends on its own first."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.01)
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert alive, f"the job ended (rc={proc.returncode}) before it could be killed:\n{err.decode()[-2000:]}"
    assert proc.returncode == -signal.SIGKILL


def rerun(cmd: list[str], timeout: float = 300) -> str:
    done = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


# -- checkpoints -----------------------------------------------------------------------------------------
def _fake_checkpoint(root: Path, step: int, state: str | None) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x")
    if state is not None:
        (path / "trainer_state.json").write_text(state)
    return path


def test_resume_skips_checkpoints_killed_while_saving(tmp_path, memroute_log):
    from train.checkpoints import checkpoint_is_complete, last_complete_checkpoint
    from train.sufficiency import SufficiencyTrainingConfig, resolve_resume

    root = tmp_path / "run"
    assert last_complete_checkpoint(root) is None
    good = _fake_checkpoint(root, 2, json.dumps({"global_step": 2}))
    _fake_checkpoint(root, 10, json.dumps({"global_step": 10})[:12])  # killed while writing the state
    _fake_checkpoint(root, 12, None)  # killed before the state
    _fake_checkpoint(root, 14, json.dumps({"global_step": 7}))  # a state that is not this checkpoint's
    (root / "checkpoint-99").write_text("a file, not a directory")
    assert [checkpoint_is_complete(root / f"checkpoint-{n}") for n in (2, 10, 12, 14)] == [True, False, False, False]
    assert last_complete_checkpoint(root) == str(good)
    assert all(f"checkpoint-{n} (no valid trainer_state.json" in memroute_log.text for n in (10, 12, 14))
    cfg = SufficiencyTrainingConfig(output_dir=str(root), report_to="none", use_cpu=True)
    assert resolve_resume(cfg) == str(good)
    cfg = SufficiencyTrainingConfig(output_dir=str(root), report_to="none", use_cpu=True, resume="never")
    assert resolve_resume(cfg) is None


# -- training ---------------------------------------------------------------------------------------------
def test_training_killed_after_first_checkpoint_resumes_to_the_same_adapter(tiny_llama_dir, tmp_path):
    """SIGKILL ``python -m train.sufficiency`` once checkpoint-3 is complete; the rerun resumes from the
    last complete checkpoint and ends with the adapter and loss log of an uninterrupted run."""
    from safetensors.torch import load_file

    from train.checkpoints import checkpoint_is_complete
    from train.sufficiency import main as train_main

    data = write_jsonl(tmp_path / "train.jsonl", make_records())
    extra = ("--max_steps", "12", "--save_steps", "3", "--logging_steps", "3", "--save_total_limit", "2")
    killed, fresh = tmp_path / "killed", tmp_path / "fresh"
    cmd = [sys.executable, "-m", "train.sufficiency", *base_args(tiny_llama_dir, data, killed, *extra)]
    kill_when(cmd, lambda: checkpoint_is_complete(killed / "checkpoint-3"))
    assert not (killed / "train_summary.json").exists()
    rerun(cmd)
    summary = json.loads((killed / "train_summary.json").read_text())
    assert summary["steps"] == 12 and summary["resumed_from"] and "checkpoint-" in summary["resumed_from"]

    train_main(base_args(tiny_llama_dir, data, fresh, *extra))
    ref = json.loads((fresh / "train_summary.json").read_text())
    assert ref["resumed_from"] is None
    rows = [{k: h[k] for k in ("step", "loss", "loss_cls", "loss_rep", "s0")} for h in summary["log_history"] if "loss" in h]
    ref_rows = [{k: h[k] for k in ("step", "loss", "loss_cls", "loss_rep", "s0")} for h in ref["log_history"] if "loss" in h]
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows] == [3, 6, 9, 12]
    for a, b in zip(rows, ref_rows):
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7), (k, a, b)
    got, want = load_file(str(killed / "adapter_model.safetensors")), load_file(str(fresh / "adapter_model.safetensors"))
    assert got.keys() == want.keys()
    for k in got:
        assert_close_to_scale(got[k], want[k], rel=1e-4, msg=k)


# -- retriever synthesis ------------------------------------------------------------------------------------
@pytest.mark.slow  # the same writer as sufficiency synthesis, whose SIGKILL test runs by default
def test_retriever_synthesis_killed_resumes_to_the_same_files(tmp_path):
    from data_synthesis.retriever import RetrieverSynthConfig, RetrieverSynthesizer
    from routers.memory.retrieval import HybridRetriever

    opts = {"corpora": ["locomo"], "encoder": "none", "max_qa_per_episode": 40}
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "data_synthesis.retriever", "--output_dir", str(killed), "--corpora", "locomo",
           "--encoder", "none", "--max_qa_per_episode", "40"]
    kill_when(cmd, lambda: _lines(killed / "train.jsonl") >= 30)
    n_at_kill = _lines(killed / "train.jsonl")
    rerun(cmd)
    fresh = tmp_path / "fresh"
    RetrieverSynthesizer(RetrieverSynthConfig(output_dir=str(fresh), **opts),
                         retriever=HybridRetriever(dense_weight=0.0)).run(progress=False)
    for split in ("train", "eval"):
        got, want = (killed / f"{split}.jsonl").read_text(), (fresh / f"{split}.jsonl").read_text()
        assert got == want, split  # nothing lost, nothing twice, same order
    ids = [r["id"] for r in read_jsonl(killed / "train.jsonl")]
    assert len(ids) == len(set(ids)) > n_at_kill


# -- evaluation: sufficiency --------------------------------------------------------------------------------
def _eval_records(n: int) -> list[dict]:
    recs = make_records(n, seed=1)
    for r in recs:
        r["variant"] = "positive" if r["label"] else "none"
    return recs


@pytest.fixture(scope="module")
def tiny_router(tiny_llama_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.sufficiency import SufficiencyRouter

    export = tmp_path_factory.mktemp("crash-router") / "router"
    SufficiencyRouter.from_model(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                                 AutoTokenizer.from_pretrained(tiny_llama_dir), max_input_tokens=400,
                                 base_model=tiny_llama_dir).save_pretrained(export)
    return export


def test_eval_sufficiency_killed_resumes_with_identical_results(tiny_router, tmp_path):
    from eval.sufficiency import main as eval_main

    n = 300
    data = write_jsonl(tmp_path / "eval.jsonl", _eval_records(n))
    killed, fresh = tmp_path / "killed", tmp_path / "fresh"
    opts = ["--router", str(tiny_router), "--base_model", "none", "--data", str(data), "--batch_size", "2",
            "--no_write_calibration_to_router", "--target_early_termination", "0.3"]
    cmd = [sys.executable, "-m", "eval.sufficiency", *opts, "--output_dir", str(killed)]
    cache = killed / "score_cache.jsonl"
    kill_when(cmd, lambda: _lines(cache) >= 40)
    n_at_kill = _lines(cache)
    assert 40 <= n_at_kill < n and not (killed / "metrics.json").exists()
    err = rerun(cmd)
    assert "scores reused" in err
    got = json.loads((killed / "metrics.json").read_text())
    timing = got["models"]["trained"]["timing"]
    assert timing["from_cache"] >= n_at_kill - 2 and timing["scored"] + timing["from_cache"] == n
    keys = [r["key"] for r in read_jsonl(cache)]
    assert len(keys) == len(set(keys)) == n  # every sample scored once, none twice

    want = eval_main([*opts, "--output_dir", str(fresh)])
    assert want["models"]["trained"]["timing"]["from_cache"] == 0
    assert (killed / "scores.jsonl").read_text() == (fresh / "scores.jsonl").read_text()
    assert (killed / "calibration.json").read_text() == (fresh / "calibration.json").read_text()
    drop = ("timing", "device")
    assert ({k: v for k, v in got["models"]["trained"].items() if k not in drop}
            == {k: v for k, v in want["models"]["trained"].items() if k not in drop})


def test_eval_sufficiency_cache_follows_model_and_sample_text(tiny_router, tmp_path):
    """A rerun reuses every score; changed sample text or --resume false rescores; another model misses."""
    from eval.sufficiency import main as eval_main

    recs = _eval_records(6)
    data = write_jsonl(tmp_path / "eval.jsonl", recs)
    out = tmp_path / "out"
    opts = ["--router", str(tiny_router), "--base_model", "none", "--data", str(data), "--output_dir", str(out),
            "--no_write_calibration_to_router", "--batch_size", "4"]
    first = eval_main(opts)["models"]["trained"]
    assert first["timing"]["scored"] == 6 and first["timing"]["from_cache"] == 0
    second = eval_main(opts)["models"]["trained"]
    assert second["timing"]["scored"] == 0 and second["timing"]["from_cache"] == 6
    assert second["timing"]["seconds_per_sample"] is None and second["auroc"] == first["auroc"]
    recs[5]["context"] += " One more line."  # the batch holding sample 5 is scored again
    write_jsonl(data, recs)
    third = eval_main(opts)["models"]["trained"]
    assert 1 <= third["timing"]["scored"] <= 4 and third["timing"]["from_cache"] == 6 - third["timing"]["scored"]
    fourth = eval_main([*opts, "--resume", "false"])["models"]["trained"]
    assert fourth["timing"]["scored"] == 6 and _lines(out / "score_cache.jsonl") == 6


# -- evaluation: retrieval -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    from retriever_helpers import build_tiny_encoder

    return build_tiny_encoder(tmp_path_factory.mktemp("crash-enc") / "st")


@pytest.mark.slow  # three job starts with sentence-transformers imports (~50 s on a shared core)
def test_eval_retrieval_killed_resumes_with_identical_results(tiny_encoder, tmp_path, locomo_episodes):
    from eval.retrieval import main as eval_main

    killed, fresh = tmp_path / "killed", tmp_path / "fresh"
    opts = ["--base_encoder", tiny_encoder, "--trained_encoder", tiny_encoder, "--systems", "bm25", "base",
            "hybrid_trained"]
    cmd = [sys.executable, "-m", "eval.retrieval", *opts, "--output_dir", str(killed)]
    cache = killed / "ranking_cache.jsonl"
    first_group = len(next(e for e in locomo_episodes if e.episode_id == "conv-26").qa)  # bm25 on conv-26
    kill_when(cmd, lambda: _lines(cache) >= first_group)
    n_at_kill = _lines(cache)
    assert not (killed / "metrics.json").exists()
    assert "rankings reused" in rerun(cmd)
    got = json.loads((killed / "metrics.json").read_text())
    want = eval_main([*opts, "--output_dir", str(fresh), "--resume", "false"])
    n_rows = 3 * want["data"]["questions"]
    keys = [r["key"] for r in read_jsonl(cache)]
    assert len(keys) == len(set(keys)) == n_rows > n_at_kill
    assert (killed / "rankings.jsonl").read_text() == (fresh / "rankings.jsonl").read_text()
    assert (killed / "metrics.csv").read_text() == (fresh / "metrics.csv").read_text()
    for system, res in want["systems"].items():
        assert {k: v for k, v in got["systems"][system].items() if k != "seconds"} == \
               {k: v for k, v in res.items() if k != "seconds"}, system


# -- the result cache ----------------------------------------------------------------------------------------
def test_result_cache_survives_a_torn_tail_and_names_corruption(tmp_path):
    from eval.score_cache import ResultCache, model_identity

    path = tmp_path / "cache.jsonl"
    with ResultCache(path) as cache:
        for i in range(3):
            cache.put({"key": ResultCache.key("m", f"s{i}", "q", i), "score": i / 10})
        cache.put({"key": ResultCache.key("m", "s0", "q", 0), "score": 9.0})  # already there: not appended
    assert _lines(path) == 3
    path.write_bytes(path.read_bytes() + b'{"key": "m|s3|x", "sco')  # killed mid-record
    with ResultCache(path) as cache:
        assert cache.get(ResultCache.key("m", "s1", "q", 1))["score"] == 0.1 and cache.hits == 1
        assert "m|s3|x" not in cache and _lines(path) == 3
        assert ResultCache.key("m", "s1", "q", 1) != ResultCache.key("m", "s1", "q changed", 1)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{oops", lines[2]]) + "\n")
    with pytest.raises(RecordError, match=r"cache.jsonl:2: .*--resume false"):
        ResultCache(path)
    assert ResultCache(path, fresh=True).get("anything") is None and not path.read_text()

    model = tmp_path / "model"
    model.mkdir()
    (model / "w.safetensors").write_bytes(b"1234")
    a = model_identity(model)
    (model / "calibration.json").write_text("{}")  # eval writes it: not part of the identity
    (model / ".hidden.tmp").write_text("x")
    assert model_identity(model) == a
    (model / "w.safetensors").write_bytes(b"12345")
    assert model_identity(model) != a
    assert model_identity(model, kind="x") != model_identity(model)
    assert model_identity("org/name") == "org/name" and model_identity(None) is None
