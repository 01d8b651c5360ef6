"""The retriever's evaluation during training: a sentence-transformers ``InformationRetrievalEvaluator`` over dev records.

Each dev record is one query; the corpus is every candidate text (positives and mined negatives) of all dev records,
deduplicated by text, and a query's relevant documents are its own positives. The trainer logs the evaluator's
metrics as ``eval_dev_cosine_recall@k``, ``eval_dev_cosine_mrr@10``, ``eval_dev_cosine_ndcg@10`` ...; the primary
metric (``eval_dev_cosine_ndcg@10``) selects the best checkpoint unless ``metric_for_best_model`` names another.
"""

from __future__ import annotations

from routers.logs import get_logger

log = get_logger(__name__)

EVAL_NAME = "dev"
PRIMARY_METRIC = f"eval_{EVAL_NAME}_cosine_ndcg@10"


def ir_evaluator(records: list[dict], batch_size: int = 32, name: str = EVAL_NAME):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim

    corpus: dict[str, str] = {}
    by_text: dict[str, str] = {}
    queries, relevant = {}, {}
    for n, rec in enumerate(records):
        qid = f"q{n}"
        queries[qid] = rec["query"]
        for text in [*rec["positives"], *(rec.get("negatives") or [])]:
            if text not in by_text:
                by_text[text] = f"c{len(by_text)}"
                corpus[by_text[text]] = text
        relevant[qid] = {by_text[t] for t in rec["positives"]}
    return InformationRetrievalEvaluator(queries, corpus, relevant, name=name, batch_size=batch_size,
                                         score_functions={"cosine": cos_sim}, main_score_function="cosine",
                                         mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1, 5, 10],
                                         precision_recall_at_k=[1, 5, 10], map_at_k=[10], write_csv=False,
                                         show_progress_bar=False)


def select_best_by_primary_metric(cfg) -> None:
    """``load_best_model_at_end`` without a metric (TrainingArguments then picks ``loss``, which an evaluator-only
    run never logs): use the evaluator's primary metric, higher is better."""
    if cfg.load_best_model_at_end and cfg.metric_for_best_model in (None, "loss", "eval_loss"):
        cfg.metric_for_best_model, cfg.greater_is_better = PRIMARY_METRIC, True
        log.info("best model selected by %s (higher is better)", PRIMARY_METRIC)
