"""Offline metrics for a binary stop/continue router (labels 0/1, scores = P(sufficient) in [0, 1]).

Conventions shared by every function here, chosen to match ``SufficiencyRouter.decide``:

* A NaN score means the prompt exceeded the router's input budget. It is counted in
  ``n_over_budget`` and treated as score 0.0 for the threshold-free metrics (AUROC, AP, Brier, ECE);
  at any threshold it is a "continue" (even at tau = 0), because the router never stops on it.
* "Early termination" at tau is the router saying stop: share of all samples with score >= tau.
* Undefined quantities (AUROC on one class, precision with no predicted stop, ...) are ``None``,
  never NaN, so results serialize to strict JSON.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

DEFAULT_TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
N_BINS = 10


def prepare(labels, scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate and return (labels int 0/1, scores with NaN -> 0.0, valid mask = score was not NaN)."""
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.ndim != 1 or len(y) != len(s):
        raise ValueError(f"labels and scores must be 1-D and aligned, got {y.shape} and {s.shape}")
    if len(y) == 0:
        raise ValueError("no samples")
    if not np.isin(y, (0, 1)).all():
        raise ValueError(f"labels must be 0/1, got values {sorted(set(np.unique(y).tolist()))}")
    valid = ~np.isnan(s)
    if ((s[valid] < 0) | (s[valid] > 1)).any():
        raise ValueError("scores must lie in [0, 1] (or be NaN for over-budget prompts)")
    return y.astype(np.int64), np.where(valid, s, 0.0), valid


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den else None


def threshold_metrics(labels, scores, tau: float) -> dict:
    """Decision quality at one tau: stop (predict 1) where score >= tau and the score is not NaN."""
    y, s, valid = prepare(labels, scores)
    pred = valid & (s >= tau)
    pos = y == 1
    tp, fp = int((pred & pos).sum()), int((pred & ~pos).sum())
    fn, tn = int((~pred & pos).sum()), int((~pred & ~pos).sum())
    n = len(y)
    return {"tau": float(tau), "n": n, "accuracy": (tp + tn) / n, "precision": _ratio(tp, tp + fp),
            "recall": _ratio(tp, tp + fn), "early_termination_rate": (tp + fp) / n,
            "tp": tp, "fp": fp, "tn": tn, "fn": fn}


def reliability_bins(labels, scores, n_bins: int = N_BINS) -> list[dict]:
    """Equal-width bins on P(positive): bin i holds scores in [i/n, (i+1)/n), the last one includes 1.0.

    Per bin: count, accuracy = share of label 1, confidence = mean score (None for an empty bin).
    """
    y, s, _ = prepare(labels, scores)
    idx = np.minimum(np.floor(s * n_bins).astype(np.int64), n_bins - 1)
    out = []
    for b in range(n_bins):
        m = idx == b
        c = int(m.sum())
        out.append({"lo": b / n_bins, "hi": (b + 1) / n_bins, "count": c,
                    "accuracy": float(y[m].mean()) if c else None,
                    "confidence": float(s[m].mean()) if c else None})
    return out


def expected_calibration_error(labels, scores, n_bins: int = N_BINS) -> float:
    """ECE = sum_b (n_b / N) * |acc_b - conf_b| over equal-width bins of the positive-class probability.

    acc_b is the fraction of label-1 samples in bin b and conf_b the mean score there (the
    "positive-class" reliability variant, not the max-probability one). NaN scores count as 0.0.
    """
    bins = reliability_bins(labels, scores, n_bins)
    n = sum(b["count"] for b in bins)
    return float(sum(b["count"] / n * abs(b["accuracy"] - b["confidence"]) for b in bins if b["count"]))


def binary_metrics(labels, scores, taus: Iterable[float] = DEFAULT_TAUS, n_bins: int = N_BINS) -> dict:
    """AUROC, AP, Brier, ECE and per-tau decision rows; NaN scores are over-budget (see module doc).

    AUROC is None when only one class is present; AP is None when there is no positive.
    """
    from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score

    y, s, valid = prepare(labels, scores)
    n_pos = int(y.sum())
    two_classes = 0 < n_pos < len(y)
    return {
        "n": int(len(y)),
        "n_positive": n_pos,
        "n_over_budget": int((~valid).sum()),
        "auroc": float(roc_auc_score(y, s)) if two_classes else None,
        "ap": float(average_precision_score(y, s)) if n_pos else None,
        "brier": float(brier_score_loss(y, s, pos_label=1)),
        "ece": expected_calibration_error(y, s, n_bins),
        "mean_score": float(s.mean()),
        "per_tau": [threshold_metrics(y, np.where(valid, s, np.nan), t) for t in taus],
    }


def auroc_by_negative_kind(rows: Sequence[dict], field: str) -> dict[str, dict]:
    """AUROC of every positive against each kind of negative (``variant``: none, partial, prefix_none, ...).

    Why: a corpus whose negatives are all ``partial`` (one of two hops removed) asks a harder question than one
    whose negatives lost every evidence step; one pooled AUROC hides which the router can tell apart."""
    from sklearn.metrics import roc_auc_score

    pos = [r for r in rows if int(r["label"]) == 1]
    out = {}
    for kind in sorted({str(r.get("variant")) for r in rows if int(r["label"]) == 0}):
        neg = [r for r in rows if int(r["label"]) == 0 and str(r.get("variant")) == kind]
        if not pos:
            continue
        _, s, _ = prepare([1] * len(pos) + [0] * len(neg),
                          [np.nan if r.get(field) is None else r[field] for r in pos + neg])
        out[kind] = {"n": len(neg), "auroc": float(roc_auc_score([1] * len(pos) + [0] * len(neg), s))}
    return out


def calibrate_threshold(labels, scores, target_precision: float | None = None,
                        target_early_termination: float | None = None) -> dict:
    """Choose tau for a deployment target; give exactly one target.

    * ``target_precision``: the smallest tau among observed (non-NaN) scores whose stop-precision is
      >= target, i.e. the most early termination the precision constraint allows (precision is not
      monotone in tau, so the whole grid is scanned). Unreachable -> tau = 1.0 ("never stop"; only
      a score of exactly 1.0 would still stop) and ``reachable: false``.
    * ``target_early_termination``: the quantile: tau = the k-th largest valid score with
      k = round(target * N), so the stop share is k/N up to ties. k = 0 -> tau = 1.0; more stops than
      there are in-budget samples -> the smallest valid score and ``reachable: false``.

    Returns ``threshold`` (the key ``SufficiencyRouter.from_pretrained`` reads) and its alias ``tau``,
    the target, the method, and precision / recall / accuracy / early_termination_rate achieved on
    these samples.
    """
    if (target_precision is None) == (target_early_termination is None):
        raise ValueError("give exactly one of target_precision or target_early_termination")
    y, s, valid = prepare(labels, scores)
    sv = np.sort(s[valid])
    n = len(y)
    if target_precision is not None:
        if not 0.0 <= target_precision <= 1.0:
            raise ValueError(f"target_precision must be in [0, 1], got {target_precision}")
        method, target = "max_early_termination_at_precision", float(target_precision)
        order = np.argsort(s[valid], kind="stable")
        y_sorted = y[valid][order]
        pos_at_or_above = np.concatenate([np.cumsum(y_sorted[::-1])[::-1], [0]])  # positives in sv[i:]
        grid = np.unique(sv)
        first = np.searchsorted(sv, grid, side="left")
        n_stop = len(sv) - first
        precision = pos_at_or_above[first] / np.maximum(n_stop, 1)
        ok = np.nonzero(precision >= target - 1e-12)[0]
        reachable = len(ok) > 0
        tau = float(grid[ok[0]]) if reachable else 1.0
    else:
        if not 0.0 <= target_early_termination <= 1.0:
            raise ValueError(f"target_early_termination must be in [0, 1], got {target_early_termination}")
        method, target = "early_termination_quantile", float(target_early_termination)
        k = int(round(target * n))
        reachable = k <= len(sv)
        if k == 0:
            tau = 1.0
        elif reachable:
            tau = float(sv[len(sv) - k])
        else:
            tau = float(sv[0]) if len(sv) else 1.0
    row = threshold_metrics(y, np.where(valid, s, np.nan), tau)
    return {"threshold": tau, "tau": tau, "method": method,
            "target_precision": target if target_precision is not None else None,
            "target_early_termination": target if target_early_termination is not None else None,
            "reachable": bool(reachable), "precision": row["precision"], "recall": row["recall"],
            "accuracy": row["accuracy"], "early_termination_rate": row["early_termination_rate"],
            "n": n, "n_over_budget": int((~valid).sum())}


def finite_or_none(x):
    """JSON-safe float: NaN/inf -> None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# Calibration needs both classes and enough of each: a tau fitted to six positives (precision 1.0 by
# construction) or to a handful of samples is noise, and written into a router it silently changes every
# later decision. These are the defaults of ``--min_calibration_samples`` / ``--min_calibration_per_class``.
MIN_CALIBRATION_SAMPLES = 20
MIN_CALIBRATION_PER_CLASS = 5


def calibration_refusal(labels, scores, min_samples: int = MIN_CALIBRATION_SAMPLES,
                        min_per_class: int = MIN_CALIBRATION_PER_CLASS) -> str | None:
    """Why these samples are too few or too one-sided to choose tau from, or None when they will do.

    Counted are the in-budget samples (a NaN score never stops, so it says nothing about where tau goes):
    at least ``min_samples`` in all and ``min_per_class`` of each label; one class alone is always refused.
    """
    y, _, valid = prepare(labels, scores)
    n_pos, n_neg = int((y[valid] == 1).sum()), int((y[valid] == 0).sum())
    over = int((~valid).sum())
    counts = f"{n_pos} positive and {n_neg} negative in-budget samples" + (f" ({over} over budget)" if over else "")
    if n_pos + n_neg == 0:
        return f"no in-budget scores: all {over} samples are over the router's input budget"
    if n_pos == 0 or n_neg == 0:
        return f"only one class: {counts}; tau needs both sufficient and insufficient samples"
    if n_pos + n_neg < min_samples:
        return f"too few samples: {counts}, need at least {min_samples} (--min_calibration_samples)"
    if min(n_pos, n_neg) < min_per_class:
        return (f"too few of one class: {counts}, need at least {min_per_class} of each "
                "(--min_calibration_per_class)")
    return None
