"""Measuring this machine for a device profile: the copy model and its fit."""

from __future__ import annotations

import numpy as np
import pytest

from swapdsl.runtime.profile import copy_profile, fit_line


def test_the_copy_line_is_recovered_from_exact_timings() -> None:
    sizes = [2**16, 2**20, 2**24, 2**26]
    latency, bandwidth = fit_line(sizes, [5e-6 + n / 12e9 for n in sizes])
    assert latency == pytest.approx(5e-6, rel=1e-6) and bandwidth == pytest.approx(12e9, rel=1e-6)
    # noise never makes a negative fixed cost
    assert fit_line([1, 2, 3], [0.0, 1.0, 2.5])[0] >= 0.0


def test_copies_are_profiled_each_way_and_both_at_once() -> None:
    c = copy_profile(np, "numpy", (2**16, 2**20, 2**22), repeat=3)
    assert 0 < c.h2d_bw <= c.h2d_alone_bw and 0 < c.d2h_bw <= c.d2h_alone_bw  # never more than alone
    assert c.latency_s >= 0 and c.mem_bw > 0
