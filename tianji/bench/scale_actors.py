"""``tianji bench scale``, actors part: the data plane of one host as actor processes multiply.

Each row is a fresh ``tianji train`` (through :func:`tianji.bench.throughput.measure`):
CartPole-v1, N actor processes x 4 envs, PPO's sampling path alone
(:class:`tianji.bench.algos.SamplingPPO`: the learner takes every batch and computes
nothing; controller ``unbalanced``), over TCP, so what is measured is the runtime: env
stepping, the policy's forward pass in each actor, fragments to the buffer, batches to the
learner, heartbeats and the controller. Figures: aggregate env steps/s over the steady
window, the controller process's CPU share over the same window (it also runs the
monitor and the launcher), and the largest resident memory of a process of each role.
"""

from __future__ import annotations

from typing import Any

from tianji.bench.throughput import Cell, measure

__all__ = ["measure_actors"]


def measure_actors(actors: int, seconds: float, warmup: float) -> dict[str, Any]:
    """One actors row (``error`` instead of figures when the run failed)."""
    cell = Cell("tianji", "cartpole", mode="sampling")
    overrides: dict[str, dict[str, Any]] = {"actors": {"count": actors}}
    # N processes start on the box's cores before the first step: give the run that time
    # on top of its window (32 actors took ~45 s to start here)
    overrides["stop"] = {"max_seconds": seconds + warmup + 15.0 + 2.0 * actors}
    row = measure(cell, seconds, warmup, None, overrides)
    out: dict[str, Any] = {"part": "actors", "actors": actors, "envs_per_actor": 4}
    for key in ("env_steps_per_s", "seconds", "controller_cpu_share", "max_rss_mb_by_role"):
        if key in row:
            out[key] = row[key]
    if "error" in row:
        out["error"] = row["error"]
    return out
