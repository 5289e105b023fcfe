"""The balance settings of a run: ``[controller]``, ``[learner]`` and ``[actors]`` plus what the
algorithm's buffer says, as one :class:`~tianji.rl.balance.BalanceConfig`; the services and
the controller all derive theirs here, so they agree."""

from __future__ import annotations

import os

from tianji.rl.algorithm import BufferSpec
from tianji.rl.balance import BalanceConfig
from tianji.rl.config import RunConfig
from tianji.runtime.errors import ConfigError

__all__ = ["balance_config", "min_replay_total", "publish_every", "replay_ratio"]


def balance_config(run: RunConfig, spec: BufferSpec) -> BalanceConfig:
    """The balance settings of a run.

    Args:
        run: the run config.
        spec: the algorithm's buffer spec (rollout: ``batch_size`` counts fragments).

    Raises:
        ConfigError: for settings under which the run could never make progress.
    """
    ctl, actors = run.controller, run.actors
    fragment = actors.fragment_length * actors.envs_per_actor
    on_policy = spec.kind == "rollout"
    batch = spec.batch_size * fragment if on_policy else spec.batch_size
    batch *= run.learner.count  # one update (version) takes a batch from every learner
    if on_policy and run.buffer.shards > 1:
        raise ConfigError(
            "buffer.shards",
            run.buffer.shards,
            "1 for an on-policy algorithm: its rollouts are consumed once, by version, and a "
            "learner whose shard's actors are paused would hold every other learner at the "
            "next gradient step (shard replay buffers instead)",
        )
    min_replay = 0 if on_policy else min_replay_total(run, spec.min_size)
    collecting = ctl.max_collecting
    if not collecting and not on_policy:
        collecting = os.cpu_count() or 1  # the learner shares these cores (the docstring)
    ratio = replay_ratio(run, spec)
    return BalanceConfig(
        mode=ctl.mode,
        on_policy=on_policy,
        replay_ratio=ratio,
        tolerance=ratio / 4 if ctl.tolerance is None else ctl.tolerance,
        min_replay_size=min_replay,
        fill_fragments=max(1, -(-min_replay // (actors.count * fragment))),
        max_policy_lag=run.learner.max_policy_lag,
        lag_target=ctl.lag_target,
        batch_samples=batch,
        fragment_samples=fragment,
        learners=run.learner.count,
        shards=run.buffer.shards,
        buffer_fragments=spec.capacity if on_policy else 0,
        max_collecting=collecting,
        producers=actors.count,
        publish_interval=publish_every(run, spec),
        watchdog_s=ctl.watchdog_seconds,
    )


def replay_ratio(run: RunConfig, spec: BufferSpec) -> float:
    """Samples consumed per sample inserted: ``[controller] replay_ratio`` when set, else the
    algorithm's ``updates_per_step`` x its batch size; 1.0 for on-policy runs (unused).

    Raises:
        ConfigError: for a replay algorithm that declares no ``updates_per_step`` in a run
            that sets no ``replay_ratio``.
    """
    if run.controller.replay_ratio is not None:
        return run.controller.replay_ratio
    if spec.kind == "rollout":
        return 1.0
    if spec.updates_per_step is None:
        why = (
            f"set: algorithm {run.algorithm!r} declares no updates_per_step in its BufferSpec "
            "(learner updates per env step); declare one, or set [controller] replay_ratio "
            "(samples consumed per sample inserted)"
        )
        raise ConfigError("controller.replay_ratio", None, why)
    return spec.updates_per_step * spec.batch_size


def publish_every(run: RunConfig, spec: BufferSpec) -> int:
    """Updates between two weight publications: ``learner.publish_interval`` when set;
    else 1 for on-policy runs, and for off-policy runs the updates that one actor fragment
    pays for at the replay ratio (``replay_ratio * fragment samples / batch size``, at
    least 1). A DQN learner publishing 270 KB of weights after every update (133/s) spent a
    quarter of a 2-core machine on weights its actors replaced before using them."""
    if run.learner.publish_interval is not None:
        return run.learner.publish_interval
    if spec.kind == "rollout":
        return 1
    fragment = run.actors.fragment_length * run.actors.envs_per_actor
    return max(1, int(replay_ratio(run, spec) * fragment / spec.batch_size))


def min_replay_total(run: RunConfig, min_size: int) -> int:
    """Samples inserted over all buffer shards before every shard holds ``min_size``: the
    shards' actors split unevenly when ``actors.count % shards != 0``."""
    shards, actors = run.buffer.shards, run.actors.count
    most, fewest = -(-actors // shards), actors // shards
    return -(-min_size * shards * most // fewest)
