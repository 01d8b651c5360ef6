"""Quality targets of every issue, read from the latest evaluation outputs into the benchmark report.

Quality numbers (AUROC, Recall@5, T_mem at the chosen tau, routed success) come from evaluation jobs that
take minutes to hours, so ``memroute bench`` does not rerun them: it reads their ``metrics.json`` and
turns each target into a figure with its baseline and ratio, so one report covers every target. A missing
file is reported as a figure without a value (and the command that produces it), never silently dropped.

Absolute targets use the target itself as the baseline (e.g. AUROC / 0.85 >= 1); "within 2 points" is
expressed as (score + 2) / slow_score >= 1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from eval.bench.common import BenchConfig, figure, with_target
from routers.memagent.prompts import NONE


def _load(path: str | None) -> tuple[dict | None, str]:
    if not path:
        return None, "not configured"
    p = Path(path)
    if not p.exists():
        return None, f"{p} not found"
    try:
        return json.loads(p.read_text()), str(p)
    except (OSError, json.JSONDecodeError) as err:
        return None, f"{p}: unreadable ({err})"


def _missing(name: str, why: str, how: str, target: tuple[str, float]) -> dict:
    return figure(name, "", None, None, "value/baseline", target, f"n/a: {why}; produce it with `{how}`")


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def sufficiency_figures(path: str | None) -> list[dict]:
    m, src = _load(path)
    how = "memroute eval sufficiency configs/sufficiency/eval/default.yaml"
    if m is None:
        return [_missing("sufficiency_auroc_vs_0.85", src, how, (">=", 1.0))]
    models = m.get("models", {})
    trained, base = _num(models.get("trained", {}).get("auroc")), _num(models.get("base", {}).get("auroc"))
    return [
        figure("sufficiency_auroc_vs_0.85", "", trained, 0.85, "value/baseline", (">=", 1.0),
               f"held-out AUROC of the trained router ({src}); baseline = the 0.85 target"),
        figure("sufficiency_auroc_trained_vs_base", "", trained, base, "value/baseline", None,
               "trained AUROC over the untrained base in the same run (base near 0.5 expected)"),
    ]


def retrieval_figures(path: str | None) -> list[dict]:
    m, src = _load(path)
    how = "memroute eval retrieval configs/retriever/eval/default.yaml"
    if m is None:
        return [_missing("retriever_recall@5_trained_vs_base", src, how, (">=", 1.0))]
    systems = m.get("systems", {})
    r = {k: _num(systems.get(k, {}).get("recall@5")) for k in ("trained", "base", "bm25")}
    return [
        figure("retriever_recall@5_trained_vs_base", "", r["trained"], r["base"], "value/baseline", (">=", 1.0),
               f"held-out evidence Recall@5, trained vs base MiniLM ({src})"),
        figure("retriever_recall@5_trained_vs_bm25", "", r["trained"], r["bm25"], "value/baseline", (">=", 1.0),
               "held-out evidence Recall@5, trained MiniLM vs BM25"),
    ]


def progressive_figures(path: str | None, label: str) -> list[dict]:
    m, src = _load(path)
    how = f"memroute eval progressive configs/progressive/eval/{label}.yaml --router <export>"
    if m is None:
        return [_missing(f"progressive_{label}_t_mem_vs_slow", src, how, ("<=", 0.75))]
    t = m.get("test_at_dev_tau") or {}
    score, slow = _num(t.get("score")), _num(t.get("slow_score"))
    figs = [
        figure(f"progressive_{label}_t_mem_vs_slow", "s", _num(t.get("t_mem")), _num(t.get("slow_t_mem")),
               "value/baseline", ("<=", 0.75),
               f"test mean T_mem at the dev-chosen tau={t.get('tau')} ({t.get('router')}) vs slow-only ({src})"),
        figure(f"progressive_{label}_score_plus_2_vs_slow", "points", None if score is None else score + 2.0, slow,
               "value/baseline", (">=", 1.0), "(test score at the chosen tau + 2) / slow-only score: within 2 points"),
    ]
    et = (m.get("early_termination_range") or {}).get("test", {})
    tr, base = (_num(et.get(k, {}).get("range")) for k in ("trained", "base"))
    figs.append(figure(f"progressive_{label}_et_range_trained_vs_base", "%", tr, base, "value/baseline", None,
                       "early-termination range across tau, trained vs untrained router (test)"))
    ptr, pbase = (_num(et.get(k, {}).get("range_paper_taus")) for k in ("trained", "base"))
    if ptr is not None and pbase is not None:
        figs.append(figure(f"progressive_{label}_et_range_paper_taus_trained_vs_base", "%", ptr, pbase,
                           "value/baseline", (">", 1.0), "early-termination range over tau 0.3-0.7 (the paper's "
                           "Tables 3 and 5), trained vs untrained router (test)"))
    lv_tr, lv_base = (_num(et.get(k, {}).get("graded_levels")) for k in ("trained", "base"))
    if lv_tr is not None and lv_base is not None:
        figs.append(figure(f"progressive_{label}_et_graded_levels_trained_vs_base", "levels", lv_tr, lv_base,
                           "value/baseline", None, "distinct early-termination rates strictly between 0 and 100 % "
                           "across tau, trained vs untrained (test): operating points tau can pick"))
    return figs


def memagent_figures(path: str | None) -> list[dict]:
    m, src = _load(path)
    how = "memroute eval memagent configs/memagent/eval/default.yaml"
    if m is None or "routed" not in m:
        return [_missing("memagent_routed_vs_best_single", src if m is None else f"{src} has no routed row", how,
                         (">=", 1.0))]
    routed = _num(m["routed"].get("success_rate"))
    rows, best = m.get("baselines", {}), m.get("best_single_provider")
    best_rate = _num(rows.get(best, {}).get("success_rate")) if best else None
    none_rate = next((_num(v.get("success_rate")) for k, v in rows.items() if k in (NONE, "none", "no_memory")), None)
    share = _num((m["routed"].get("overhead") or {}).get("share"))
    return [
        figure("memagent_routed_vs_best_single", "", routed, best_rate, "value/baseline", (">=", 1.0),
               f"held-out success, routed vs the best single provider {best} ({src})"),
        figure("memagent_routed_vs_no_memory", "", routed, none_rate, "value/baseline", (">", 1.0),
               "held-out success, routed vs no memory"),
        figure("memagent_routing_overhead_share", "", share, 0.01, "value/baseline", ("<=", 1.0),
               "(probe + router time) / task time; baseline = the 1% target"),
    ]


def bench_quality_targets(cfg: BenchConfig, records: list[dict], device: str) -> dict:
    figs = (sufficiency_figures(cfg.sufficiency_metrics) + retrieval_figures(cfg.retrieval_metrics)
            + progressive_figures(cfg.progressive_locomo_metrics, "locomo")
            + progressive_figures(cfg.progressive_textworld_metrics, "textworld")
            + memagent_figures(cfg.memagent_metrics))
    return with_target({"benchmark": "quality_targets", "figures": figs,
                         "note": "read from evaluation outputs; rerun the evaluations to refresh"})
