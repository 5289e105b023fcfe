"""The learner's policy-lag statistics stay small and report exact mean and max."""

from __future__ import annotations

import numpy as np

from tianji.services.learner import LagStats


def test_small_lags_are_exact_and_large_ones_bucketed_by_powers_of_two() -> None:
    stats = LagStats()
    stats.add(np.array([0, 1, 1, 2, 31, 32, 40, 100, 1000]))
    assert stats.counts == {0: 1, 1: 2, 2: 1, 31: 1, 32: 2, 64: 1, 512: 1}
    counters = stats.as_counters()
    assert counters["lag_sum"] == 1207 and counters["lag_max"] == 1000


def test_a_heartbeat_carries_a_bounded_number_of_lag_counters() -> None:
    stats = LagStats()
    stats.add(np.arange(1_000_000))
    assert len(stats.as_counters()) <= LagStats.EXACT + 64


def test_summary_gives_exact_mean_and_max() -> None:
    stats = LagStats()
    stats.add(np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 9]))
    summary = LagStats.summarize(dict(stats.counts), stats.total_lag, stats.max_lag)
    assert summary == {"mean": 2.0, "p50": 1.0, "p95": 9.0, "max": 9.0}
    assert LagStats.summarize({}, 0, 0) is None
