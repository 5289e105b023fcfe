"""The RL topics and service names, named here once (never as string literals).

Actors, buffers, learners and the parameter service talk only through the events of
:mod:`tianji.rl.events` on these topics.
"""

from __future__ import annotations

from tianji.rl.events import (
    ActionsComputed,
    BatchRequested,
    CheckpointTaken,
    ComputeActions,
    DrawOpponents,
    EpisodesFinished,
    GamesPlayed,
    GradientsShared,
    ParamsPublished,
    PolicyEvaluated,
    PrioritiesUpdated,
    RendezvousOffered,
    RestoreCheckpoint,
    SampleBatch,
    SnapshotTaken,
    TrajectoryCollected,
)
from tianji.runtime.events import topic

__all__ = [
    "OBSERVATIONS",
    "actions_topic",
    "inference_name",
    "observations_topic",
    "replay_restore_topic",
    "replay_snapshots_topic",
    "batches_topic",
    "buffer_name",
    "learners_of_shard",
    "priorities_topic",
    "shards_of_learner",
    "trajectories_topic",
    "gradients_topic",
    "learner_name",
    "CHECKPOINTS",
    "EPISODES",
    "GAMES",
    "OPPONENTS",
    "SNAPSHOTS",
    "EVALUATIONS",
    "RESTORE",
    "LATEST_PARAMS",
    "LEARNER_PARAMS",
    "PRIORITIES",
    "RENDEZVOUS",
    "REQUESTS",
    "TRAJECTORIES",
]

TRAJECTORIES = topic(TrajectoryCollected)
"""Actors -> buffer: trajectory fragments (post-processed by the algorithm)."""
EPISODES = topic(EpisodesFinished)
"""Actors -> monitor: finished training episodes and env-step counts."""
EVALUATIONS = topic(PolicyEvaluated)
"""Evaluation workers -> monitor: the returns of each evaluation."""
LEARNER_PARAMS = topic(ParamsPublished)
"""Learner -> params service: every new weight version."""
LATEST_PARAMS = topic(ParamsPublished, "latest")
"""Params service -> actors: the latest weights, sent at once to every new subscriber."""
REQUESTS = topic(BatchRequested)
"""Learner -> buffer: credit for more sample batches."""
PRIORITIES = topic(PrioritiesUpdated)
"""Learner -> buffer: new priorities for prioritized replay."""
CHECKPOINTS = topic(CheckpointTaken)
"""Learner-0 -> monitor: packed learner state to write as a checkpoint."""
RESTORE = topic(RestoreCheckpoint)
"""Monitor -> learners (resumed run): the state to continue from, sent on subscription."""
OBSERVATIONS = topic(ComputeActions)
"""Actors -> inference service: observations that need actions."""
SNAPSHOTS = topic(SnapshotTaken)
"""Self-play: league snapshots, from the parameter service to actors and the league."""
GAMES = topic(GamesPlayed)
"""Self-play: the outcomes of actors' games, to the league."""
RENDEZVOUS = topic(RendezvousOffered)
"""Learner-0 -> the other data-parallel learners: where their collective's group meets."""
OPPONENTS = topic(DrawOpponents)
"""Self-play: the opponent probabilities, from the league to actors."""


def replay_snapshots_topic(buffer: str) -> str:
    """Buffer shard -> monitor: snapshots of its replay contents (``[checkpoint] replay``)."""
    return topic(CheckpointTaken, "replay", buffer)


def replay_restore_topic(buffer: str) -> str:
    """Monitor -> buffer shard (resumed run): the replay contents to start from."""
    return topic(RestoreCheckpoint, "replay", buffer)


def actions_topic(actor: str) -> str:
    """Inference service -> one actor: the actions for its requests."""
    return topic(ActionsComputed, actor)


def batches_topic(learner: str) -> str:
    """Buffer -> one learner: the sample batches it asked for."""
    return topic(SampleBatch, learner)


def gradients_topic(learner: str) -> str:
    """One data-parallel learner -> its peers: its gradient of every all-reduce step."""
    return topic(GradientsShared, learner)


def learner_name(index: int) -> str:
    """The service name of data-parallel learner ``index`` (``learner-0`` publishes weights)."""
    return f"learner-{index}"


def buffer_name(shard: int) -> str:
    """The service name of buffer shard ``shard``."""
    return f"buffer-{shard}"


def inference_name(index: int) -> str:
    """The service name of inference service ``index``."""
    return f"inference-{index}"


def observations_topic(index: int, count: int) -> str:
    """Actors -> inference service ``index``: ``OBSERVATIONS`` itself when there is one."""
    return OBSERVATIONS if count == 1 else topic(ComputeActions, inference_name(index))


def shard_of_actor(actor: int, shards: int) -> int:
    """The buffer shard actor ``actor`` sends its trajectories to."""
    return actor % shards


def index_of(name: str) -> int:
    """The index in a service name: ``actor-3`` and its retired ``actor-3#2`` -> 3.

    Raises:
        ValueError: for a name without one.
    """
    _, dash, suffix = name.split("#", 1)[0].rpartition("-")
    if not dash or not suffix.isdigit():
        raise ValueError(f"service name {name!r} has no index (expected e.g. 'actor-3')")
    return int(suffix)


def trajectories_topic(shard: int, shards: int) -> str:
    """Actors -> buffer shard: ``TRAJECTORIES`` itself when there is one shard."""
    return TRAJECTORIES if shards == 1 else topic(TrajectoryCollected, buffer_name(shard))


def priorities_topic(shard: int, shards: int) -> str:
    """Learners -> buffer shard: new priorities for the slots that shard handed out."""
    return PRIORITIES if shards == 1 else topic(PrioritiesUpdated, buffer_name(shard))


def shards_of_learner(learner: int, learners: int, shards: int) -> list[int]:
    """The buffer shards learner ``learner`` of ``learners`` samples from: every shard
    ``s`` with ``s % learners == learner`` when there are at least as many shards as
    learners, else shard ``learner % shards`` (shared with other learners)."""
    if shards >= learners:
        return [s for s in range(shards) if s % learners == learner]
    return [learner % shards]


def learners_of_shard(shard: int, learners: int, shards: int) -> list[int]:
    """The learners shard ``shard`` serves (the inverse of :func:`shards_of_learner`)."""
    return [j for j in range(learners) if shard in shards_of_learner(j, learners, shards)]
