"""The suite's float comparison: relative to the tensor's scale, so it does not depend on the CPU."""

import pytest
import torch

from numerics import assert_close_to_scale, max_rel_error


def test_rounding_on_near_zero_entries_passes_relative_to_scale():
    # The AMD EPYC failure: entries up to 1.4, float32 summation-order noise of 5e-6 on near-zero ones.
    expected = torch.tensor([1.4, -0.7, 1e-7, 0.0])
    actual = expected + torch.tensor([0.0, 0.0, 5e-6, -5e-6])
    with pytest.raises(AssertionError):  # what the elementwise check did
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-6)
    assert max_rel_error(actual, expected) == pytest.approx(5e-6 / 1.4, rel=1e-3)
    assert_close_to_scale(actual, expected, rel=1e-4)


def test_a_real_difference_still_fails():
    expected = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(AssertionError, match="scale"):
        assert_close_to_scale(expected * 1.01, expected, rel=1e-4)
    with pytest.raises(AssertionError, match="shape"):
        assert_close_to_scale(torch.zeros(2), torch.zeros(3))
    assert max_rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert max_rel_error(torch.ones(3), torch.zeros(3)) == 1.0
