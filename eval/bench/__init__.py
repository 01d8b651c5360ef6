"""``memroute bench``: benchmarks that back the project's speed claims, written as JSON + Markdown.

    memroute bench                                   # all benchmarks, SmolLM2, default data
    memroute bench --which router_latency --router outputs/quickstart/router
    python -m eval.bench my_bench.yaml --train_steps 10      # YAML recipe, flags override it

Benchmarks (``BENCHMARKS``; pick with ``--which``):

* ``router_latency``: decision latency per query at batch size 1. The one-forward sufficiency router
  (``SufficiencyRouter.score``, one decision token) against a generate-based router on the same
  backbone and the same (question, context): it is prompted to write a short rationale and then answer
  yes or no, decoded greedily with exactly ``generate_new_tokens`` new tokens (``min_new_tokens =
  max_new_tokens``, so the baseline is well defined whatever the model writes; KV cache on).
  Target: speedup (generate / router) >= 10.
* ``index_latency`` (eval/bench/retrieval.py): dense memory index top-10 query latency and indexing
  throughput at ``index_steps`` steps, against a pure-Python loop and the 5 ms budget.
* ``memagent_probe`` (eval/bench/memagent.py): MemAgent's Begin probe over 13 providers x
  ``memagent_memories`` memories, against a per-provider loop and the 10 ms budget.
* ``memagent_in`` (eval/bench/memagent_in.py): the In decision per agent step with the incremental KV cache
  (routers/memagent/in_cache.py) against the full-prompt path, Begin with the provider descriptions cached
  across tasks against the whole prompt, and the estimated routing overhead (Begin + In decisions) / agent
  steps with the real router and agent models (target <= 10 %).
* ``distill_step`` (eval/bench/sufficiency.py, as ``router_latency``): LoRA training step time (``SufficiencyTrainer.compute_loss`` + backward + AdamW
  step) on the same fixed batches in three modes: ``lambda_rep = 0`` (baseline, no distillation),
  distillation with the teacher forward each step (no cache), and distillation with the teacher states
  already cached. Targets: distill / base <= 1.5, cached / base <= 1.1.
* ``quality_targets`` (eval/bench/targets.py): the quality targets of every issue (sufficiency AUROC,
  retriever Recall@5, progressive T_mem / score at the dev-chosen tau on LoCoMo and TextWorld, MemAgent
  routed success and routing overhead), read from the latest evaluation ``metrics.json`` files; a
  missing file is a figure without a value that names the command producing it.

Every benchmark writes ``<output_dir>/<name>.json`` with machine info, library versions, git revision,
config, the data used, and a list of figures ``{name, unit, value, baseline, ratio, ratio_definition,
target, meets_target}``; ``report.json`` gathers them and ``report.md`` is the table that is printed.
Nothing here asserts on a time: a missed target is reported (``meets_target: false``), not raised.

The modules: ``common`` (options, registry, figure layout), ``run`` (``run_benchmarks``, the report,
``main``) and one module per family of benchmarks (``sufficiency``, ``retrieval``, ``memagent``, ``targets``).
The registry (``BENCHMARKS``) maps names to ``"module:function"`` and imports each one only when it runs:
a benchmark whose module is missing, or that raises, becomes an error entry in the report (the others
still run, the report is still written); ``--strict`` then makes the command fail.
"""

from eval.bench.common import (BENCHMARKS, NEEDS_SAMPLES, SCHEMA_VERSION, BenchConfig, error_entry, figure,
                               machine_info, resolve_benchmark, summarize, with_target)
from eval.bench.run import main, make_parser, markdown_report, run_benchmarks

__all__ = ["BENCHMARKS", "NEEDS_SAMPLES", "SCHEMA_VERSION", "BenchConfig", "error_entry", "figure", "machine_info",
           "main", "make_parser", "markdown_report", "resolve_benchmark", "run_benchmarks", "summarize", "with_target"]
