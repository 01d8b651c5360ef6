"""``memroute eval progressive``: Router-Mem quality-latency evaluation (seed 001, Tables 1-5).

    memroute eval progressive configs/progressive/eval/locomo.yaml [--router outputs/sufficiency_router/export]
        [--encoder outputs/retriever_minilm/export] [--max_questions_per_episode 3]

The modules: ``config`` (options), ``cache`` (cache keys, router identities, scoring cached
questions with new routers), ``execute`` (one question's paths, the lazily built models), ``report`` (rows,
tau choice, plot, CSV, metrics) and ``run`` (orchestration, ``main``).

Every question is executed once per path, and cached (``records.jsonl``, keyed by split, question id and a
hash of the settings that change results): the shared prefix (hits, time), the router score of every
router (base and trained on the same C_f, with their times; null = over the input budget), the fast
answer (early return from C_f in temporal order), the slow answer (anchor blocks + neighbours -> memory
agents in one batched call -> aggregate -> answer, each stage timed) and the baselines (RAG top-k; long
context truncated to the model window, most recent steps kept, the dropped count recorded). Every row is
then derived exactly from the records, without running anything again:

* ``fast_only``: T_mem = prefix; ``slow_only``: T_mem = prefix + blocks + aggregate (no router);
* router ``r`` at tau: fast where s >= tau (null score -> slow), T_mem = prefix + router (+ blocks +
  aggregate on the slow path); T_e2e adds the chosen path's answer time;
* ``rag``: T_mem = retrieval; ``long_context``: T_mem = context assembly; T_build = index construction
  per episode (mean over the split's episodes).

Scores are LoCoMo token F1 x 100 and, with ``--judge``, the AMA-Bench binary judge accuracy x 100;
``score_metric`` picks which one is "score". tau is picked on the dev split (smallest T_mem whose score
is within ``max_score_drop`` points of slow-only) and reported on the test split.

Router scores are cached apart from the paths (keyed by the router's identity: model spec + a fingerprint of
its folder), so evaluating a new or retrained router on the same questions reuses every cached path and only
scores C_f (rebuilt exactly from the cached hit ids): minutes instead of hours.

A backend that keeps failing marks the question failed (counted, listed in ``failures.jsonl``, not
cached, so a rerun retries it) and the run goes on; a killed run resumes from ``records.jsonl``.
Outputs (atomic): ``rows.csv``, ``metrics.json``, ``pareto.png``, ``failures.jsonl``,
``resolved_config.yaml``.
"""

from eval.progressive.cache import (HASHED, RECORD_VERSION, base_router_spec, config_hash, router_ids,
                                    score_new_routers, with_routers)
from eval.progressive.config import (BASE, PAPER_TAUS, PATHS, TAUS, TRAINED, ProgressiveEvalConfig,
                                     is_none)
from eval.progressive.execute import LazyModels, question_record, run_missing, select_questions
from eval.progressive.report import (CSV_COLUMNS, build_metrics, choose_tau, derive_rows, et_ranges, format_table,
                                     pareto_front, pareto_plot, prefix_sufficiency, rows_csv, split_rows, split_stats,
                                     test_report)
from eval.progressive.run import main, make_parser, run

__all__ = [
    "BASE", "CSV_COLUMNS", "HASHED", "PAPER_TAUS", "PATHS", "RECORD_VERSION", "TAUS", "TRAINED", "LazyModels",
    "ProgressiveEvalConfig", "base_router_spec", "build_metrics", "choose_tau", "config_hash",
    "derive_rows", "et_ranges", "format_table", "is_none", "main", "make_parser", "pareto_front", "pareto_plot",
    "prefix_sufficiency", "question_record", "router_ids", "rows_csv", "run", "run_missing", "score_new_routers",
    "select_questions", "split_rows", "split_stats", "test_report", "with_routers",
]
