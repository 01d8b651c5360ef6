"""Float comparisons that do not depend on the CPU's summation order.

Two float32 computations of the same quantity (cached vs plain gradients, DDP vs one process, a resumed
vs an uninterrupted run) differ by rounding that scales with the tensor's magnitude, and by how many terms
each element sums; the order of those sums varies with the CPU's vector width (AVX2 vs AVX-512). An
elementwise ``atol`` then fails on near-zero entries of a tensor whose large entries match to 1e-7
relative. Compare the largest deviation with the tensor's own scale instead, in float64.
"""

from __future__ import annotations

import torch


def max_rel_error(actual, expected, scale: float | None = None) -> float:
    """max|a - b| / max|b| (in float64); 0 when both are all-zero. ``scale`` replaces max|b| where a tensor's
    exact value is zero and it holds only rounding noise (the gradient of an attention key bias, which
    softmax ignores): compare it with the scale of the whole gradient instead."""
    a = torch.as_tensor(actual).detach().to(torch.float64).cpu()
    b = torch.as_tensor(expected).detach().to(torch.float64).cpu()
    assert a.shape == b.shape, f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    if scale is None:
        scale = b.abs().max().item() if b.numel() else 0.0
    err = (a - b).abs().max().item() if b.numel() else 0.0
    if scale == 0.0:
        return err
    return err / scale


def assert_close_to_scale(actual, expected, rel: float = 1e-4, msg: str = "", scale: float | None = None) -> None:
    """Assert max|a - b| <= rel * max|b| (or rel * ``scale``): equal up to float32 rounding relative to the
    tensor's scale."""
    err = max_rel_error(actual, expected, scale)
    assert err <= rel, f"{msg + ': ' if msg else ''}max deviation {err:.3g} of the tensor's scale > {rel:g}"
