"""What a run reports: the progress line, the metrics rows and the summary JSON, from the
controller's heartbeats and the monitor."""

from __future__ import annotations

from typing import Any

from tianji.rl.config import RunConfig
from tianji.rl.stats import LearnerStat, MonitorStat
from tianji.rl.tally import lag_summary
from tianji.run.progress import learner_totals, plain_line, take_snapshot
from tianji.runtime.controller import Controller
from tianji.runtime.service import ServiceStat
from tianji.services.balancer import accounting, balancer_of
from tianji.services.monitor import TrainMonitor

__all__ = ["progress_line", "summarize"]


def _sum(controller: Controller, role_prefix: str, key: str) -> int:
    return sum(
        hb.counters.get(key, 0)
        for name, hb in controller.heartbeats.items()
        if name.startswith(role_prefix)
    )


def progress_line(controller: Controller, monitor: TrainMonitor, elapsed: float) -> str:
    """One human-readable progress line (:func:`tianji.run.progress.plain_line`)."""
    return plain_line(take_snapshot(controller, monitor, elapsed))


def summarize(
    config: RunConfig,
    controller: Controller,
    monitor: TrainMonitor,
    wall: float,
    on_policy: bool = False,
) -> dict[str, Any]:
    """The summary JSON of a finished run (see the README for its keys)."""
    totals = learner_totals(controller)
    here = monitor.env_steps_here  # a resumed run's rates count this part of it only
    start_updates = monitor.resume.policy_version if monitor.resume is not None else 0
    balancer = balancer_of(controller)
    # the run has stopped: what is still on its way to or from a dead incarnation is lost
    books = accounting(controller.heartbeats, on_policy, final=True)
    books["drain"] = balancer.drained if balancer is not None else None
    return {
        "algorithm": config.algorithm,
        "env_id": config.env.id,
        "seed": config.seed,
        "mode": config.controller.mode,
        "actors": config.actors.count,
        "envs_per_actor": config.actors.envs_per_actor,
        "transport": config.transport,
        "env_steps": monitor.env_steps,
        "env_steps_by_actor": dict(sorted(monitor.env_steps_by_actor.items())),
        "episodes": monitor.episodes,
        "learners": config.learner.count,
        "learner_updates": totals["updates"],
        "wall_s": round(wall, 3),
        "env_steps_per_s": round(here / wall, 1) if wall > 0 else 0.0,
        "startup_s": round(monitor.first_data, 3) if monitor.first_data is not None else None,
        "env_steps_per_s_running": round(monitor.running_rate(), 1),
        "learner_updates_per_s_running": round(
            monitor.running_rate(totals["updates"] - start_updates), 2
        ),
        "samples_produced": _sum(controller, "actor-", "samples_produced"),
        "samples_consumed": totals["consumed"],
        "samples_dropped": books["dropped"],
        "final_return": monitor.mean_return(),  # the mean the stop was decided on
        "eval_return": monitor.eval_return(),
        "eval_policy_version": monitor.eval_policy_version(),
        "evaluations": list(monitor.evaluations),
        "target_return": config.stop.target_return,
        "time_to_target_s": (
            round(monitor.time_to_target, 3) if monitor.time_to_target is not None else None
        ),
        "env_steps_to_target": monitor.steps_to_target,
        "target_reached_unix": monitor.target_unix,
        **_staleness(controller, monitor, totals["updates"] - start_updates, on_policy),
        "controller": balancer.metrics(controller.heartbeats) if balancer else None,
        "accounting": books,
        "restarts": dict(sorted(controller.restarts.items())),
        "resumed_from": _resumed(monitor),
        "checkpoints": {
            "written": monitor.counters[MonitorStat.CHECKPOINTS_WRITTEN],
            "errors": monitor.counters[MonitorStat.CHECKPOINT_ERRORS],
            "latest": str(monitor.last_checkpoint) if monitor.last_checkpoint else None,
        },
        "services": _services(controller),
    }


def _staleness(
    controller: Controller, monitor: TrainMonitor, updates: int, on_policy: bool
) -> dict[str, Any]:
    """On-policy runs: ``policy_lag`` (versions between a sample's policy and the learner's
    at its update; bounded). Replay runs: ``sample_age`` (the same count, in learner updates
    since the sample was collected: replay reuses old samples by design, so it is an age,
    not an alarm) and ``updates_per_env_step`` (counted from the warm-up on)."""
    lags = lag_summary(controller.heartbeats)
    if on_policy:
        return {"policy_lag": lags, "sample_age": None, "updates_per_env_step": None}
    balancer = balancer_of(controller)
    warm_up = balancer.config.min_replay_size if balancer is not None else 0
    steps = monitor.env_steps_here - warm_up
    per_step = round(updates / steps, 4) if steps > 0 else None
    return {"policy_lag": None, "sample_age": lags, "updates_per_env_step": per_step}


def _services(controller: Controller) -> dict[str, Any]:
    """Per service (dead incarnations too, as ``name#k``): its role, restarts, peak RSS
    and last counters (the lag histogram's buckets left out); a learner whose
    hyperparameters PBT may change, their values at its last heartbeat."""
    rows = {}
    for name, hb in sorted(controller.heartbeats.items()):
        lag = LearnerStat.LAG_PREFIX
        row = {
            "role": hb.role,
            "restarts": controller.restarts[name],
            "max_rss_mb": hb.gauges.get(ServiceStat.MAX_RSS_MB),
            "counters": {k: v for k, v in hb.counters.items() if not k.startswith(lag)},
        }
        prefix = LearnerStat.HYPERPARAMETER_PREFIX
        hp = {k[len(prefix) :]: v for k, v in hb.gauges.items() if k.startswith(prefix)}
        if hp:
            row["hyperparameters"] = hp
        rows[name] = row
    return rows


def _resumed(monitor: TrainMonitor) -> dict[str, Any] | None:
    """Where a resumed run continued from (its checkpoint and the counts then)."""
    ckpt = monitor.resume
    if ckpt is None:
        return None
    run = ckpt.run
    return {
        "checkpoint": str(ckpt.path),
        "policy_version": ckpt.policy_version,
        "env_steps": run.get("env_steps"),
        "episodes": run.get("episodes"),
        "elapsed_s": run.get("elapsed_s"),
    }
