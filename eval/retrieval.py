"""IR evaluation of evidence retrieval on held-out conversations (``memroute eval retrieval``).

    memroute eval retrieval configs/retriever/eval/default.yaml [--trained_encoder outputs/retriever_minilm/export]

For every question of the held-out episodes, each system ranks *all* steps of that question's
episode; the relevant set is the question's evidence steps. Systems:

* ``bm25``: BM25 over ``Step.render()`` (the lexical half of the retrieval prefix);
* ``base`` / ``trained``: dense cosine with the base / trained encoder (``VectorIndex`` per episode);
* ``hybrid_base`` / ``hybrid_trained``: the Router-Mem fast prefix (``HybridRetriever``, BM25 + dense
  min-max mixed with ``dense_weight``, or per query with ``--fusion peak``) with the base / trained encoder.

Ties are broken by temporal order everywhere. Metrics (multi-positive aware, means over questions):

* Recall@k = |evidence in top k| / |evidence| (share of the question's evidence found);
* MRR@10 = 1 / rank of the first evidence step within the top 10 (0 if none);
* nDCG@10 with binary gains: DCG = sum_{rank r <= 10, relevant} 1 / log2(r + 1), normalized by the
  ideal DCG of min(|evidence|, 10) relevant steps at the top.

Writes ``metrics.json`` (config, machine, versions, data, per-system metrics, per-category Recall@5,
deltas vs the baselines, targets), ``metrics.csv``, ``retrieval_metrics.png``, ``rankings.jsonl`` (top 10
per question and system) and ``resolved_config.yaml`` into ``output_dir``; every file atomically.
``ranking_cache.jsonl`` keeps each question's top 10 as soon as its episode is ranked, keyed by system +
encoder identity + question id + input hash (eval/score_cache.py): a killed run, rerun with the same
command, ranks only what is missing and writes the same metrics (``--resume false``: rank everything).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from data_synthesis.corpora import load_corpus
from routers.io import OutputLock, atomic_write_json, atomic_write_text
from routers.machine import machine_info
from eval.score_cache import ResultCache, content_hash, model_identity, ranking_field
from routers.base import git_revision, library_versions
from routers.memory.index import VectorIndex
from routers.memory.retrieval import FUSIONS, HybridRetriever, mix_scores
from routers.memory.schema import LoadStats
from routers.models import DEFAULT_ENCODER, load_encoder, resolve_encoder
from routers.config import ConfigError, make_arg_parser, parse_config, save_resolved_config
from routers.logs import get_logger, setup_cli_logging

log = get_logger("eval.retrieval")  # the same name under python -m

SYSTEMS = ("bm25", "base", "trained", "hybrid_base", "hybrid_trained")
CUTOFF = 10


@dataclass
class RetrievalEvalConfig:
    trained_encoder: str | None = field(default="outputs/retriever_minilm/export", metadata={
        "help": "Trained retriever (RetrieverRouter export or any sentence-transformers folder); 'none' skips it."})
    base_encoder: str = field(default=DEFAULT_ENCODER, metadata={"help": "Baseline encoder (alias, HF id or path)."})
    corpus: str = field(default="locomo", metadata={"help": "locomo, hotpotqa, textworld or episodes (your own data)"})
    corpus_path: str | None = field(default=None, metadata={
        "help": "default: the bundled LoCoMo; episodes: an Episode JSONL / JSON / parquet file or Hub dataset id"})
    eval_episodes: list[str] | None = field(default_factory=lambda: ["conv-26", "conv-30"], metadata={
        "help": "Held-out episodes (must not be in the retriever's training data); None (or 'all') = all."})
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    ks: list[int] = field(default_factory=lambda: [1, 5, 10], metadata={
        "help": f"Recall@k cutoffs, each in 1..{CUTOFF} (rankings keep the top {CUTOFF})."})
    dense_weight: float = field(default=0.5, metadata={"help": "Dense share in the hybrid prefix, in [0, 1]."})
    fusion: str = field(default="minmax", metadata={
        "help": "Hybrid mixing: minmax (at dense_weight) or peak (a per-query dense weight from how far each "
                "retriever's top score stands out; label-free, for corpora the weight was never tuned on)",
        "choices": list(FUSIONS)})
    dense_weight_sweep: list[float] = field(default_factory=list, metadata={
        "help": "Hybrid systems: also report Recall/MRR at each of these dense weights (one BM25 + dense pass, mixed "
                "per weight; their rankings are recomputed, not read from the cache)."})
    max_queries: int | None = field(default=None, metadata={"help": "Evaluate only the first N questions (N >= 1)."})
    batch_size: int = 64
    output_dir: str = "results/retriever_eval"
    resume: bool = field(default=True, metadata={
        "help": "Reuse the rankings in output_dir/ranking_cache.jsonl (same encoder, same questions); false re-ranks."})

    def __post_init__(self):
        # ValueErrors: parse_config turns them into a ConfigError naming the recipe (or the command line)
        if self.eval_episodes is not None and [e.lower() for e in self.eval_episodes] == ["all"]:
            self.eval_episodes = None
        if self.eval_episodes is not None and not self.eval_episodes:
            raise ValueError("eval_episodes is empty: list the held-out episodes, or 'all' / null for every episode")
        if not self.ks or any(not 1 <= k <= CUTOFF for k in self.ks):
            raise ValueError(f"ks must be cutoffs in 1..{CUTOFF} (rankings keep the top {CUTOFF}), got {self.ks}")
        if not 0.0 <= self.dense_weight <= 1.0:
            raise ValueError(f"dense_weight must lie in [0, 1], got {self.dense_weight}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, got {self.fusion!r}")
        if any(not 0.0 <= w <= 1.0 for w in self.dense_weight_sweep):
            raise ValueError(f"dense_weight_sweep values must lie in [0, 1], got {self.dense_weight_sweep}")
        if self.max_queries is not None and self.max_queries < 1:
            raise ValueError(f"max_queries must be >= 1 (got {self.max_queries}); omit it to evaluate every question")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


# -- metrics -----------------------------------------------------------------------------------------------
def recall_at_k(ranked: Sequence[str], relevant, k: int) -> float:
    rel = set(relevant)
    if not rel:
        raise ValueError("no relevant items")
    return len(rel & set(ranked[:k])) / len(rel)


def mrr_at_k(ranked: Sequence[str], relevant, k: int = CUTOFF) -> float:
    rel = set(relevant)
    for i, item in enumerate(ranked[:k]):
        if item in rel:
            return 1.0 / (i + 1)
    return 0.0


def ndcg_at_k(ranked: Sequence[str], relevant, k: int = CUTOFF) -> float:
    rel = set(relevant)
    if not rel:
        raise ValueError("no relevant items")
    dcg = sum(1.0 / math.log2(i + 2) for i, item in enumerate(ranked[:k]) if item in rel)
    idcg = sum(1.0 / math.log2(i + 2) for i in range(min(len(rel), k)))
    return dcg / idcg


def query_metrics(ranked: Sequence[str], relevant, ks: Sequence[int] = (1, 5, 10), cutoff: int = CUTOFF) -> dict:
    out = {f"recall@{k}": recall_at_k(ranked, relevant, k) for k in ks}
    out[f"mrr@{cutoff}"] = mrr_at_k(ranked, relevant, cutoff)
    out[f"ndcg@{cutoff}"] = ndcg_at_k(ranked, relevant, cutoff)
    return out


def ir_metrics(rankings: Sequence[Sequence[str]], relevants: Sequence, ks: Sequence[int] = (1, 5, 10),
               cutoff: int = CUTOFF) -> dict:
    """Means over queries of :func:`query_metrics` (plus ``n_queries``)."""
    if len(rankings) != len(relevants) or not rankings:
        raise ValueError("need one ranking per relevant set, and at least one")
    rows = [query_metrics(r, rel, ks, cutoff) for r, rel in zip(rankings, relevants)]
    return {"n_queries": len(rows), **{k: float(np.mean([r[k] for r in rows])) for k in rows[0]}}


# -- ranking -----------------------------------------------------------------------------------------------
def rank_by_scores(scores: np.ndarray, ids: Sequence[str], k: int = CUTOFF) -> list[str]:
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))[:k]
    return [ids[i] for i in order]


def _load_episodes(cfg: RetrievalEvalConfig):
    stats = LoadStats()
    episodes = load_corpus(cfg.corpus, cfg.corpus_path, stats=stats)
    if cfg.eval_episodes is not None:
        missing = sorted(set(cfg.eval_episodes) - {e.episode_id for e in episodes})
        if missing:
            ids = sorted(e.episode_id for e in episodes)
            raise ValueError(f"eval_episodes {missing} not found in {cfg.corpus} {cfg.corpus_path or '(bundled)'} "
                             f"(it has {ids[:12]}{' ...' if len(ids) > 12 else ''})")
        episodes = [e for e in episodes if e.episode_id in set(cfg.eval_episodes)]
    if not any(ep.qa for ep in episodes):
        raise ValueError(f"{cfg.corpus} {cfg.corpus_path or '(bundled)'}: the selected episodes "
                         f"{[e.episode_id for e in episodes][:12]} hold no questions to evaluate")
    return episodes, stats


def evaluate_systems(cfg: RetrievalEvalConfig, episodes, encoders: Mapping[str, object], cache=None,
                     identities: Mapping[str, str | None] | None = None) -> tuple[dict, list[dict]]:
    """Rank every question's episode with every system; returns (per-system results, rankings rows).

    ``encoders``: {"base": model, "trained": model}, objects with a sentence-transformers ``encode``.
    ``cache`` (a :class:`eval.score_cache.ResultCache`) holds top-10 lists per question; a system is
    cached only when ``identities`` names its encoder ("base"/"trained"; BM25 always).
    """
    pairs = [(ep, qa) for ep in episodes for qa in ep.qa]
    if cfg.max_queries is not None:
        pairs = pairs[: cfg.max_queries]
    if not pairs:
        raise ValueError("no questions to evaluate")
    results: dict[str, dict] = {}
    rows: list[dict] = []
    for system in cfg.systems:
        t0 = time.perf_counter()
        kind, enc_name = ("bm25", None) if system == "bm25" else (
            ("dense", system) if system in ("base", "trained") else ("hybrid", system.split("_", 1)[1]))
        encoder = encoders.get(enc_name) if enc_name else None
        if enc_name and encoder is None:
            continue
        rankings, relevants, cats = [], [], []
        retriever = HybridRetriever(encoder=encoder, dense_weight=0.0 if kind == "bm25" else cfg.dense_weight,
                                    batch_size=cfg.batch_size, fusion=cfg.fusion) if kind != "dense" else None
        sweep = list(cfg.dense_weight_sweep) if kind == "hybrid" else []
        swept: dict[float, list] = {w: [] for w in sweep}
        by_ep: dict[str, list] = defaultdict(list)
        for ep, qa in pairs:
            by_ep[ep.episode_id].append((ep, qa))
        ident = "bm25" if kind == "bm25" else (identities or {}).get(enc_name)
        mixing = (f"dense_weight={cfg.dense_weight}" + ("" if cfg.fusion == "minmax" else f":fusion={cfg.fusion}")
                  if kind == "hybrid" else "dense_weight=None")
        system_key = f"{system}:{ident}:{mixing}" if ident else None
        for group in by_ep.values():
            ep = group[0][0]
            ids = [s.step_id for s in ep.steps]
            questions = [qa.question for _, qa in group]
            keys = None
            if cache is not None and system_key:
                ep_hash = content_hash(ids, [s.render() for s in ep.steps])
                keys = [cache.key(system_key, qa.qa_id, qa.question, ep_hash) for _, qa in group]
            hit = keys is not None and not sweep and all(k in cache for k in keys)
            if hit:
                ranked_all = [list(cache.get(k)["top10"]) for k in keys]
            elif kind == "dense":
                emb = encoder.encode([s.render() for s in ep.steps], batch_size=cfg.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
                index = VectorIndex.from_embeddings(ids, emb)
                q = encoder.encode(questions, batch_size=cfg.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False)
                top_ids, _ = index.search(q, CUTOFF)
                ranked_all = [list(map(str, r)) for r in top_ids]
            else:
                q = retriever.encode_queries(questions) if kind == "hybrid" else [None] * len(questions)
                scored = [retriever.scores(question, ep, query_embedding=qe) for question, qe in zip(questions, q)]
                ranked_all = [rank_by_scores(mixed, ids) for mixed, _, _ in scored]
                for w in sweep:
                    swept[w] += [(rank_by_scores(mix_scores(lex, dense, w), ids), set(qa.evidence))
                                 for (_, lex, dense), (_, qa) in zip(scored, group)]
            if keys is not None and not hit:  # one record per question, as soon as its episode is ranked
                for key, (_, qa), ranked in zip(keys, group, ranked_all):
                    cache.put({"key": key, "system": system, "qa_id": qa.qa_id, "top10": ranked})
            for (_, qa), ranked in zip(group, ranked_all):
                rankings.append(ranked)
                relevants.append(set(qa.evidence))
                cats.append(qa.category)
                rows.append({"system": system, "qa_id": qa.qa_id, "episode_id": ep.episode_id, "category": qa.category,
                             "evidence": list(qa.evidence), "top10": ranked, **query_metrics(ranked, qa.evidence, cfg.ks)})
        res = ir_metrics(rankings, relevants, cfg.ks)
        per_cat = defaultdict(list)
        for ranked, rel, cat in zip(rankings, relevants, cats):
            per_cat[cat].append(recall_at_k(ranked, rel, 5))
        res["recall@5_by_category"] = {c: {"n": len(v), "recall@5": float(np.mean(v))} for c, v in sorted(per_cat.items())}
        res["seconds"] = time.perf_counter() - t0
        res["encoder"] = {"base": cfg.base_encoder, "trained": cfg.trained_encoder}.get(enc_name)
        if kind == "hybrid":
            res["dense_weight"] = cfg.dense_weight
            res["fusion"] = cfg.fusion
        if sweep:
            res["by_dense_weight"] = {str(w): {m: v for m, v in ir_metrics([r for r, _ in swept[w]],
                                                                           [e for _, e in swept[w]], cfg.ks).items()
                                               if m in ("recall@5", "mrr@10")} for w in sweep}
        results[system] = res
        log.info("%s: %s", system, ", ".join(f"{k} {v:.3f}" for k, v in res.items()
                                              if k.startswith(("recall@", "mrr", "ndcg")) and isinstance(v, float)))
    return results, rows


def deltas(results: dict, metric: str = "recall@5") -> dict:
    out = {}
    for a, b in (("trained", "base"), ("trained", "bm25"), ("hybrid_trained", "hybrid_base"),
                 ("hybrid_base", "bm25"), ("hybrid_trained", "trained")):
        if a in results and b in results:
            out[f"{a}_minus_{b}"] = results[a][metric] - results[b][metric]
    return out


def metrics_csv(results: dict, columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["system", "n_queries", *columns])
    for name, res in results.items():
        writer.writerow([name, res["n_queries"], *(f"{res[c]:.6f}" for c in columns)])
    return buf.getvalue()


def bar_chart(results: dict, columns: Sequence[str], path, title: str = "Evidence retrieval on held-out episodes"):
    """Grouped bars: one group per metric, one bar per system (atomic PNG)."""
    from matplotlib.figure import Figure  # matplotlib only when the chart is drawn

    from eval.plots import save_figure

    fig = Figure(figsize=(max(7, 1.6 * len(columns) + 2), 4.5))
    ax = fig.subplots()
    names = list(results)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(columns))
    for i, name in enumerate(names):
        vals = [results[name][c] for c in columns]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width=width, label=name)
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v + 0.01, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(x)
    ax.set_xticklabels(columns)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean over questions")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", ncol=min(len(names), 5), loc="upper left")
    return save_figure(fig, path)


def run(cfg: RetrievalEvalConfig, encoders: Mapping[str, object] | None = None) -> dict:
    """Evaluate and write every output file; returns the metrics.json content. The output directory is
    locked for the run (a second run into it fails at once instead of appending to the same cache)."""
    cfg.__post_init__()  # a config edited after construction is checked again
    unknown = [s for s in cfg.systems if s not in SYSTEMS]
    if unknown or not cfg.systems:
        raise ConfigError(f"systems: unknown {unknown}; choose from {list(SYSTEMS)}")
    trained = cfg.trained_encoder
    if (encoders is None and trained and trained.lower() != "none"
            and any(s in cfg.systems for s in ("trained", "hybrid_trained")) and not Path(trained).exists()):
        raise FileNotFoundError(f"trained_encoder {trained} does not exist (train one, or pass --trained_encoder none)")
    episodes, load_stats = _load_episodes(cfg)  # bad corpus / episode ids fail before the lock and any model
    with OutputLock(cfg.output_dir):
        save_resolved_config(cfg.output_dir, cfg)
        return _run(cfg, encoders, episodes, load_stats)


def _run(cfg: RetrievalEvalConfig, encoders, episodes, load_stats) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    identities: dict[str, str | None] = {}
    if encoders is None:
        encoders = {}
        if any(s in cfg.systems for s in ("base", "hybrid_base")):
            encoders["base"] = load_encoder(cfg.base_encoder)
            identities["base"] = model_identity(resolve_encoder(cfg.base_encoder))
        trained = cfg.trained_encoder
        if trained and trained.lower() != "none" and any(s in cfg.systems for s in ("trained", "hybrid_trained")):
            if not Path(trained).exists():
                raise FileNotFoundError(f"trained_encoder {trained} does not exist (train one, or pass --trained_encoder none)")
            encoders["trained"] = load_encoder(trained)
            identities["trained"] = model_identity(trained)
    with ResultCache(out / "ranking_cache.jsonl", fresh=not cfg.resume, required=("top10",),
                     validate=ranking_field) as cache:
        results, rows = evaluate_systems(cfg, episodes, encoders, cache, identities)
        n_cached = cache.hits
    if n_cached:
        log.info("%d rankings reused from %s", n_cached, out / "ranking_cache.jsonl")
    if not results:
        raise ValueError(f"no system could run: {cfg.systems} (is the trained/base encoder missing?)")
    columns = [f"recall@{k}" for k in cfg.ks] + [f"mrr@{CUTOFF}", f"ndcg@{CUTOFF}"]
    d = deltas(results)
    targets = {}
    if "trained" in results and "base" in results:
        targets["trained_recall@5_gain_over_base_>=_0.05"] = bool(d["trained_minus_base"] >= 0.05)
    if "trained" in results and "bm25" in results:
        targets["trained_recall@5_beats_bm25"] = bool(d["trained_minus_bm25"] > 0)
    report = {
        "schema_version": 1, "task": "evidence retrieval (multi-positive)", "config": asdict(cfg),
        "machine": machine_info(), "versions": library_versions(), "git_revision": git_revision(),
        "data": {"corpus": cfg.corpus, "episodes": [e.episode_id for e in episodes],
                 "steps": sum(len(e.steps) for e in episodes), "questions": results[next(iter(results))]["n_queries"],
                 "mean_evidence_per_question": float(np.mean([len(qa.evidence) for e in episodes for qa in e.qa])),
                 "loader": load_stats.to_dict()},
        "metric_definitions": {"recall@k": "|evidence in top k| / |evidence|, mean over questions",
                               "mrr@10": "1/rank of the first evidence step in the top 10, else 0",
                               "ndcg@10": "binary gains, log2 discount, ideal = min(|evidence|, 10) hits on top"},
        "systems": results, "deltas_recall@5": d, "targets": targets,
        "files": {"csv": "metrics.csv", "plot": "retrieval_metrics.png", "rankings": "rankings.jsonl"},
    }
    atomic_write_json(out / "metrics.json", report)
    atomic_write_text(out / "metrics.csv", metrics_csv(results, columns))
    atomic_write_text(out / "rankings.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    bar_chart(results, columns, out / "retrieval_metrics.png")
    return report


def make_parser():
    return make_arg_parser([RetrievalEvalConfig], prog="memroute eval retrieval",
                           description="Recall@k / MRR@10 / nDCG@10 of evidence steps: BM25, base, trained, hybrid.")


def main(argv=None) -> dict:
    import sys

    if any(a == "--leave_out" or a.startswith("--leave_out=") for a in (sys.argv[1:] if argv is None else argv)):
        from eval.leave_out import main as leave_out_main  # leave-one-corpus-out (eval/leave_out.py)

        return leave_out_main(argv, kind="retrieval")
    setup_cli_logging()  # a CLI entry point (memroute eval retrieval, python -m eval.retrieval)
    from routers.models import offline_by_default

    offline_by_default()
    (cfg,) = parse_config(make_parser(), [RetrievalEvalConfig], argv)
    report = run(cfg)  # writes resolved_config.yaml once it holds the output lock
    print(metrics_csv(report["systems"], [f"recall@{k}" for k in cfg.ks] + [f"mrr@{CUTOFF}", f"ndcg@{CUTOFF}"]))
    print({"deltas_recall@5": report["deltas_recall@5"], "targets": report["targets"]})
    return report


if __name__ == "__main__":
    main()
