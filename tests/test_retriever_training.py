"""Retriever training on a tiny random BERT (train/retriever.py, routers/retriever.py): learning,
resume, GradCache path, export -> reload, the retrieval prefix taking the trained encoder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from retriever_helpers import build_tiny_encoder, toy_recall_at_1, toy_records, write_jsonl
from routers import cli
from routers.base import ROUTER_CONFIG, load_router
from routers.retriever import RetrieverRouter
from train.retriever import main as train_main


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_encoder(tmp_path_factory.mktemp("tiny-retriever") / "st")


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("retriever-data") / "train.jsonl", toy_records())


def args(model: str, train_file: Path, out: Path, *extra: str) -> list[str]:
    return ["--model_name_or_path", model, "--train_file", str(train_file), "--output_dir", str(out),
            "--per_device_train_batch_size", "6", "--learning_rate", "3e-3", "--warmup_steps", "0",
            "--positives_per_query", "2", "--negatives_per_query", "2", "--temperature", "0.1",
            "--max_seq_length", "32", "--logging_steps", "5", "--report_to", "none", "--disable_tqdm", "true",
            "--dataloader_num_workers", "0", "--seed", "0", *extra]


@pytest.fixture(scope="module")
def trained(tiny_dir, train_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    trainer, info = train_main(args(tiny_dir, train_file, out, "--max_steps", "60", "--save_steps", "30",
                                    "--export_dir", str(out / "export")))
    return trainer, info, out


def test_export_keeps_the_base_models_token_budget_not_the_training_truncation(trained):
    """Training truncates texts to max_seq_length (32 here) for speed; the export must score at the base model's
    own budget (the tiny encoder's 64; MiniLM's 256), or long memory steps are cut at inference (issue 21)."""
    from sentence_transformers import SentenceTransformer

    from routers.retriever import RetrieverRouter

    _, info, out = trained
    assert info["max_seq_length"] == 32
    router = RetrieverRouter.from_pretrained(out / "export")
    assert router.config.max_seq_length == 64 and router.model.max_seq_length == 64
    assert SentenceTransformer(str(out / "export")).max_seq_length == 64


def losses(history):
    return [h["loss"] for h in history if "loss" in h]


def test_training_learns_the_toy_task(trained, tiny_dir):
    from sentence_transformers import SentenceTransformer

    trainer, info, out = trained
    assert info["steps"] == 60 and info["queries"] == 12
    ls = losses(trainer.state.log_history)
    assert len(ls) == 12 and np.isfinite(ls).all()
    assert np.mean(ls[-3:]) < 0.5 * np.mean(ls[:2]), ls
    base = SentenceTransformer(tiny_dir, device="cpu")
    model = trainer.model
    changed = {n: not torch.equal(p0.detach().cpu(), p1.detach().cpu())
               for (n, p0), p1 in zip(base.named_parameters(), model.parameters())}
    unused = {n for n in changed if "pooler" in n}  # BERT's pooler is not part of mean pooling
    assert all(v for n, v in changed.items() if n not in unused), [n for n, v in changed.items() if not v]
    recs = toy_records()

    def enc(m):
        return lambda texts: m.encode(texts, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)

    before, after = toy_recall_at_1(enc(base), recs), toy_recall_at_1(enc(model), recs)
    assert before <= 0.25 and after >= 0.75, (before, after)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 60 and summary["log_history"]
    assert (out / "resolved_config.yaml").exists() and (out / "modules.json").exists()


def test_export_reload_gives_identical_embeddings(trained):
    trainer, _, out = trained
    export = out / "export"
    assert {"router_config.json", "README.md", "modules.json", "config_sentence_transformers.json"} <= {
        p.name for p in export.iterdir()}
    cfg = json.loads((export / ROUTER_CONFIG).read_text())
    assert cfg["router_type"] == "retriever" and cfg["normalized"] is True and cfg["embedding_dim"] == 32
    assert cfg["temperature"] == 0.1 and "torch" in cfg["library_versions"]
    assert "Router-Mem evidence retriever" in (export / "README.md").read_text()
    router = RetrieverRouter.from_pretrained(export, device="cpu")
    assert isinstance(load_router(export, device="cpu"), RetrieverRouter)
    texts = [r["query"] for r in toy_records()] + [t for r in toy_records() for t in r["positives"]]
    trainer.model.eval()
    direct = trainer.model.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                                  show_progress_bar=False)
    np.testing.assert_array_equal(router.encode(texts), direct)
    again = RetrieverRouter.from_pretrained(export, device="cpu")
    np.testing.assert_array_equal(again.encode(texts), router.encode(texts))
    # and no temporary export directories are left behind
    assert not [p for p in out.iterdir() if p.name.startswith(".export")]


def test_router_api_and_prefix_take_the_trained_encoder(trained):
    from routers.memory.retrieval import HybridRetriever
    from routers.memory.schema import Episode, Step

    _, _, out = trained
    router = RetrieverRouter.from_pretrained(out / "export", device="cpu")
    recs = toy_records()
    steps = [Step(f"p{i}", i, r["positives"][0]) for i, r in enumerate(recs)]
    ep = Episode("toy", steps)
    scores = router.score(recs[3]["query"], steps)
    assert scores.shape == (12,) and np.all(scores <= 1 + 1e-5)
    index = router.build_index(ep)
    top = router.retrieve(recs[3]["query"], index, k=3)
    assert len(top) == 3 and top[0][1] == pytest.approx(float(scores.max()), abs=1e-5)
    assert [i for i, _ in top] == [steps[j].step_id for j in router.decide(scores, k=3)]
    assert router.decide(scores, threshold=1.0) == []  # no step is the query itself
    with pytest.raises(ValueError, match=r"threshold must be a finite number in \[-1, 1\], got 2.0"):
        router.decide(scores, threshold=2.0)  # a cosine threshold above 1 is a mistake, not "keep nothing"
    # HybridRetriever takes the export by path (and a router object) and embeds steps the same way
    by_path = HybridRetriever(encoder=str(out / "export"), dense_weight=1.0)
    by_obj = HybridRetriever(encoder=router, dense_weight=1.0)
    np.testing.assert_allclose(by_path.step_embeddings(ep), router.encode(steps), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(by_obj.step_embeddings(ep), router.encode(steps), rtol=1e-6, atol=1e-7)
    assert by_path.retrieve(recs[3]["query"], ep, k=1)[0].step.step_id == top[0][0]
    assert HybridRetriever(encoder="none").dense_weight == 0.0


def test_resume_continues_from_the_last_checkpoint(tiny_dir, train_file, tmp_path):
    out = tmp_path / "out"
    _, info = train_main(args(tiny_dir, train_file, out, "--max_steps", "8", "--save_steps", "4"))
    assert info["steps"] == 8 and info["resumed_from"] is None
    assert (out / "checkpoint-8").exists()
    shutil.rmtree(out / "checkpoint-8")  # as if killed after step 4's checkpoint
    trainer, info = train_main(args(tiny_dir, train_file, out, "--max_steps", "12", "--save_steps", "4"))
    assert info["resumed_from"].endswith("checkpoint-4") and info["steps"] == 12
    assert trainer.state.global_step == 12
    _, info = train_main(args(tiny_dir, train_file, tmp_path / "fresh", "--max_steps", "2", "--resume", "never"))
    assert info["resumed_from"] is None


def test_gradcache_training_and_cli_export(tiny_dir, train_file, tmp_path):
    out = tmp_path / "cached"
    assert cli.main(["train", "retriever", *args(tiny_dir, train_file, out, "--max_steps", "3", "--save_steps", "3",
                                                 "--mini_batch_size", "4")]) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["mini_batch_size"] == 4 and np.isfinite(summary["final_loss"])
    assert cli.main(["export", "retriever", "--checkpoint", str(out / "checkpoint-3"),
                     "--export_dir", str(tmp_path / "exp")]) == 0
    cfg = json.loads((tmp_path / "exp" / ROUTER_CONFIG).read_text())
    assert cfg["router_type"] == "retriever" and cfg["base_model"] == tiny_dir
    r = RetrieverRouter.from_pretrained(tmp_path / "exp", device="cpu")
    assert r.encode(["hello"]).shape == (1, 32)


def test_bad_training_file_names_file_and_line(tiny_dir, tmp_path):
    from routers.io import RecordError

    bad = tmp_path / "bad.jsonl"
    recs = toy_records()[:2]
    bad.write_text(json.dumps(recs[0]) + "\n" + json.dumps({**recs[1], "positives": "oops"}) + "\n")
    with pytest.raises(RecordError) as err:
        train_main(args(tiny_dir, bad, tmp_path / "o", "--max_steps", "1"))
    assert err.value.line == 2 and str(bad) in str(err.value)


def test_time_budget_stops_retriever_training_with_an_export(tiny_dir, train_file, tmp_path):
    out = tmp_path / "out"
    trainer, info = train_main(args(tiny_dir, train_file, out, "--max_steps", "40", "--save_steps", "100",
                                    "--max_train_minutes", "0", "--export_dir", str(out / "export")))
    assert info["steps"] == 1 and (out / "checkpoint-1" / "trainer_state.json").is_file()
    assert (out / "export" / "router_config.json").is_file()
