"""The profiled W is the rest of one fused backward after B, so that B + W is what a
schedule without the B/W split runs; a layer too small to leave a rest gets the split's W."""

from __future__ import annotations

import pytest

from executor.profiler import _weight_s


def test_w_is_the_fused_backward_minus_b():
    assert _weight_s([3.0, 2.9, 3.2], [1.0, 1.1, 0.9], [5.0, 5.0, 5.0]) == pytest.approx(2.0)


def test_without_a_rest_w_is_the_splits_own():
    assert _weight_s([1.0], [1.2], [0.4, 0.5, 0.6]) == pytest.approx(0.5)
