"""Everything derived from the cached records, without running a model: the rows (every system and tau),
the dev tau choice and its test report, early-termination ranges, prefix sufficiency, the Pareto plot, the
CSV / printed table and the ``metrics.json`` content."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from typing import Sequence

from eval.progressive.cache import build_key, question_key, with_routers
from eval.progressive.config import BASE, PAPER_TAUS, PATHS, TRAINED, ProgressiveEvalConfig
from routers.base import git_revision, library_versions
from routers.machine import machine_info


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def _row(split, system, router, tau, per_q: list[tuple[dict, float, float, bool | None]], n_failed: int,
         t_build: float | None, judged: bool) -> dict:
    """per_q: (chosen path record, t_mem, t_e2e, early-terminated or None)."""
    ets = [e for *_, e in per_q if e is not None]
    return {"split": split, "system": system, "router": router, "tau": tau, "n": len(per_q), "n_failed": n_failed,
            "score": None, "f1": _mean(100.0 * p["f1"] for p, *_ in per_q),
            "judge": _mean(100.0 * float(p.get("judge") or 0) for p, *_ in per_q) if judged else None,
            "early_termination": _mean(100.0 * e for e in ets) if ets else None,
            "t_mem": _mean(t for _, t, _, _ in per_q), "t_e2e": _mean(t for _, _, t, _ in per_q), "t_build": t_build}


def derive_rows(records: Sequence[dict], builds: Sequence[dict], taus: Sequence[float], split: str,
                score_metric: str = "f1", n_failed: int = 0) -> list[dict]:
    """Every row of one split, exactly, from cached per-question records (no model runs)."""
    if not records:
        return []
    judged = all("judge" in r["fast"] for r in records)
    t_build = _mean(b["prefix_build_s"] for b in builds)
    t_build_rag = _mean(b["rag_build_s"] for b in builds)
    rows = []

    def slow_mem(r):
        return r["prefix"]["seconds"] + r["slow"]["blocks_s"] + r["slow"]["aggregate_s"]

    rows.append(_row(split, "fast_only", None, None,
                     [(r["fast"], r["prefix"]["seconds"], r["prefix"]["seconds"] + r["fast"]["seconds"], True)
                      for r in records], n_failed, t_build, judged))
    rows.append(_row(split, "slow_only", None, None,
                     [(r["slow"], slow_mem(r), slow_mem(r) + r["slow"]["seconds"], False) for r in records],
                     n_failed, t_build, judged))
    for name in sorted(set().union(*(r["routers"] for r in records))):
        for tau in taus:
            per_q = []
            for r in records:
                s, t_router = r["routers"][name]["score"], r["routers"][name]["seconds"]
                early = s is not None and s >= tau
                if early:
                    t_mem = r["prefix"]["seconds"] + t_router
                    per_q.append((r["fast"], t_mem, t_mem + r["fast"]["seconds"], True))
                else:
                    t_mem = slow_mem(r) + t_router
                    per_q.append((r["slow"], t_mem, t_mem + r["slow"]["seconds"], False))
            rows.append(_row(split, "router", name, tau, per_q, n_failed, t_build, judged))
    rows.append(_row(split, "rag", None, None,
                     [(r["rag"], r["rag"]["retrieve_s"], r["rag"]["retrieve_s"] + r["rag"]["seconds"], None)
                      for r in records], n_failed, t_build_rag, judged))
    rows.append(_row(split, "long_context", None, None,
                     [(r["long_context"], r["long_context"]["build_s"],
                       r["long_context"]["build_s"] + r["long_context"]["seconds"], None) for r in records],
                     n_failed, 0.0, judged))
    for row in rows:
        row["score"] = row["f1"] if score_metric == "f1" else row["judge"]
    return rows


def choose_tau(dev_rows: Sequence[dict], router: str, max_score_drop: float = 2.0) -> dict | None:
    """Smallest mean T_mem among the router's tau rows whose score is within ``max_score_drop`` of slow-only
    (ties: higher score, then smaller tau); when none qualifies, the best-scoring tau."""
    slow = next((r for r in dev_rows if r["system"] == "slow_only"), None)
    cands = [r for r in dev_rows if r["system"] == "router" and r["router"] == router]
    if slow is None or not cands:
        return None
    ok = [r for r in cands if r["score"] >= slow["score"] - max_score_drop - 1e-9]
    if ok:
        best = min(ok, key=lambda r: (r["t_mem"], -r["score"], r["tau"]))
    else:
        best = max(cands, key=lambda r: (r["score"], -r["t_mem"], -r["tau"]))
    return {"router": router, "tau": best["tau"], "within_drop": bool(ok), "dev_score": best["score"],
            "dev_slow_score": slow["score"], "dev_t_mem": best["t_mem"], "dev_slow_t_mem": slow["t_mem"]}


def test_report(test_rows: Sequence[dict], choice: dict | None, max_score_drop: float = 2.0) -> dict | None:
    """The chosen tau on the test split against test slow-only (the seed-001 style target)."""
    if choice is None:
        return None
    slow = next((r for r in test_rows if r["system"] == "slow_only"), None)
    row = next((r for r in test_rows if r["system"] == "router" and r["router"] == choice["router"]
                and r["tau"] == choice["tau"]), None)
    if slow is None or row is None:
        return None
    reduction = 1.0 - row["t_mem"] / slow["t_mem"] if slow["t_mem"] else None
    delta = row["score"] - slow["score"]
    return {"router": choice["router"], "tau": choice["tau"], "score": row["score"], "slow_score": slow["score"],
            "score_delta": delta, "t_mem": row["t_mem"], "slow_t_mem": slow["t_mem"], "t_mem_reduction": reduction,
            "t_e2e": row["t_e2e"], "slow_t_e2e": slow["t_e2e"], "early_termination": row["early_termination"],
            "targets": {"t_mem_reduction_>=_25%": reduction is not None and reduction >= 0.25,
                        f"score_within_{max_score_drop:g}_of_slow": delta >= -max_score_drop - 1e-9}}


def et_ranges(rows: Sequence[dict]) -> dict:
    """Per router: early-termination % at each tau, its range (max - min), whether it is monotone, and how many
    distinct intermediate operating points tau can pick (distinct ET values with 0 < ET < 100 %). The range
    alone rewards a router that jumps from all-fast to all-slow between two taus; the paper's point (Table 3)
    is that an untrained router's boundary sits at a fixed endpoint so tau stops controlling anything, which
    the count of graded levels measures. ``range_paper_taus`` is the range over tau in [0.3, 0.7], the taus
    of the paper's Tables 3 and 5 ("joint training increases this range to 22.1%-38.5%"), where the
    endpoints' saturation (everything stops at 0.1, nothing at 0.9) does not dominate."""
    out = {}
    for name in sorted({r["router"] for r in rows if r["system"] == "router"}):
        rs = sorted((r for r in rows if r["system"] == "router" and r["router"] == name), key=lambda r: r["tau"])
        ets = [r["early_termination"] for r in rs]
        mid = [r["early_termination"] for r in rs if PAPER_TAUS[0] - 1e-9 <= r["tau"] <= PAPER_TAUS[1] + 1e-9]
        out[name] = {"taus": [r["tau"] for r in rs], "early_termination": ets, "range": max(ets) - min(ets),
                     "range_paper_taus": (max(mid) - min(mid)) if len(mid) > 1 else None,
                     "monotone_non_increasing": all(a >= b for a, b in zip(ets, ets[1:])),
                     "graded_levels": len({round(e, 6) for e in ets if 0.0 < e < 100.0})}
    if BASE in out and TRAINED in out:
        out["trained_wider_than_base"] = out[TRAINED]["range"] > out[BASE]["range"]
        if out[TRAINED]["range_paper_taus"] is not None and out[BASE]["range_paper_taus"] is not None:
            out["trained_wider_than_base_paper_taus"] = out[TRAINED]["range_paper_taus"] > out[BASE]["range_paper_taus"]
        out["trained_more_graded_than_base"] = out[TRAINED]["graded_levels"] > out[BASE]["graded_levels"]
    return out


def prefix_sufficiency(records: Sequence[dict], evidence: dict[str, Sequence[str]], taus: Sequence[float]) -> dict:
    """Does s(q, C_f) track whether the prefix really holds the evidence? Label = every annotated evidence step
    is among the prefix hits (questions without evidence annotations are left out). Per router: AUROC of the
    score against that label and, per tau, the share of early stops whose prefix was evidence-complete.
    This is the router's job on the contexts it actually sees at inference, which differ from the synthetic
    intervention samples it is usually evaluated on (every retrieved step is similar to the question)."""
    from sklearn.metrics import roc_auc_score  # scikit-learn only when the prefix is scored

    labelled = [(r, int(set(evidence[r["qa_id"]]) <= set(r["prefix"]["hits"]))) for r in records
                if evidence.get(r["qa_id"])]
    out: dict = {"n_labelled": len(labelled),
                 "evidence_complete_rate": (100.0 * sum(y for _, y in labelled) / len(labelled)) if labelled else None,
                 "routers": {}}
    names = sorted({n for r, _ in labelled for n in r.get("routers", {})})
    for name in names:
        pairs = [(r["routers"][name]["score"], y) for r, y in labelled
                 if r["routers"].get(name, {}).get("score") is not None]
        ys = [y for _, y in pairs]
        auroc = float(roc_auc_score(ys, [s for s, _ in pairs])) if 0 < sum(ys) < len(ys) else None
        precision = {}
        for tau in taus:
            stops = [y for s, y in pairs if s >= tau]
            precision[str(tau)] = (100.0 * sum(stops) / len(stops)) if stops else None
        out["routers"][name] = {"n_scored": len(pairs), "auroc": auroc, "stop_precision": precision}
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated (lower-or-equal time and higher-or-equal score, one strictly)."""
    front = []
    for i, (t, s) in enumerate(points):
        dominated = any((t2 <= t and s2 >= s) and (t2 < t or s2 > s) for j, (t2, s2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _label(row: dict) -> str:
    return f"{row['router']} tau={row['tau']:g}" if row["system"] == "router" else row["system"]


def pareto_plot(rows_by_split: dict[str, list[dict]], path, title: str = "Router-Mem quality vs latency"):
    """Score against T_mem and T_e2e per split; router tau sweeps as lines, the Pareto front dashed."""
    from matplotlib.figure import Figure  # matplotlib only when a plot is drawn

    from eval.plots import save_figure

    splits = [s for s, rows in rows_by_split.items() if rows]
    fig = Figure(figsize=(11, 4.4 * max(len(splits), 1)), layout="constrained")
    axes = fig.subplots(max(len(splits), 1), 2, squeeze=False)
    markers = {"fast_only": "s", "slow_only": "D", "rag": "^", "long_context": "v"}
    for si, split in enumerate(splits):
        rows = [r for r in rows_by_split[split] if r["score"] is not None]
        for ai, key in enumerate(("t_mem", "t_e2e")):
            ax = axes[si][ai]
            for name in sorted({r["router"] for r in rows if r["system"] == "router"}):
                rs = sorted((r for r in rows if r["system"] == "router" and r["router"] == name),
                            key=lambda r: r["tau"])
                ax.plot([r[key] for r in rs], [r["score"] for r in rs], marker="o", label=f"router ({name})")
                for r in rs:
                    ax.annotate(f"{r['tau']:g}", (r[key], r["score"]), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            for r in rows:
                if r["system"] in markers:
                    ax.scatter([r[key]], [r["score"]], marker=markers[r["system"]], s=50, label=r["system"], zorder=3)
            pts = [(r[key], r["score"]) for r in rows]
            front = pareto_front(pts)
            ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], linestyle="--", color="grey",
                    linewidth=1, label="Pareto front")
            ax.set_xscale("symlog", linthresh=0.01)
            ax.set_xlabel(f"mean {'T_mem' if key == 't_mem' else 'T_e2e'} per question (s)")
            ax.set_ylabel("score")
            ax.set_title(f"{split}: score vs {'T_mem' if key == 't_mem' else 'T_e2e'}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="x-small")
    fig.suptitle(title)
    return save_figure(fig, path)


CSV_COLUMNS = ("split", "system", "router", "tau", "n", "n_failed", "score", "f1", "judge", "early_termination",
               "t_mem", "t_e2e", "t_build")


def rows_csv(rows: Sequence[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow(["" if r[c] is None else (f"{r[c]:.6f}" if isinstance(r[c], float) and c != "tau" else r[c])
                         for c in CSV_COLUMNS])
    return buf.getvalue()


def format_table(rows: Sequence[dict]) -> str:
    head = f"{'split':<5} {'system':<22} {'score':>6} {'ET%':>6} {'T_mem':>8} {'T_e2e':>8} {'T_build':>8} {'n':>4}"
    lines = [head, "-" * len(head)]

    def f(x, w, p=2):
        return f"{x:>{w}.{p}f}" if x is not None else f"{'-':>{w}}"

    for r in rows:
        lines.append(f"{r['split']:<5} {_label(r):<22} {f(r['score'], 6)} {f(r['early_termination'], 6, 1)} "
                     f"{f(r['t_mem'], 8, 3)} {f(r['t_e2e'], 8, 3)} {f(r['t_build'], 8, 3)} {r['n']:>4}")
    return "\n".join(lines)


def split_stats(records: Sequence[dict], failures: Sequence[dict]) -> dict:
    """Counts of everything that was split, shortened, dropped, over budget or failed."""
    n = len(records)
    return {
        "n_questions": n + len(failures), "n_ok": n, "n_failed": len(failures),
        "empty_memory": sum(bool(r.get("empty_memory")) for r in records),
        "blocks_split_for_window": sum(r["slow"]["window_splits"] for r in records),
        "steps_shortened_for_window": sum(r["slow"]["truncated_steps"] for r in records),
        "mean_blocks_selected": _mean(len(r["slow"]["blocks"]) for r in records),
        "mean_anchor_blocks": _mean(len(r["slow"]["anchor_blocks"]) for r in records),
        "mean_memory_agent_calls": _mean(r["slow"]["n_pieces"] for r in records),
        "answer_context_units_dropped": {p: sum(r[p].get("units_dropped", 0) for r in records)
                                         for p in ("fast", "slow", "rag")},
        "long_context_steps_dropped_mean": _mean(r["long_context"]["steps_dropped"] for r in records),
        "router_over_budget": {name: sum(r["routers"][name]["score"] is None for r in records)
                               for name in sorted(set().union(*(r["routers"] for r in records)))} if records else {},
        "judge_unparsed": sum(1 for r in records for p in PATHS if "judge" in r[p] and r[p]["judge"] is None),
    }


# -- metrics.json ------------------------------------------------------------------------------------------
def split_rows(cfg: ProgressiveEvalConfig, selection, cache: dict, rids: dict, h: str,
               failures: dict[str, list[dict]]) -> tuple[dict, dict, dict]:
    """Per split: the rows, the counts (:func:`split_stats`) and the prefix sufficiency, from the cache."""
    rows_by_split, stats, prefix_stats = {}, {}, {}
    for split, pairs in selection.items():
        recs = [with_routers(cache, cache[question_key(split, qa.qa_id, h)], rids, h) for _, qa in pairs
                if question_key(split, qa.qa_id, h) in cache]
        ep_ids = list(dict.fromkeys(ep.episode_id for ep, _ in pairs))
        builds = [cache[k] for k in (build_key(split, e, h) for e in ep_ids) if k in cache]
        rows_by_split[split] = derive_rows(recs, builds, cfg.taus, split, cfg.score_metric, len(failures[split]))
        stats[split] = split_stats(recs, failures[split])
        prefix_stats[split] = prefix_sufficiency(recs, {qa.qa_id: qa.evidence for _, qa in pairs}, cfg.taus)
    return rows_by_split, stats, prefix_stats


def build_metrics(cfg: ProgressiveEvalConfig, h: str, rids: dict, rows_by_split: dict, stats: dict,
                  prefix_stats: dict, failures: list[dict], counter, computed: int, rescored: int) -> dict:
    """The ``metrics.json`` content: the envelope, the rows, the dev tau choice and the test report.

    ``counter`` is the executor's token counter (None when every question came from the cache)."""
    rows = rows_by_split["dev"] + rows_by_split["test"]
    router_names = sorted({r["router"] for r in rows if r["system"] == "router"})
    primary = TRAINED if TRAINED in router_names else (router_names[0] if router_names else None)
    choice = choose_tau(rows_by_split["dev"], primary, cfg.max_score_drop) if primary else None
    report = test_report(rows_by_split["test"], choice, cfg.max_score_drop)
    return {
        "schema_version": 1, "task": "router-mem progressive execution", "config": asdict(cfg),
        "config_hash": h, "versions": library_versions(), "git_revision": git_revision(),
        "machine": machine_info(), "token_counter": None if counter is None else ("approximate" if counter.approximate
                                                                                  else "tokenizer"),
        "questions_computed_this_run": computed, "router_scores_added_this_run": rescored,
        "router_ids": rids, "stats": stats,
        "definitions": {
            "score": f"{cfg.score_metric} x 100, mean over answered questions",
            "early_termination": "% of questions the router returns early on (s >= tau; over budget -> continue)",
            "t_mem": "memory time per question: prefix + router (+ block analysis + aggregation on the slow path)",
            "t_e2e": "t_mem + answer generation", "t_build": "index + views construction per episode (mean)"},
        "rows": rows, "tau_choice_dev": choice, "test_at_dev_tau": report,
        "early_termination_range": {s: et_ranges(r) for s, r in rows_by_split.items()},
        "prefix_sufficiency": prefix_stats,
        "failures": failures,
        "files": {"rows": "rows.csv", "plot": "pareto.png", "records": "records.jsonl", "failures": "failures.jsonl"},
    }
