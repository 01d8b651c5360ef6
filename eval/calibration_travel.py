"""Does tau travel? A threshold calibrated on the training corpora, applied to a corpus the router never saw.

The sufficiency router stops retrieval when its score reaches tau; tau is chosen for a stop-precision target
(``calibrate_threshold``). Deployed on a new corpus, the scores shift, and the precision the user asked for may not
hold. For a router trained without corpus C this module measures:

* **travel**: tau calibrated on the pooled held-out samples of the training corpora, applied to C's held-out
  samples: the stop-precision and early-termination rate reached on C, and whether the precision stays at
  most ``tolerance`` below the target (above it only costs early termination);
* **recalibration with a handful of labels**: tau calibrated on ``k`` labelled samples of C drawn at random
  (``draws`` times), applied to the rest of C: mean precision, the share of draws that stay at most
  ``tolerance`` below the target, and the early-termination rate -- what a user gets by labelling ``k`` samples
  of their own data (``memroute calibrate --scores ...``).
"""

from __future__ import annotations

import numpy as np

from eval.metrics import calibrate_threshold, threshold_metrics


def _labels_scores(rows: list[dict], field: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.array([int(r["label"]) for r in rows], dtype=int)
    s = np.array([np.nan if r.get(field) is None else float(r[field]) for r in rows], dtype=float)
    return y, s


def travel(calibration_rows: list[dict], target_rows: list[dict], target_precision: float = 0.9,
           tolerance: float = 0.05, field: str = "trained") -> dict:
    """tau from ``calibration_rows`` (training corpora), judged on ``target_rows`` (the left-out corpus)."""
    yc, sc = _labels_scores(calibration_rows, field)
    cal = calibrate_threshold(yc, sc, target_precision=target_precision)
    yt, st = _labels_scores(target_rows, field)
    on_target = threshold_metrics(yt, st, cal["threshold"])
    precision = on_target["precision"]
    return {
        "target_precision": target_precision, "tolerance": tolerance, "tau": cal["threshold"],
        "reachable_on_calibration": cal.get("reachable"), "n_calibration": int(len(yc)),
        "calibration_precision": cal.get("precision"),
        "calibration_early_termination": cal.get("early_termination_rate"),
        "precision": precision, "early_termination_rate": on_target["early_termination_rate"],
        "recall": on_target["recall"], "n": on_target["n"],
        # no stop at all is not a precision failure, but it is not a usable router either: say so apart
        # stop-precision may exceed the target (that costs early termination, reported beside it), not fall
        # more than `tolerance` below it; no stop at all is no precision failure, nor a usable router: None
        "travels": None if precision is None else bool(precision >= target_precision - tolerance),
        "precision_gap": None if precision is None else precision - target_precision,
        "oracle_tau": calibrate_threshold(yt, st, target_precision=target_precision)["threshold"],
    }


def recalibrate_with_labels(rows: list[dict], k: int, draws: int = 50, target_precision: float = 0.9,
                            tolerance: float = 0.05, field: str = "trained", seed: int = 0) -> dict | None:
    """tau from ``k`` random labelled samples of the corpus, applied to its other samples (``draws`` times)."""
    if k < 2 or len(rows) <= k:
        return None
    y, s = _labels_scores(rows, field)
    rng = np.random.default_rng(seed)
    precisions, early, no_stop = [], [], 0
    for _ in range(draws):
        pick = np.zeros(len(y), dtype=bool)
        pick[rng.choice(len(y), size=k, replace=False)] = True
        tau = calibrate_threshold(y[pick], s[pick], target_precision=target_precision)["threshold"]
        m = threshold_metrics(y[~pick], s[~pick], tau)
        early.append(m["early_termination_rate"])
        if m["precision"] is None:
            no_stop += 1
            continue
        precisions.append(m["precision"])
    return {"k": k, "draws": draws, "target_precision": target_precision, "tolerance": tolerance,
            "mean_precision": float(np.mean(precisions)) if precisions else None,
            "p10_precision": float(np.percentile(precisions, 10)) if precisions else None,
            # of all draws: precision >= target - tolerance (a draw that stops nothing does not count as one)
            "share_travels": sum(p >= target_precision - tolerance for p in precisions) / draws,
            "share_no_stop": no_stop / draws, "mean_early_termination_rate": float(np.mean(early))}
