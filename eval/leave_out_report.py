"""The leave-one-corpus-out report (eval/leave_out.py): markdown tables and the bar plot.

One row per left-out corpus: the base, the router trained without the corpus and the in-corpus router (retrieval
adds BM25 and the hybrid prefixes); for the sufficiency router also the AUROC against each kind of negative and
whether a tau calibrated on the training corpora keeps its stop-precision on the left-out one.
"""

from __future__ import annotations

from pathlib import Path

MODELS = ("base", "without", "in_corpus")
SUFFICIENCY_EXTRA = ["surface"]  # the no-reading baseline (eval/surface_baseline.py), fitted without C
RETRIEVAL_EXTRA = ["bm25", "hybrid_base", "hybrid_without", "hybrid_without_chosen", "hybrid_in_corpus",
                   "hybrid_base_peak", "hybrid_without_peak", "hybrid_in_corpus_peak"]
METRICS = {"sufficiency": ("auroc", "ap"), "retrieval": ("recall@5", "mrr@10")}


def _f(x) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and x == x else "n/a"


def format_by_negative(rows: dict) -> str:
    """AUROC of the positives against each kind of negative, per corpus and model (eval.metrics)."""
    models = MODELS + tuple(SUFFICIENCY_EXTRA)
    kinds = sorted({k for r in rows.values() for m in models for k in r.get(m, {}).get("auroc_by_negative", {})})
    if not kinds:
        return ""
    lines = ["| corpus | model | " + " | ".join(f"vs {k} (n)" for k in kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for corpus, r in rows.items():
        for model in models:
            by = r.get(model, {}).get("auroc_by_negative")
            if by:
                lines.append(f"| {corpus} | {model} | " + " | ".join(
                    f"{by[k]['auroc']:.3f} ({by[k]['n']})" if k in by else "" for k in kinds) + " |")
    return "\n".join(lines) + "\n"



def format_calibration(rows: dict) -> str:
    lines = ["| left-out corpus | tau (training corpora) | stop-precision on C | early termination on C | "
             "travels (>= target - 0.05) | k labels of C: mean precision / share of draws >= target - 0.05 / "
             "early termination |",
             "|---|---|---|---|---|---|"]
    for corpus, r in rows.items():
        cal = r.get("calibration")
        if not cal:
            continue
        t = cal["travel"]
        recal = "; ".join(f"k={x['k']}: {_f(x['mean_precision'])} / {_f(x['share_travels'])} / "
                          f"{_f(x['mean_early_termination_rate'])}" for x in cal["recalibrated"]) or "n/a"
        lines.append(f"| {corpus} | {_f(t['tau'])} | {_f(t['precision'])} | {_f(t['early_termination_rate'])} | "
                     f"{t['travels'] if t['travels'] is not None else 'no stop'} | {recal} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""



def format_seeds(rows: dict) -> str:
    """The router without C at every trainer seed (``--extra_train_seeds``): AUROC on C, mean and sample std."""
    seeds = list(dict.fromkeys(s for r in rows.values() for s in r.get("without_seeds", {}).get("auroc", {})))
    lines = ["| corpus | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | std | base |",
             "|---|" + "---|" * (len(seeds) + 3)]
    for corpus, r in rows.items():
        if "without_seeds" in r:
            w = r["without_seeds"]
            lines.append(f"| {corpus} | " + " | ".join(_f(w["auroc"].get(s)) for s in seeds) +
                         f" | {_f(w['mean'])} | {_f(w['std'])} | {_f(r.get('base', {}).get('auroc'))} |")
    return "\n".join(lines) + "\n"


def format_table(kind: str, rows: dict) -> str:
    metric = METRICS[kind][0]
    cols = ["base", "without", "in_corpus"] + (RETRIEVAL_EXTRA if kind == "retrieval" else SUFFICIENCY_EXTRA)
    cols = [c for c in cols if c in MODELS or any(c in r for r in rows.values())]
    head = "| corpus | n | " + " | ".join(f"{c} {metric}" for c in cols) + " | without - base |"
    lines = [head, "|" + "---|" * (len(cols) + 3)]

    for corpus, r in rows.items():
        vals = [r.get(c, {}).get(metric) for c in cols]
        n = next((r[c].get("n") for c in cols if c in r and r[c].get("n") is not None), "n/a")
        delta = vals[1] - vals[0] if all(isinstance(v, (int, float)) for v in vals[:2]) else None
        lines.append(f"| {corpus} | {n} | " + " | ".join(_f(v) for v in vals) + f" | {_f(delta)} |")
    return "\n".join(lines) + "\n"



def bar_plot(kind: str, rows: dict, path: Path) -> None:
    import numpy as np
    from matplotlib.figure import Figure

    from eval.plots import save_figure

    metric, corpora = METRICS[kind][0], list(rows)
    calibrated = [c for c in corpora if rows[c].get("calibration")]
    # at least three corpora wide: titles and legends of one left-out corpus overlapped at its own width
    fig = Figure(figsize=((1.8 + 1.6 * max(len(corpora), 3)) * (2 if calibrated else 1), 4.2))
    ax = fig.add_subplot(1, 2 if calibrated else 1, 1)
    x = np.arange(len(corpora))
    models = [m for m in MODELS + tuple(RETRIEVAL_EXTRA if kind == "retrieval" else SUFFICIENCY_EXTRA)
              if m in ("base", "without") or any(m in r for r in rows.values())]  # no empty legend entries
    width = 0.8 / len(models)
    for j, model in enumerate(models):
        vals = [rows[c].get(model, {}).get(metric) for c in corpora]
        ax.bar(x + (j - (len(models) - 1) / 2) * width, [v if isinstance(v, (int, float)) else 0 for v in vals],
               width, label=model)
        seeds = [(i, v) for i, c in enumerate(corpora) if model == "without"
                 for v in rows[c].get("without_seeds", {}).get("auroc", {}).values() if isinstance(v, (int, float))]
        if seeds:  # every trainer seed of the router without C, over its bar
            ax.scatter([x[i] + (j - (len(models) - 1) / 2) * width for i, _ in seeds], [v for _, v in seeds],
                       color="k", s=12, zorder=3, clip_on=False, label="without, each seed")
    ax.set_xticks(x, corpora)
    ax.set_ylabel(metric)
    ax.set_ylim(0, 1)
    ax.set_title(f"{kind}: held-out {metric}, router trained without the corpus")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4)  # below the bars, never over them
    if calibrated:
        calibration_panel(fig.add_subplot(1, 2, 2), {c: rows[c]["calibration"] for c in calibrated})
    save_figure(fig, path)



def calibration_panel(ax, cals: dict) -> None:
    """Stop-precision on each left-out corpus: tau from the training corpora vs recalibrated from k of its labels."""
    import numpy as np

    corpora = list(cals)
    series = {"tau from training corpora": [cals[c]["travel"]["precision"] for c in corpora]}
    for k in sorted({r["k"] for c in corpora for r in cals[c]["recalibrated"]}):
        series[f"recalibrated, {k} labels (mean)"] = [
            next((r["mean_precision"] for r in cals[c]["recalibrated"] if r["k"] == k), None) for c in corpora]
    x, width = np.arange(len(corpora)), 0.8 / len(series)
    for j, (label, vals) in enumerate(series.items()):
        ax.bar(x + (j - (len(series) - 1) / 2) * width, [v if isinstance(v, (int, float)) else 0 for v in vals],
               width, label=label)
    target = next(iter(cals.values()))["travel"]
    ax.axhline(target["target_precision"], color="k", lw=1, ls="--", label="target")
    ax.axhline(target["target_precision"] - target["tolerance"], color="k", lw=0.8, ls=":", label="target - tolerance")
    ax.set_xticks(x, corpora)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("stop-precision on the left-out corpus (0 = never stops)")
    ax.set_title("calibration travel")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)


