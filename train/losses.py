"""Losses of the Router-Mem sufficiency router as small documented modules (seed 001, DESIGN §5)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from routers.sufficiency import group_log_probs


class GroupedTokenLoss(nn.Module):
    """L_cls = -log sum_{v in V_y} P(v | x), with V_y the yes or no token group of the gold label.

    The probabilities come from the full-vocabulary softmax at the decision position, so the loss
    also pushes mass away from tokens outside both groups (the router must answer yes or no).
    """

    def __init__(self, yes_ids: Sequence[int], no_ids: Sequence[int]):
        super().__init__()
        self.yes_ids, self.no_ids = list(yes_ids), list(no_ids)

    def forward(self, last_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        lp_yes, lp_no = group_log_probs(last_logits, self.yes_ids, self.no_ids)
        return -torch.where(labels.bool(), lp_yes, lp_no).mean()


class RepresentationDistillationLoss(nn.Module):
    """L_rep = 1 - cos(h_s, h_t): pull the student's decision state toward a frozen teacher's state.

    h_s is the student's hidden state at the decision position (it read only question + context);
    h_t is the teacher's state at the same position after it also read the rationale. The teacher
    side is detached: it is a target, never trained.
    """

    def forward(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        cos = nn.functional.cosine_similarity(student.float(), teacher.detach().float(), dim=-1)
        return (1.0 - cos).mean()
