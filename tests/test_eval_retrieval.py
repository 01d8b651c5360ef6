"""IR metrics and the ``memroute eval retrieval`` job (eval/retrieval.py)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from retriever_helpers import BagOfLetters

from eval.retrieval import (RetrievalEvalConfig, ir_metrics, mrr_at_k, ndcg_at_k, query_metrics, rank_by_scores,
                            recall_at_k, run)

RANKED = ["a", "x", "b", "y", "z", "c", "w", "v", "u", "t", "d"]


def test_recall_is_the_share_of_evidence_found():
    rel = {"a", "b", "c", "d"}
    assert recall_at_k(RANKED, rel, 1) == 0.25
    assert recall_at_k(RANKED, rel, 3) == 0.5
    assert recall_at_k(RANKED, rel, 5) == 0.5
    assert recall_at_k(RANKED, rel, 6) == 0.75
    assert recall_at_k(RANKED, rel, 10) == 0.75  # d is at rank 11
    assert recall_at_k(RANKED, rel, 11) == 1.0
    assert recall_at_k(RANKED, ["q"], 10) == 0.0
    with pytest.raises(ValueError):
        recall_at_k(RANKED, [], 5)


def test_mrr():
    assert mrr_at_k(RANKED, {"a"}) == 1.0
    assert mrr_at_k(RANKED, {"b", "c"}) == pytest.approx(1 / 3)
    assert mrr_at_k(RANKED, {"y"}) == 0.25
    assert mrr_at_k(RANKED, {"d"}) == 0.0  # rank 11 is outside the cutoff
    assert mrr_at_k(RANKED, {"d"}, 11) == pytest.approx(1 / 11)


def test_ndcg_binary_gains():
    # relevant at ranks 1, 3, 6 (d at 11 is cut); ideal: 4 relevant -> ranks 1..4
    dcg = 1 / math.log2(2) + 1 / math.log2(4) + 1 / math.log2(7)
    idcg = sum(1 / math.log2(r + 1) for r in (1, 2, 3, 4))
    assert ndcg_at_k(RANKED, {"a", "b", "c", "d"}) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(RANKED, {"a"}) == 1.0
    assert ndcg_at_k(["x", "a"], {"a"}) == pytest.approx(1 / math.log2(3))
    assert ndcg_at_k(RANKED, {"q"}) == 0.0
    # a perfect ranking of 12 relevant items: only min(|R|, 10) count in the ideal DCG
    many = [f"r{i}" for i in range(12)]
    assert ndcg_at_k(many, set(many)) == pytest.approx(1.0)


def test_query_and_mean_metrics():
    row = query_metrics(RANKED, {"b", "c"}, ks=(1, 5, 10))
    assert row == {"recall@1": 0.0, "recall@5": 0.5, "recall@10": 1.0, "mrr@10": pytest.approx(1 / 3),
                   "ndcg@10": pytest.approx((1 / math.log2(4) + 1 / math.log2(7)) / (1 + 1 / math.log2(3)))}
    agg = ir_metrics([RANKED, ["b", "a"]], [{"b", "c"}, {"a"}], ks=(1, 5, 10))
    assert agg["n_queries"] == 2
    assert agg["recall@1"] == 0.0 and agg["recall@5"] == pytest.approx(0.75) and agg["recall@10"] == 1.0
    assert agg["mrr@10"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    with pytest.raises(ValueError):
        ir_metrics([], [])


def test_rank_by_scores_ties_in_temporal_order():
    assert rank_by_scores(np.array([0.1, 0.5, 0.5, 0.9]), ["s0", "s1", "s2", "s3"], 3) == ["s3", "s1", "s2"]


def hotpot_file(tmp_path):
    items = []
    for i, (q, gold, other) in enumerate([("Which river runs through Zorbia?", "The Zorbia river is long.", "Zorbia has hills."),
                                          ("Who founded Quelm?", "Quelm was founded by Ada.", "Quelm is a town."),
                                          ("What colour is the Vort flag?", "The Vort flag is green.", "Vort exports tea.")]):
        items.append({"_id": f"h{i}", "question": q, "answer": "x", "type": "bridge", "level": "easy",
                      "supporting_facts": [["Doc", 0]],
                      "context": [["Doc", [gold, other]], ["Filler", ["Nothing here.", "Still nothing.", other]]]})
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(items))
    return path


def test_eval_job_writes_every_output(tmp_path):
    cfg = RetrievalEvalConfig(corpus="hotpotqa", corpus_path=str(hotpot_file(tmp_path)), eval_episodes=None,
                              output_dir=str(tmp_path / "out"), trained_encoder="unused")
    report = run(cfg, encoders={"base": BagOfLetters(), "trained": BagOfLetters(shift=1)})
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} >= {"metrics.json", "metrics.csv", "retrieval_metrics.png", "rankings.jsonl"}
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["systems"].keys() == {"bm25", "base", "trained", "hybrid_base", "hybrid_trained"}
    assert on_disk["data"]["questions"] == 3 and on_disk["data"]["steps"] == 15
    assert {"platform", "cpu_count"} <= on_disk["machine"].keys() and "torch" in on_disk["versions"]
    for res in on_disk["systems"].values():
        assert res["n_queries"] == 3
        for key in ("recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10"):
            assert 0.0 <= res[key] <= 1.0
        assert res["recall@10"] == 1.0  # 5 steps per episode: everything is in the top 10
    # BM25 finds each gold sentence first (it shares the rare name and more words)
    assert on_disk["systems"]["bm25"]["recall@1"] == 1.0
    d = on_disk["deltas_recall@5"]
    assert d["trained_minus_base"] == pytest.approx(on_disk["systems"]["trained"]["recall@5"] - on_disk["systems"]["base"]["recall@5"])
    assert set(on_disk["targets"]) == {"trained_recall@5_gain_over_base_>=_0.05", "trained_recall@5_beats_bm25"}
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert [r["system"] for r in rows] == list(on_disk["systems"])
    assert float(rows[0]["recall@1"]) == pytest.approx(on_disk["systems"]["bm25"]["recall@1"], abs=1e-6)
    rankings = [json.loads(line) for line in (out / "rankings.jsonl").read_text().splitlines()]
    assert len(rankings) == 15 and all(len(r["top10"]) == 5 for r in rankings)
    assert (out / "retrieval_metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert report["systems"]["bm25"]["recall@5_by_category"]["bridge"]["n"] == 3


def test_eval_job_bad_options(tmp_path):
    from routers.config import ConfigError

    with pytest.raises(ConfigError, match="bogus"):
        run(RetrievalEvalConfig(systems=["bogus"], output_dir=str(tmp_path / "o")), encoders={})
    with pytest.raises(ValueError, match="conv-99"):
        run(RetrievalEvalConfig(eval_episodes=["conv-99"], output_dir=str(tmp_path / "o")), encoders={})
    with pytest.raises(FileNotFoundError, match="trained_encoder"):
        run(RetrievalEvalConfig(systems=["trained"], trained_encoder=str(tmp_path / "missing"),
                                output_dir=str(tmp_path / "o")))


def test_dense_weight_sweep_matches_separate_runs_at_each_weight(tmp_path):
    """One pass, mixed per weight, gives exactly what a run at that dense_weight gives (0 = BM25, 1 = dense)."""
    path = hotpot_file(tmp_path)

    def metrics(**kw):
        cfg = RetrievalEvalConfig(corpus="hotpotqa", corpus_path=str(path), eval_episodes=None, trained_encoder="unused",
                                  systems=["bm25", "trained", "hybrid_trained"], output_dir=str(tmp_path / str(kw)),
                                  resume=False, **kw)
        return run(cfg, encoders={"trained": BagOfLetters(shift=1)})["systems"]

    swept = metrics(dense_weight_sweep=[0.0, 0.3, 1.0])
    by_w = swept["hybrid_trained"]["by_dense_weight"]
    assert list(by_w) == ["0.0", "0.3", "1.0"]
    for w in ("0.0", "0.3", "1.0"):
        alone = metrics(dense_weight=float(w))["hybrid_trained"]
        assert by_w[w] == {"recall@5": alone["recall@5"], "mrr@10": alone["mrr@10"]}
    assert by_w["0.0"]["mrr@10"] == swept["bm25"]["mrr@10"]
    assert by_w["1.0"]["mrr@10"] == swept["trained"]["mrr@10"]
    with pytest.raises(ValueError, match="dense_weight_sweep"):
        RetrievalEvalConfig(dense_weight_sweep=[1.5])


def test_peak_fusion_is_cached_apart_from_minmax(tmp_path):
    """--fusion peak ranks each question at its per-query weight, and a score cache holding the min-max rankings of
    the same encoder and questions is not served for it (the cache key names the fusion)."""
    from eval.retrieval import _load_episodes, evaluate_systems
    from eval.score_cache import ResultCache
    from routers.memory.retrieval import HybridRetriever

    path, enc = hotpot_file(tmp_path), BagOfLetters(shift=1)
    cfgs = {f: RetrievalEvalConfig(corpus="hotpotqa", corpus_path=str(path), eval_episodes=None, trained_encoder="unused",
                                   systems=["hybrid_trained"], fusion=f, output_dir=str(tmp_path / "o"))
            for f in ("minmax", "peak")}
    episodes, _ = _load_episodes(cfgs["peak"])
    with ResultCache(tmp_path / "cache.jsonl", required=("top10",)) as cache:
        minmax, _ = evaluate_systems(cfgs["minmax"], episodes, {"trained": enc}, cache, {"trained": "enc-1"})
        peak, rows = evaluate_systems(cfgs["peak"], episodes, {"trained": enc}, cache, {"trained": "enc-1"})
        assert cache.hits == 0
        again, _ = evaluate_systems(cfgs["peak"], episodes, {"trained": enc}, cache, {"trained": "enc-1"})
        assert cache.hits == len(rows)
    assert peak["hybrid_trained"]["fusion"] == "peak" and again == {k: {**v, "seconds": again[k]["seconds"]}
                                                                    for k, v in peak.items()}
    retriever = HybridRetriever(encoder=enc, dense_weight=0.5, fusion="peak")
    by_id = {qa.qa_id: (ep, qa) for ep in episodes for qa in ep.qa}
    for row in rows:
        ep, qa = by_id[row["qa_id"]]
        mixed, _, _ = retriever.scores(qa.question, ep)
        assert row["top10"] == rank_by_scores(mixed, [s.step_id for s in ep.steps])[:10]
