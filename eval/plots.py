"""Evaluation figures (PNG, Agg canvas: no display needed, pyplot's global state untouched).

Files are written atomically: rendered to a temporary file in the target directory, then renamed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from eval.metrics import N_BINS, reliability_bins


def _save_atomic(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> Path:
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
    return _save_atomic(fig, path)


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
    return _save_atomic(fig, path)
