"""A no-reading baseline for sufficiency data: how far surface statistics alone separate the labels.

Why: evidence-intervention samples can differ in more than their evidence. The paper's recipe draws a positive's
distractors at random and a negative's among hard (related) steps, so "how related is the context to the question"
predicts the label without ever looking for the answer; a router can score a high AUROC by learning that. Read
every sufficiency AUROC next to this one: a router that does not beat it has not shown that it reads.

Six features per sample -- number of context steps, log characters, and the mean / min / max / std cosine between
the question and each step under a sentence encoder (by default base all-MiniLM-L6-v2, the encoder that mines the
hard distractors) -- and a standardized logistic regression fitted on a training file.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

FEATURES = ("n_steps", "log_chars", "cos_mean", "cos_min", "cos_max", "cos_std")


def split_steps(record: dict) -> list[str]:
    """The context's steps: cut where each ``[step_id]`` of ``context_step_ids`` opens a line (render_context's
    format; a step may span lines). Without ids, one step per non-empty line."""
    context = record["context"]
    ids = record.get("context_step_ids") or []
    starts = []
    for step_id in ids:
        m = re.search(rf"(?m)^\[{re.escape(str(step_id))}\]", context)
        if m:
            starts.append(m.start())
    starts = sorted(set(starts))
    if not starts:
        return [line for line in context.splitlines() if line.strip()]
    starts[0] = 0
    return [context[a:b].strip() for a, b in zip(starts, starts[1:] + [len(context)]) if context[a:b].strip()]


def surface_features(records: Sequence[dict], encoder, batch_size: int = 64) -> np.ndarray:
    """One row of FEATURES per record; ``encoder`` is anything with sentence-transformers' ``encode``."""
    steps = [split_steps(r) for r in records]
    texts = sorted({s for ss in steps for s in ss})
    emb = dict(zip(texts, encoder.encode(texts, batch_size=batch_size, normalize_embeddings=True))) if texts else {}
    queries = encoder.encode([r["question"] for r in records], batch_size=batch_size, normalize_embeddings=True)
    rows = []
    for r, ss, q in zip(records, steps, queries):
        cos = np.array([float(emb[s] @ q) for s in ss]) if ss else np.zeros(1)
        rows.append([len(ss), math.log1p(len(r["context"])), cos.mean(), cos.min(), cos.max(), cos.std()])
    return np.asarray(rows, dtype=float)


def fit_surface_model(features: np.ndarray, labels: Sequence[int]):
    """Standardized logistic regression (scikit-learn) on surface features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(set(int(y) for y in labels)) < 2:
        raise ValueError("the surface baseline needs both labels in its training file")
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(features, np.asarray(labels, int))


def surface_baseline(train: Sequence[dict], held_out: Sequence[dict], encoder) -> dict:
    """Fit on ``train``, score ``held_out``: {auroc, ap, n, auroc_by_negative, coef} -- the leave-out row's shape."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    from eval.metrics import auroc_by_negative_kind

    model = fit_surface_model(surface_features(train, encoder), [r["label"] for r in train])
    p = model.predict_proba(surface_features(held_out, encoder))[:, 1]
    labels = [int(r["label"]) for r in held_out]
    scored = [{"label": y, "variant": r.get("variant"), "surface": float(s)} for r, y, s in zip(held_out, labels, p)]
    both = len(set(labels)) == 2
    return {"auroc": float(roc_auc_score(labels, p)) if both else None,
            "ap": float(average_precision_score(labels, p)) if both else None, "n": len(labels),
            "auroc_by_negative": auroc_by_negative_kind(scored, "surface"),
            "coef": dict(zip(FEATURES, np.round(model[-1].coef_[0], 4).tolist()))}
