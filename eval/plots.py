"""Evaluation figures (PNG, Agg canvas: no display needed, pyplot's global state untouched): the sufficiency
router's reliability diagram and early-termination curve, and MemAgent's coverage and Begin confusion plots.
Other evaluators draw their own figures and save them with :func:`save_figure`.

Files are written atomically: rendered to a temporary file in the target directory, then renamed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from eval.metrics import N_BINS, reliability_bins


def finish_and_save(fig: Figure, ax, path, xlabel: str, ylabel: str, title: str, legend_size="x-small") -> Path:
    """Label ``ax`` (grid, legend) and save ``fig`` with :func:`save_figure`: the ending every line plot shares."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    return save_figure(fig, path)


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Render ``fig`` to a PNG at ``path`` atomically (temporary file in the same folder, then renamed), with
    the permissions of any other output (umask, not owner-only); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    mask = os.umask(0o022)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)  # mkstemp makes owner-only files; a plot is shared like any output
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def reliability_diagram(results: Mapping[str, tuple[Sequence[int], Sequence[float]]], path: str | os.PathLike,
                        n_bins: int = N_BINS, title: str = "Reliability (P(sufficient))") -> Path:
    """Observed positive rate vs mean score per equal-width bin, one line per model, plus bin counts.

    ``results``: model name -> (labels, scores); NaN scores count as 0.0 as in :mod:`eval.metrics`.
    """
    fig = Figure(figsize=(6, 7))
    ax, ax_n = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    width = 1.0 / n_bins / max(len(results), 1)
    for i, (name, (labels, scores)) in enumerate(results.items()):
        bins = reliability_bins(labels, scores, n_bins)
        full = [b for b in bins if b["count"]]
        ax.plot([b["confidence"] for b in full], [b["accuracy"] for b in full], marker="o", label=name)
        ax_n.bar([b["lo"] + (i + 0.5) * width for b in bins], [b["count"] for b in bins], width=width, label=name)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("observed share of label 1 (sufficient)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small")
    ax.grid(alpha=0.3)
    ax_n.set_xlabel("router score s = p_yes / (p_yes + p_no)")
    ax_n.set_ylabel("count")
    ax_n.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_n.grid(alpha=0.3)
    return save_figure(fig, path)


def early_termination_curve(results: Mapping[str, Sequence[Mapping]], path: str | os.PathLike,
                            title: str = "Early termination and accuracy vs tau") -> Path:
    """Early-termination rate and accuracy against tau, one line per model.

    ``results``: model name -> per-tau rows with ``tau``, ``early_termination_rate`` and ``accuracy``
    (the ``per_tau`` list of :func:`eval.metrics.binary_metrics`).
    """
    fig = Figure(figsize=(10, 4))
    ax_et, ax_acc = fig.subplots(1, 2, sharex=True)
    for name, rows in results.items():
        rows = sorted(rows, key=lambda r: r["tau"])
        taus = [r["tau"] for r in rows]
        ax_et.plot(taus, [r["early_termination_rate"] for r in rows], marker="o", label=name)
        ax_acc.plot(taus, [r["accuracy"] for r in rows], marker="o", label=name)
    for ax, label in ((ax_et, "early termination rate (stop share)"), (ax_acc, "accuracy")):
        ax.set_xlabel("tau")
        ax.set_ylabel(label)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    return save_figure(fig, path)


# -- MemAgent (eval.memagent) -------------------------------------------------------------------------
def coverage_plot(coverage: Mapping, path: str | os.PathLike) -> Path:
    """Bar chart: number of tasks solved by exactly k of the N options (paper Table 13 / Figure 5 right)."""
    hist = coverage["histogram"]
    ks = [int(k) for k in hist]
    total = max(sum(hist.values()), 1)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    bars = ax.bar(ks, [hist[str(k)] for k in ks], color="tab:blue")
    for b, k in zip(bars, ks):
        if hist[str(k)]:
            ax.annotate(f"{100 * hist[str(k)] / total:.0f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(ks)
    ax.set_xlabel(f"options (of {coverage['options']}: providers + no memory) that solve the task")
    ax.set_ylabel("tasks")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Task coverage distribution")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def begin_confusion_plot(confusion: Mapping, path: str | os.PathLike) -> Path:
    """Oracle Begin label (rows) vs routed choice (columns), counts annotated."""
    labels, m = confusion["labels"], np.asarray(confusion["matrix"], dtype=float)
    size = max(4.0, 0.45 * len(labels) + 2)
    fig = Figure(figsize=(size + 1, size))
    ax = fig.subplots()
    im = ax.imshow(m, cmap="Blues")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i in range(len(labels)):
        for j in range(len(labels)):
            if m[i, j]:
                ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=7,
                        color="white" if m[i, j] > m.max() / 2 else "black")
    ax.set_xlabel("routed Begin choice")
    ax.set_ylabel("oracle Begin label")
    ax.set_title("Begin decisions vs oracle (solvable held-out tasks)")
    return save_figure(fig, path)
