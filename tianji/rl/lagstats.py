"""The policy lag of consumed samples: a bounded histogram (:class:`LagStats`) and the
staleness test (:func:`stale_mask`)."""

from __future__ import annotations

import collections

import numpy as np

from tianji.rl.stats import LearnerStat

__all__ = ["LagStats", "stale_mask"]


def stale_mask(
    sample_versions: np.ndarray, learner_version: int, max_policy_lag: int
) -> np.ndarray:
    """True for the samples whose lag exceeds ``max_policy_lag`` (to be dropped as stale)."""
    return (learner_version - np.asarray(sample_versions)) > max_policy_lag


class LagStats:
    """Distribution of policy lag (in versions) over consumed samples, with bounded size.

    Lags below ``EXACT`` are counted exactly; larger ones (replay) in power-of-two buckets
    named by their lower bound, so a heartbeat carries at most ~``EXACT`` + 60 counters.
    The sum and the maximum are kept exactly.
    """

    EXACT = 32

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.total_lag = 0
        self.max_lag = 0

    @classmethod
    def bucket(cls, lag: int) -> int:
        return lag if lag < cls.EXACT else 1 << (lag.bit_length() - 1)

    def add(self, lags: np.ndarray) -> None:
        lags = lags.astype(np.int64)
        if not lags.size:
            return
        self.total_lag += int(lags.sum())
        self.max_lag = max(self.max_lag, int(lags.max()))
        values, counts = np.unique(lags, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.counts[self.bucket(int(v))] += int(c)

    def as_counters(self) -> dict[str, int]:
        """Histogram as heartbeat counters ``lag/<bucket>``, plus ``lag_sum`` and ``lag_max``."""
        out = {f"{LearnerStat.LAG_PREFIX}{k}": n for k, n in self.counts.items()}
        out[LearnerStat.LAG_SUM] = self.total_lag
        out[LearnerStat.LAG_MAX] = self.max_lag
        return out

    @staticmethod
    def summarize(counts: dict[int, int], total_lag: int, max_lag: int) -> dict[str, float] | None:
        """mean, p50, p95, max (None when empty); quantiles above ``EXACT`` are bucket
        lower bounds."""
        total = sum(counts.values())
        if total == 0:
            return None
        keys = sorted(counts)

        def quantile(q: float) -> float:
            seen = 0
            for k in keys:
                seen += counts[k]
                if seen >= q * total:
                    return float(k)
            return float(keys[-1])

        return {
            "mean": total_lag / total,
            "p50": quantile(0.5),
            "p95": quantile(0.95),
            "max": float(max_lag),
        }
