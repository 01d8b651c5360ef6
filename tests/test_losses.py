"""Router-Mem losses (DESIGN §5): grouped-token L_cls and representation distillation L_rep, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from train.losses import GroupedTokenLoss, RepresentationDistillationLoss

LOGITS = [[0.5, 2.0, -1.0, 0.3, 1.5, -0.7],
          [1.2, -0.4, 0.8, 2.5, 0.0, -2.0]]
YES, NO = [1, 2], [3]


def _softmax(row):
    z = sum(math.exp(x) for x in row)
    return [math.exp(x) / z for x in row]


def test_grouped_token_loss_matches_hand_computation():
    p0, p1 = _softmax(LOGITS[0]), _softmax(LOGITS[1])
    # Row 0 is labelled yes: -log(P(1) + P(2)); row 1 is labelled no: -log(P(3)). Full-vocabulary softmax.
    expected = (-math.log(p0[1] + p0[2]) - math.log(p1[3])) / 2
    loss = GroupedTokenLoss(YES, NO)(torch.tensor(LOGITS), torch.tensor([1, 0]))
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-6)
    # Swapping the labels swaps the groups.
    swapped = (-math.log(p0[3]) - math.log(p1[1] + p1[2])) / 2
    loss2 = GroupedTokenLoss(YES, NO)(torch.tensor(LOGITS), torch.tensor([0, 1]))
    torch.testing.assert_close(loss2, torch.tensor(swapped, dtype=torch.float32), rtol=1e-6, atol=1e-6)


def test_grouped_token_loss_uses_the_full_vocabulary_and_gives_gradients():
    # Mass outside both groups counts against the loss: raising an unrelated logit raises L_cls.
    logits = torch.tensor(LOGITS, requires_grad=True)
    base = GroupedTokenLoss(YES, NO)(logits, torch.tensor([1, 0]))
    bumped = torch.tensor(LOGITS)
    bumped[:, 5] += 3.0
    assert GroupedTokenLoss(YES, NO)(bumped, torch.tensor([1, 0])) > base
    base.backward()
    g = logits.grad
    assert g is not None
    assert g[0, 1] < 0 and g[0, 2] < 0 and g[1, 3] < 0  # gold-group logits are pushed up
    assert g[0, 3] > 0 and g[1, 1] > 0  # the other group is pushed down


def test_grouped_token_loss_accepts_bfloat16_logits():
    x = torch.tensor([LOGITS[1]], dtype=torch.bfloat16)  # computed in float32 from the rounded values
    p = _softmax(x.float()[0].tolist())
    loss = GroupedTokenLoss([0, 4], [2, 3])(x, torch.tensor([0]))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(-math.log(p[2] + p[3]), rel=1e-5)


def test_rep_loss_zero_for_identical_states():
    loss = RepresentationDistillationLoss()
    assert loss(torch.tensor([[3.0, 0.0, 4.0]]), torch.tensor([[3.0, 0.0, 4.0]])).item() == 0.0
    s = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    # float32 rounding of cos(h, h) is at most a few ulps below 1.
    assert abs(loss(s, s.clone()).item()) < 1e-6


def test_rep_loss_hand_example_and_opposites():
    loss = RepresentationDistillationLoss()
    student = torch.tensor([[1.0, 0.0], [2.0, 1.0]])
    teacher = torch.tensor([[1.0, 1.0], [-1.0, 2.0]])  # cos = 1/sqrt(2) and 0
    expected = ((1 - 1 / math.sqrt(2)) + (1 - 0.0)) / 2
    assert loss(student, teacher).item() == pytest.approx(expected, abs=1e-6)
    v = torch.tensor([[0.3, -1.2, 2.0, 0.5]])
    assert loss(v, -v).item() == pytest.approx(2.0, abs=1e-6)
    assert loss(v, 7.5 * v).item() == pytest.approx(0.0, abs=1e-6)  # scale-invariant


def test_rep_loss_trains_the_student_only():
    student = torch.randn(3, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    teacher = torch.randn(3, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
    out = RepresentationDistillationLoss()(student, teacher)
    out.backward()
    assert teacher.grad is None
    assert student.grad is not None and student.grad.abs().sum() > 0
