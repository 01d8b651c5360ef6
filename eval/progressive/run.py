"""Orchestration of ``memroute eval progressive``: select the questions, run what the cache lacks, score cached
questions with new routers, derive every row and write the outputs (atomically)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from data_synthesis.corpora import load_corpus
from routers.io import OutputLock, ResumableJsonlWriter, atomic_write_json, atomic_write_text, read_jsonl
from eval.progressive.cache import config_hash, router_ids, score_new_routers
from eval.progressive.config import ProgressiveEvalConfig
from eval.progressive.execute import LazyModels, run_missing, select_questions
from eval.progressive.report import build_metrics, format_table, pareto_plot, rows_csv, split_rows
from routers.config import make_arg_parser, parse_config, save_resolved_config
from routers.logs import get_logger, setup_cli_logging

log = get_logger(__name__)


def run(cfg: ProgressiveEvalConfig, backend=None, routers=None, retriever=None, rag_retriever=None, judge=None,
        counter=None) -> dict:
    """Evaluate (resuming from the cache) and write every output; returns metrics.json's content.

    Models are injected in tests; by default they are built from the config, and only when a question is
    missing from the cache.
    """
    episodes = load_corpus(cfg.corpus, cfg.corpus_path)
    selection = select_questions(cfg, episodes)
    rids = router_ids(cfg, list(routers) if routers is not None else None)  # checks the router export
    with OutputLock(cfg.output_dir):  # one run at a time appends to records.jsonl
        save_resolved_config(cfg.output_dir, cfg)
        models = LazyModels(cfg, backend, routers, retriever, rag_retriever, judge, counter)
        return _run(cfg, selection, rids, models)


def _run(cfg: ProgressiveEvalConfig, selection, rids: dict, models: LazyModels) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    h = config_hash(cfg)
    cache_path = out / "records.jsonl"
    failures: dict[str, list[dict]] = {"dev": [], "test": []}
    with ResumableJsonlWriter(cache_path, key="key") as writer:
        cache = {r["key"]: r for r in read_jsonl(cache_path, required=("key",))}
        computed = run_missing(cfg, selection, h, rids, models, writer, cache, failures)
        rescored = score_new_routers(selection, cache, writer, models, rids, h)

    rows_by_split, stats, prefix_stats = split_rows(cfg, selection, cache, rids, h, failures)
    all_failures = failures["dev"] + failures["test"]
    counter = None if models.executor is None else models.executor.counter
    metrics = build_metrics(cfg, h, rids, rows_by_split, stats, prefix_stats, all_failures, counter, computed,
                            rescored)
    rows = metrics["rows"]
    atomic_write_text(out / "rows.csv", rows_csv(rows))
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f, ensure_ascii=False) + "\n" for f in all_failures))
    if rows:
        pareto_plot(rows_by_split, out / "pareto.png")
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


def make_parser():
    return make_arg_parser([ProgressiveEvalConfig], prog="memroute eval progressive",
                           description="Router-Mem progressive execution: tau sweep, endpoints, baselines, "
                                       "score / early termination / T_mem / T_e2e, Pareto plot.")


def main(argv=None) -> dict:
    setup_cli_logging()  # a CLI entry point (memroute eval progressive, python -m eval.progressive)
    from routers.models import offline_by_default

    offline_by_default()
    (cfg,) = parse_config(make_parser(), [ProgressiveEvalConfig], argv)
    metrics = run(cfg)  # writes resolved_config.yaml once it holds the output lock
    print(format_table(metrics["rows"]))
    if metrics["tau_choice_dev"]:
        print({"tau_choice_dev": metrics["tau_choice_dev"], "test_at_dev_tau": metrics["test_at_dev_tau"]})
    n_failed = len(metrics["failures"])
    if n_failed:
        log.warning("%d question(s) failed; rerun to retry them (see %s)", n_failed,
                    Path(cfg.output_dir) / "failures.jsonl")
    return metrics
