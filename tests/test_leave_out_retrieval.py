"""Leave-one-corpus-out for the retriever (eval/leave_out.py): the training file without a corpus."""

from __future__ import annotations

import json
from pathlib import Path

from eval.leave_out import LeaveOutConfig, corpus_sources, write_train_without

CORPORA = ("locomo", "hotpotqa", "taubench")


def _records(split: str) -> list[dict]:
    return [{"id": f"{c}/{split}/q{i}", "qa_id": f"{c}/{split}/q{i}", "episode_id": f"{c}-{i}", "source": c,
             "split": split, "query": f"question {i} of {c}", "positives": ["[s1] yes"], "negatives": ["[s2] no"]}
            for c in CORPORA for i in range(3)]


def _write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def test_one_synth_file_for_every_corpus(tmp_path):
    """`synth retriever` with several corpora writes one train.jsonl / eval.jsonl for all of them (the documented
    `--corpus_files C=TRAIN,HELDOUT` for every C names the same files): the file without C must hold every other
    record once, and no record of C (it used to hold each record once per other corpus, and the leak check
    counted every record of the shared file as C's and refused)."""
    train = _write(tmp_path / "data" / "train.jsonl", _records("train"))
    held = _write(tmp_path / "data" / "eval.jsonl", _records("eval"))
    cfg = LeaveOutConfig(leave_out=["taubench"], corpus_files=[f"{c}={train},{held}" for c in CORPORA])
    sources = corpus_sources(cfg)
    out = tmp_path / "o" / "taubench" / "train_without.jsonl"
    info = write_train_without("retrieval", sources, "taubench", out, seed=0)
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in _records("train") if r["source"] != "taubench")
    assert info["samples"] == len(ids) == 6


def test_one_file_per_corpus_still_works(tmp_path):
    """Separate per-corpus files (records without `source` belong to the corpus naming the file)."""
    files = {}
    for c in CORPORA:
        recs = [{k: v for k, v in r.items() if k != "source"} for r in _records("train") if r["source"] == c]
        files[c] = _write(tmp_path / c / "train.jsonl", recs)
        _write(tmp_path / c / "eval.jsonl", [r for r in _records("eval") if r["source"] == c])
    sources = corpus_sources(LeaveOutConfig(leave_out=["locomo"], corpus_files=[f"{c}={p}" for c, p in files.items()]))
    out = tmp_path / "o" / "train_without.jsonl"
    write_train_without("retrieval", sources, "locomo", out, seed=0)
    ids = sorted(json.loads(x)["id"] for x in out.read_text().splitlines())
    assert ids == sorted(r["id"] for r in _records("train") if r["source"] != "locomo")


def test_retrieval_scores_name_each_system_and_its_hybrid(tmp_path, monkeypatch):
    """The router without C and the in-corpus router are each scored alone and inside the hybrid prefix (BM25 +
    dense, as deployed); their results land under distinct keys (hybrid_without / hybrid_in_corpus)."""
    import eval.leave_out as lo

    held = _write(tmp_path / "eval.jsonl", _records("eval"))
    calls = []

    def fake_eval(argv):
        systems = argv[argv.index("--systems") + 1:argv.index("--output_dir")]
        calls.append(systems)
        return {"systems": {s: {"recall@5": 0.1 * (i + 1), "mrr@10": 0.0, "n_queries": 3}
                            for i, s in enumerate(systems)}}

    monkeypatch.setattr(lo, "_evaluator", lambda kind: fake_eval)
    cfg = LeaveOutConfig(leave_out=["locomo"], corpus_files=[])
    models = {"base": "B", "without": "W", "in_corpus": "I"}
    cfg.retrieval_peak_fusion = False
    out = lo.score_retrieval(cfg, "locomo", held, models, tmp_path / "o")
    assert calls == [["bm25", "base", "trained", "hybrid_base", "hybrid_trained"], ["trained", "hybrid_trained"]]
    assert {k: round(v["recall@5"], 1) for k, v in out.items()} == {
        "bm25": 0.1, "base": 0.2, "without": 0.3, "hybrid_base": 0.4, "hybrid_without": 0.5,
        "in_corpus": 0.1, "hybrid_in_corpus": 0.2}
    from eval.leave_out_report import format_table

    table = format_table("retrieval", {"locomo": out})
    assert table.splitlines()[0].split(" | ")[2:9] == [
        "base recall@5", "without recall@5", "in_corpus recall@5", "bm25 recall@5", "hybrid_base recall@5",
        "hybrid_without recall@5", "hybrid_in_corpus recall@5"]
    cfg.retrieval_hybrid = False
    calls.clear()
    lo.score_retrieval(cfg, "locomo", held, models, tmp_path / "o2")
    assert calls == [["bm25", "base", "trained"], ["trained"]]


def test_dense_weight_is_chosen_on_the_training_corpora_never_on_c(tmp_path, monkeypatch):
    """With retrieval_dense_weights the router without C is swept on every other corpus's held-out questions; the
    weight with the best mean Recall@5 there (ties: the smaller) scores C, and C is never swept."""
    import eval.leave_out as lo

    held = _write(tmp_path / "eval.jsonl", _records("eval"))
    table = {"hotpotqa": {"0.2": 0.5, "0.5": 0.7, "0.8": 0.6}, "taubench": {"0.2": 0.9, "0.5": 0.7, "0.8": 0.6}}
    calls = []

    def fake_eval(argv):
        corpus, systems = argv[argv.index("--corpus") + 1], argv[argv.index("--systems") + 1]
        calls.append((corpus, "--dense_weight_sweep" in argv, argv[argv.index("--dense_weight") + 1]
                      if "--dense_weight" in argv else None))
        if "--dense_weight_sweep" in argv:
            assert corpus != "locomo"
            return {"systems": {"hybrid_trained": {"by_dense_weight": {w: {"recall@5": r} for w, r in table[corpus].items()}}}}
        return {"systems": {s: {"recall@5": 0.25, "mrr@10": 0.0, "n_queries": 3} for s in argv[argv.index("--systems") + 1:
                                                                                     argv.index("--output_dir")]}}

    monkeypatch.setattr(lo, "_evaluator", lambda kind: fake_eval)
    cfg = LeaveOutConfig(leave_out=["locomo"], corpus_files=[], retrieval_dense_weights=[0.2, 0.5, 0.8])
    out = lo.score_retrieval(cfg, "locomo", held, {"base": "B", "without": "W", "in_corpus": None}, tmp_path / "o",
                             others={"hotpotqa": held, "taubench": held})
    choice = out["hybrid_without_chosen"]["choice"]
    assert choice["dense_weight"] == 0.2  # mean 0.7 ties 0.5's 0.7: the smaller weight
    assert choice["chosen_on"] == ["hotpotqa", "taubench"] and choice["mean_recall@5"]["0.8"] == 0.6
    assert calls[-1] == ("locomo", False, "0.2") and out["hybrid_without_chosen"]["recall@5"] == 0.25
    assert sum(1 for c in calls if c[1]) == 2


def test_peak_fusion_rescores_only_the_hybrids_with_the_per_query_weight(tmp_path, monkeypatch):
    """retrieval_peak_fusion (the default) runs the evaluator once more per model, on the hybrid systems only, with
    --fusion peak into its own output folder (its own score cache) and the corpus path kept; the results land
    under *_peak keys beside the min-max ones, and the table shows them."""
    import eval.leave_out as lo

    held = _write(tmp_path / "eval.jsonl", _records("eval"))
    calls = []

    def fake_eval(argv):
        systems = argv[argv.index("--systems") + 1:argv.index("--output_dir")]
        peak = "--fusion" in argv
        calls.append((systems, argv[argv.index("--fusion") + 1] if peak else None,
                      Path(argv[argv.index("--output_dir") + 1]).name, argv[argv.index("--corpus_path") + 1]))
        return {"systems": {s: {"recall@5": (0.9 if peak else 0.1) + 0.01 * i, "mrr@10": 0.0, "n_queries": 3}
                            for i, s in enumerate(systems)}}

    monkeypatch.setattr(lo, "_evaluator", lambda kind: fake_eval)
    cfg = LeaveOutConfig(leave_out=["locomo"], corpus_files=[], corpus_paths=["locomo=/data/locomo.json"])
    out = lo.score_retrieval(cfg, "locomo", held, {"base": "B", "without": "W", "in_corpus": "I"}, tmp_path / "o")
    assert calls == [
        (["bm25", "base", "trained", "hybrid_base", "hybrid_trained"], None, "without", "/data/locomo.json"),
        (["hybrid_base", "hybrid_trained"], "peak", "without_peak", "/data/locomo.json"),
        (["trained", "hybrid_trained"], None, "in_corpus", "/data/locomo.json"),
        (["hybrid_trained"], "peak", "in_corpus_peak", "/data/locomo.json")]
    assert {k: round(v["recall@5"], 2) for k, v in out.items() if k.endswith("_peak")} == {
        "hybrid_base_peak": 0.9, "hybrid_without_peak": 0.91, "hybrid_in_corpus_peak": 0.9}
    assert round(out["hybrid_without"]["recall@5"], 2) == 0.14
    from eval.leave_out_report import format_table

    head = format_table("retrieval", {"locomo": out}).splitlines()[0]
    assert "hybrid_without_peak recall@5" in head and "hybrid_base_peak recall@5" in head


def test_plot_shows_only_the_models_that_were_scored(tmp_path, monkeypatch):
    """No legend entry (and empty bar slot) for a model that no corpus has (here: no in-corpus router given)."""
    import eval.plots
    from eval.leave_out_report import bar_plot

    figs = []
    monkeypatch.setattr(eval.plots, "save_figure", lambda fig, path: figs.append(fig))
    rows = {c: {m: {"recall@5": 0.5, "n": 3} for m in ("base", "without", "bm25", "hybrid_without", "hybrid_without_peak")}
            for c in ("locomo", "taubench")}
    bar_plot("retrieval", rows, tmp_path / "p.png")
    labels = [t.get_text() for t in figs[0].axes[0].get_legend().get_texts()]
    assert labels == ["base", "without", "bm25", "hybrid_without", "hybrid_without_peak"]


def test_one_corpus_plot_is_as_wide_as_three(tmp_path, monkeypatch):
    """One left-out corpus used to get a figure so narrow that its two titles and legends overlapped."""
    import eval.plots
    from eval.leave_out_report import bar_plot

    figs = []
    monkeypatch.setattr(eval.plots, "save_figure", lambda fig, path: figs.append(fig))
    for corpora in (("hotpotqa",), ("hotpotqa", "locomo", "textworld")):
        bar_plot("sufficiency", {c: {m: {"auroc": 0.6, "n": 4} for m in ("base", "without", "surface")}
                                 for c in corpora}, tmp_path / "p.png")
    assert figs[0].get_size_inches()[0] == figs[1].get_size_inches()[0]
    assert [t.get_text() for t in figs[0].axes[0].get_legend().get_texts()] == ["base", "without", "surface"]
