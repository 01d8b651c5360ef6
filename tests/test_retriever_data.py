"""Retriever training data from evidence labels (data_synthesis/retriever.py, DESIGN §4, §5)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from retriever_helpers import BagOfLetters

from routers.io import RecordError
from data_synthesis.retriever import RetrieverSynthConfig, RetrieverSynthesizer
from data_synthesis.retriever_records import (RECORD_FIELDS, build_record, load_retriever_dataset, read_retriever_records,
                                              window_around, window_id)
from routers.memory.retrieval import HybridRetriever, render_context
from routers.memory.schema import QA, Episode, Step

HOTPOTQA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "hotpotqa_train100.json"


TEXTS = ["we planned the picnic", "Ann bought a kite at the fair", "the kite was purple and huge",
         "Bob said the picnic was fun", "I flew my kite by the lake", "the lake was cold",
         "my purple kite broke", "we ate cake", "the fair had a kite stall", "kites everywhere at the fair",
         "Ann went home", "the end"]


def toy_episode(qa: list[QA] | None = None) -> Episode:
    steps = [Step(f"D1:{i}", i, t, speaker="Ann" if i % 2 else "Bob", timestamp="1 May 2023") for i, t in enumerate(TEXTS)]
    qa = qa if qa is not None else [QA("toy/q0", "Where did Ann buy the kite?", "at the fair", ["D1:1"]),
                                    QA("toy/q1", "What colour was the kite?", "purple", ["D1:2", "D1:4"])]
    return Episode("toy", steps, qa, source="toy")


def cfg_for(tmp_path: Path, **kw) -> RetrieverSynthConfig:
    base = dict(output_dir=str(tmp_path / "data"), corpora=["locomo"], encoder="none", bm25_negatives=3,
                dense_negatives=2, window_negatives=1, hard_pool=6, seed=0)
    base.update(kw)
    return RetrieverSynthConfig(**base)


def record_for(ep: Episode, qa: QA, cfg: RetrieverSynthConfig, dense: bool = True) -> dict:
    r = HybridRetriever(encoder=BagOfLetters(), dense_weight=1.0) if dense else HybridRetriever(dense_weight=0.0)
    _, lex, dns = r.scores(qa.question, ep)
    return build_record(ep, qa, cfg, "train", lex, dns if dense else None)


def test_windows():
    ep = toy_episode()
    assert [s.step_id for s in window_around(ep, 0, 3)] == ["D1:0", "D1:1", "D1:2"]  # shifted inward
    assert [s.step_id for s in window_around(ep, 5, 3)] == ["D1:4", "D1:5", "D1:6"]
    assert [s.step_id for s in window_around(ep, 11, 3)] == ["D1:9", "D1:10", "D1:11"]
    assert [s.step_id for s in window_around(ep, 5, 4)] == ["D1:4", "D1:5", "D1:6", "D1:7"]
    assert window_id(window_around(ep, 5, 3)) == "D1:4~D1:6"
    assert len(window_around(ep, 3, 50)) == 12


def test_record_positives_and_negatives(tmp_path):
    ep = toy_episode()
    qa = ep.qa[1]  # evidence D1:2 and D1:4, answer "purple"
    rec = record_for(ep, qa, cfg_for(tmp_path))
    assert set(RECORD_FIELDS) <= set(rec) and rec["schema_version"] == 1 and rec["id"] == "toy/q1"
    # positives: evidence steps first (rendered exactly as the prefix indexes them), then windows
    assert rec["positives"][:2] == [ep.step("D1:2").render(), ep.step("D1:4").render()]
    assert rec["positive_kinds"] == ["step", "step", "window", "window"]
    assert rec["positive_ids"][2:] == ["D1:1~D1:3", "D1:3~D1:5"]
    assert rec["positives"][2] == render_context(ep.steps[1:4])
    assert all(len(rec[k]) == len(rec[k.replace("_ids", "s")]) for k in ("positive_ids", "negative_ids"))
    # negatives: never evidence, never a step that contains the answer ("purple" -> D1:6 excluded)
    step_negs = [i for i, k in zip(rec["negative_ids"], rec["negative_kinds"]) if k != "window"]
    assert step_negs and not set(step_negs) & {"D1:2", "D1:4", "D1:6"}
    kinds = Counter(rec["negative_kinds"])
    assert kinds["bm25"] == 3 and kinds["dense"] == 2 and kinds["window"] <= 1
    for nid, kind, text in zip(rec["negative_ids"], rec["negative_kinds"], rec["negatives"]):
        if kind == "window":
            first, last = nid.split("~")
            lo, hi = ep.step(first).index, ep.step(last).index
            assert not {"D1:2", "D1:4"} & {s.step_id for s in ep.steps[lo:hi + 1]}
            assert text == render_context(ep.steps[lo:hi + 1])
        else:
            assert text == ep.step(nid).render()
    assert len(set(rec["negatives"])) == len(rec["negatives"])
    assert not set(rec["negatives"]) & set(rec["positives"])
    # same seed, same record; the positives cap keeps every evidence step
    assert record_for(ep, qa, cfg_for(tmp_path)) == rec
    capped = record_for(ep, qa, cfg_for(tmp_path, max_positives=1, window_size=1))
    assert capped["positive_ids"] == ["D1:2", "D1:4"]
    bm25_only = record_for(ep, qa, cfg_for(tmp_path), dense=False)
    assert "dense" not in bm25_only["negative_kinds"]


def test_neighbour_exclusion(tmp_path):
    ep = toy_episode()
    rec = record_for(ep, ep.qa[0], cfg_for(tmp_path, neighbour_exclusion=1, bm25_negatives=20, dense_negatives=0,
                                           hard_pool=20, window_negatives=0))
    assert not {"D1:0", "D1:1", "D1:2"} & set(rec["negative_ids"])


def test_skips_empty_and_unknown_evidence(tmp_path):
    ep = toy_episode([QA("toy/ok", "Where did Ann buy the kite?", "fair", ["D1:1"]),
                      QA("toy/empty", "Anything?", "x", []),
                      QA("toy/unknown", "What?", "x", ["D1:1", "D9:99"])])
    cfg = cfg_for(tmp_path)
    synth = RetrieverSynthesizer(cfg, retriever=HybridRetriever(dense_weight=0.0))
    counts, skipped = Counter(), {"no_evidence": [], "unknown_evidence": []}
    Path(cfg.output_dir).mkdir(parents=True)
    synth.run_split([ep], "train", counts, skipped, progress=False)
    recs = read_retriever_records(Path(cfg.output_dir) / "train.jsonl")
    assert [r["id"] for r in recs] == ["toy/ok"]
    assert counts["skipped_no_evidence"] == 1 and counts["skipped_unknown_evidence"] == 1
    assert skipped == {"no_evidence": ["toy/empty"], "unknown_evidence": ["toy/unknown: D9:99"]}


def test_locomo_job_split_stats_and_datasets(tmp_path):
    from datasets import load_dataset

    from routers import cli

    cfg_path = tmp_path / "synth.yaml"
    cfg_path.write_text(f"output_dir: {tmp_path / 'data'}\ncorpora: [locomo]\nencoder: none\nmax_qa_per_episode: 2\n")
    assert cli.main(["synth", "retriever", str(cfg_path)]) == 0
    out = tmp_path / "data"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["train"]["records"] == 16 and stats["eval"]["records"] == 4
    assert stats["eval"]["episodes"] == ["conv-26", "conv-30"]
    assert not set(stats["train"]["episodes"]) & {"conv-26", "conv-30"}
    assert stats["train"]["positives"]["by_kind"]["step"] >= 16 and stats["train"]["negatives"]["mean"] > 0
    assert stats["train"]["negatives"]["by_kind"].get("window", 0) > 0 and "dense" not in stats["train"]["negatives"]["by_kind"]
    assert stats["corpus"]["locomo"]["episodes"] == 10 and "skipped" in stats
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "memroute.retriever" and manifest["eval_episodes"] == ["conv-26", "conv-30"]
    assert (out / "resolved_config.yaml").exists()
    recs = read_retriever_records(out / "train.jsonl")
    for r in recs:
        assert r["source"] == "locomo" and r["split"] == "train" and len(r["positives"]) >= 1
        assert set(r["evidence_ids"]) <= set(r["positive_ids"])
    ds = load_dataset("json", data_files=str(out / "train.jsonl"), split="train")
    assert len(ds) == 16 and isinstance(ds[0]["positives"], list) and ds[0]["query"] == recs[0]["query"]
    ds2 = load_retriever_dataset(out / "train.jsonl")
    assert ds2.column_names == list(RECORD_FIELDS) and ds2[3]["negatives"] == recs[3]["negatives"]


def test_resume_after_a_kill_gives_the_same_file(tmp_path):
    cfg = cfg_for(tmp_path, max_qa_per_episode=3)
    RetrieverSynthesizer(cfg, retriever=HybridRetriever(dense_weight=0.0)).run(progress=False)
    path = Path(cfg.output_dir) / "train.jsonl"
    full = path.read_text()
    lines = full.splitlines(keepends=True)
    path.write_text("".join(lines[:7]) + lines[7][:25])  # killed mid-record
    stats = RetrieverSynthesizer(cfg, retriever=HybridRetriever(dense_weight=0.0)).run(progress=False)
    assert path.read_text() == full
    assert stats["this_run"]["resumed_skip"] == 7 + 6  # 7 train records kept + all 6 eval records
    assert stats["train"]["records"] == 24


def test_hotpotqa_supporting_sentences(tmp_path):
    if not HOTPOTQA.exists():
        pytest.skip(f"{HOTPOTQA} not available")
    cfg = cfg_for(tmp_path, corpora=["hotpotqa"], hotpotqa_path=str(HOTPOTQA), max_qa_per_episode=1,
                  hotpotqa_eval_fraction=0.1)
    stats = RetrieverSynthesizer(cfg, retriever=HybridRetriever(dense_weight=0.0)).run(progress=False)
    kept = stats["corpus"]["hotpotqa"]["qa_kept"]
    assert kept >= 90 and stats["train"]["records"] + stats["eval"]["records"] == kept
    assert 0 < stats["eval"]["records"] <= 10
    data = json.loads(HOTPOTQA.read_text())
    by_id = {str(d["_id"]): d for d in data}
    rec = read_retriever_records(Path(cfg.output_dir) / "train.jsonl")[0]
    item = by_id[rec["episode_id"]]
    assert rec["source"] == "hotpotqa" and rec["query"] == item["question"]
    expected = {f"{t}#{i}" for t, i in item["supporting_facts"]}
    n = len(rec["evidence_ids"])
    assert n and set(rec["evidence_ids"]) <= expected and rec["positive_ids"][:n] == rec["evidence_ids"]


def test_bad_config_and_malformed_records(tmp_path):
    with pytest.raises(ValueError, match="nope"):
        RetrieverSynthesizer(cfg_for(tmp_path, corpora=["nope"]), retriever=HybridRetriever(dense_weight=0.0)).run()
    with pytest.raises(ValueError, match="conv-99"):
        RetrieverSynthesizer(cfg_for(tmp_path, eval_episodes=["conv-99"]), retriever=HybridRetriever(dense_weight=0.0)).run()
    with pytest.raises(FileNotFoundError):
        RetrieverSynthesizer(cfg_for(tmp_path, corpora=["hotpotqa"], hotpotqa_path=str(tmp_path / "x.json")),
                             retriever=HybridRetriever(dense_weight=0.0)).run()
    good = {"id": "a", "qa_id": "a", "episode_id": "e", "query": "q?", "positives": ["p"], "negatives": [],
            "positive_ids": ["p1"], "negative_ids": []}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "positives": []}) + "\n")
    with pytest.raises(RecordError) as err:
        read_retriever_records(path)
    assert err.value.line == 2 and str(path) in str(err.value) and "positives" in str(err.value)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(RecordError, match=":2:"):
        read_retriever_records(path)
    path.write_text(json.dumps({**good, "positive_ids": []}) + "\n")
    with pytest.raises(RecordError, match="same length"):
        read_retriever_records(path)


def test_record_reader_rejects_duplicates_bad_caps_and_names_missing_files(tmp_path):
    good = {"id": "a", "qa_id": "a", "episode_id": "e", "query": "q?", "positives": ["p"], "negatives": [],
            "positive_ids": ["p1"], "negative_ids": []}
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "query": "other?"}) + "\n")
    with pytest.raises(RecordError, match="duplicate id 'a'") as err:
        read_retriever_records(path)
    assert err.value.line == 2
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_records"):
            read_retriever_records(path, max_records=bad)
    with pytest.raises(FileNotFoundError, match="missing.jsonl: retriever record file not found"):
        read_retriever_records(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="is a directory"):
        read_retriever_records(tmp_path)
