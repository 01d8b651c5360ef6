"""Sweep records as arrays for policy fitting and evaluation, and the episode-level splits.

:class:`SweepTable` holds, for a list of sweep records, the per-question score of every subset (``R``, n x 31,
column ``mask - 1``), its evidence tokens (``T``) and the selector views. The objective of a subset on a
question is ``R - lam * T / t_ref``; its mean over questions is exactly J - lam * C_norm (the objective is
linear), where ``C_norm = C / t_ref`` and ``t_ref`` is the mean evidence tokens of "all five" on the train
split (so lam = 0.1 means: reading as much as all five costs 0.1 score points). The empty subset scores 0 with
0 tokens. With ``score="f1"`` questions whose f1 is null are left out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from routers.mesa.selector_view import FULL_MASK, K, MASKS, QueryView, key_of, view_of

SCORES = ("evidence_recall", "f1")


@dataclass
class SweepTable:
    ids: list
    episodes: list[str]
    views: list[QueryView]
    R: np.ndarray  # (n, 31) score of each subset
    T: np.ndarray  # (n, 31) evidence tokens of each subset
    score: str = "evidence_recall"

    def __len__(self):
        return len(self.ids)

    @classmethod
    def from_records(cls, records: Sequence[dict], score: str = "evidence_recall") -> "SweepTable":
        if score not in SCORES:
            raise ValueError(f"score must be one of {list(SCORES)}, got {score!r}")
        keys = [key_of(m) for m in MASKS]
        rows = [r for r in records if all(r["subsets"][k][score] is not None for k in keys)]
        R = np.array([[float(r["subsets"][k][score]) for k in keys] for r in rows], dtype=float).reshape(-1, len(keys))
        T = np.array([[float(r["subsets"][k]["tokens"]) for k in keys] for r in rows], dtype=float).reshape(-1, len(keys))
        return cls([r["id"] for r in rows], [r["episode_id"] for r in rows], [view_of(r) for r in rows], R, T, score)

    def subset(self, episodes) -> "SweepTable":
        keep = set(episodes)
        idx = [i for i, e in enumerate(self.episodes) if e in keep]
        return SweepTable([self.ids[i] for i in idx], [self.episodes[i] for i in idx], [self.views[i] for i in idx],
                          self.R[idx], self.T[idx], self.score)

    def objective(self, lam: float, t_ref: float) -> np.ndarray:
        return self.R - lam * self.T / t_ref

    def at(self, masks: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per-question (score, tokens) of the selected masks (0 = empty: score 0, tokens 0)."""
        m = np.asarray(masks, dtype=int)
        rows = np.arange(len(m))
        r = np.where(m > 0, self.R[rows, np.maximum(m, 1) - 1], 0.0)
        t = np.where(m > 0, self.T[rows, np.maximum(m, 1) - 1], 0.0)
        return r, t


def reference_tokens(table: SweepTable) -> float:
    """t_ref: mean evidence tokens of all five structures (>= 1)."""
    return max(1.0, float(table.T[:, FULL_MASK - 1].mean())) if len(table) else 1.0


def utilities(Q: np.ndarray) -> np.ndarray:
    """u[i, k]: how much structure k belongs to question i's best subset b_i (argmax of its objective; the empty
    subset scores 0): Q(b_i) - Q(b_i without k) > 0 when k is in b_i, Q(b_i with k) - Q(b_i) <= 0 when it is not.
    Measured at the optimum, substitutes (two structures holding the same evidence) are not both called useless."""
    n = Q.shape[0]
    Qe = np.concatenate([np.zeros((n, 1)), Q], axis=1)  # column m = mask m, column 0 = empty
    best = Qe[:, 1:].argmax(axis=1) + 1
    rows = np.arange(n)
    out = np.empty((n, K))
    for k in range(K):
        flipped = best ^ (1 << k)
        inside = (best >> k) & 1 == 1
        out[:, k] = np.where(inside, Qe[rows, best] - Qe[rows, flipped], Qe[rows, flipped] - Qe[rows, best])
    return out


def split_episodes(episode_ids: Sequence[str], seed: int, ratios: Sequence[int] = (2, 2, 6)) -> dict[str, list[str]]:
    """Episode-level train/val/test split (default 2:2:6), a function of the episode set and the seed only."""
    eps = sorted(set(episode_ids))
    if len(eps) < 3:
        raise ValueError(f"need at least 3 episodes for a train/val/test split, got {len(eps)}")
    random.Random(int(seed)).shuffle(eps)
    total = float(sum(ratios))
    n_tr = max(1, int(round(len(eps) * ratios[0] / total)))
    n_va = max(1, int(round(len(eps) * ratios[1] / total)))
    n_tr = min(n_tr, len(eps) - 2)
    n_va = min(n_va, len(eps) - n_tr - 1)
    return {"train": sorted(eps[:n_tr]), "val": sorted(eps[n_tr:n_tr + n_va]), "test": sorted(eps[n_tr + n_va:])}
