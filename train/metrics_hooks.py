"""The sufficiency trainer's evaluation hooks: per-sample scores during the eval loop, AUROC / AP at its end.

``Trainer`` accumulates whatever ``prediction_step`` returns as logits over the whole eval set. The sufficiency
trainer returns only the last-token logits (never hidden states), and :class:`ScoreFromLogits` (passed as
``preprocess_logits_for_metrics``) turns each batch into one score per sample right away, so the eval loop keeps a
``(n,)`` vector instead of ``(n, vocab)`` logits. The score is the router's own: s = p_yes / (p_yes + p_no) over
the verbalizer token groups (:func:`routers.sufficiency.sufficiency_score`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from routers.logs import get_logger
from routers.sufficiency import sufficiency_score

log = get_logger(__name__)


class ScoreFromLogits:
    """``preprocess_logits_for_metrics``: ``[batch, vocab]`` (or ``[batch, 1, vocab]``) logits -> ``[batch]`` scores."""

    def __init__(self, yes_ids, no_ids):
        self.yes_ids, self.no_ids = list(yes_ids), list(no_ids)

    def __call__(self, logits, labels=None) -> torch.Tensor:
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        if logits.dim() == 3:
            logits = logits[:, -1, :]
        return sufficiency_score(logits, self.yes_ids, self.no_ids).float()


def binary_metrics(eval_pred) -> dict[str, float]:
    """``compute_metrics``: AUROC and average precision (sklearn) of the scores against the 0/1 labels, plus the
    number of dev samples and positives. With one class only the ranking metrics are undefined: NaN (such an
    evaluation is never the best one)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    scores = np.asarray(eval_pred.predictions, dtype=np.float64).reshape(-1)
    labels = np.asarray(eval_pred.label_ids).reshape(-1).astype(int)
    finite = np.isfinite(scores)
    out = {"n": float(len(labels)), "positives": float(labels.sum())}
    if len(set(labels[finite].tolist())) < 2:
        log.warning("dev set has a single class (%d samples): AUROC and AP are undefined", len(labels))
        return {"auroc": math.nan, "ap": math.nan, **out}
    return {"auroc": float(roc_auc_score(labels[finite], scores[finite])),
            "ap": float(average_precision_score(labels[finite], scores[finite])), **out}
