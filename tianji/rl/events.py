"""The RL events: flow-control commands, data and checkpoints (declared with
:func:`tianji.runtime.events.event`, so the codec carries them like any other event).

Facts are named in the past tense, commands in the imperative (see
:mod:`tianji.runtime.events`). Every data-bearing event has a ``policy_version``.
"""

from __future__ import annotations

import numpy as np

from tianji.runtime.events import Event, event

__all__ = [
    "ActionsComputed",
    "BatchRequested",
    "TakeCheckpoint",
    "RestoreCheckpoint",
    "AdoptState",
    "CheckpointTaken",
    "GrantConsumption",
    "EpisodesFinished",
    "GradientsShared",
    "ComputeActions",
    "ParamsPublished",
    "PolicyEvaluated",
    "PrioritiesUpdated",
    "RendezvousOffered",
    "GrantProduction",
    "SampleBatch",
    "TrajectoryCollected",
    "SnapshotTaken",
    "GamesPlayed",
    "DrawOpponents",
]


@event
class GrantProduction(Event):
    """Command a producer (every mode, on- and off-policy; :mod:`tianji.rl.balance`): it may
    have sent ``limit`` fragments in all (counted from its start) and starts each one only
    once it holds weights of ``min_version`` or newer. A grant replaces the previous one:
    a lower ``limit`` takes back what was granted and not started (a pause)."""

    limit: int
    min_version: int
    reason: str


@event
class GrantConsumption(Event):
    """Command a learner: it may consume until its ``samples_consumed`` reaches ``limit``
    (``-1``: no limit). A grant replaces the previous one."""

    limit: int
    reason: str


@event
class TrajectoryCollected(Event):
    """Fact: an actor collected a trajectory fragment with the policy ``policy_version``.

    ``stream``, ``seq`` and ``offset`` number it on the actor's stream (``tianji.rl.books``:
    the receiver tells gaps and duplicates from them); ``stream == 0``: not numbered."""

    actor: str
    policy_version: int
    arrays: dict[str, np.ndarray]
    stream: int = 0
    seq: int = 0
    offset: int = 0


@event
class ParamsPublished(Event):
    """Fact: the learner published weights; ``policy_version`` is their version."""

    policy_version: int
    weights: dict[str, np.ndarray]


@event
class CheckpointTaken(Event):
    """Fact: learner-0 packed its whole state (``tianji.rl.checkpoint.pack_state`` bytes as a
    uint8 array) at ``policy_version``; the run's monitor writes it into the run directory."""

    policy_version: int
    state: np.ndarray


@event
class TakeCheckpoint(Event):
    """Command learner-0 to take a checkpoint now (the run is about to stop cleanly)."""

    reason: str


@event
class RestoreCheckpoint(Event):
    """Command a (resumed) learner to continue from this packed state at ``policy_version``
    (sent by the run's monitor to every learner that subscribes)."""

    policy_version: int
    state: np.ndarray


@event
class AdoptState(Event):
    """Command a learner of a population member (a PBT exploit, :mod:`tianji.rl.pbt`): load
    ``source``'s packed state (weights, optimizer, normalizers; taken at its
    ``source_version``), set the perturbable ``hyperparameters``, and publish the result as
    its own next version (its version count goes on: its actors' books stay whole)."""

    source: str
    source_version: int
    state: np.ndarray
    hyperparameters: dict[str, float]


@event
class EpisodesFinished(Event):
    """Fact: an actor's envs finished episodes (training episodes, exploration on)."""

    actor: str
    policy_version: int
    returns: np.ndarray
    lengths: np.ndarray
    env_steps: int


@event
class PolicyEvaluated(Event):
    """Fact: an evaluation worker played ``returns.size`` episodes with the weights of
    ``policy_version`` (greedy unless ``[eval] explore``), apart from training."""

    worker: str
    policy_version: int
    returns: np.ndarray
    lengths: np.ndarray
    opponent: str = ""
    """Self-play: the fixed opponent the games were played against (returns: outcomes)."""


@event
class ComputeActions(Event):
    """Command the inference service to compute actions for an actor's observations.

    ``env_ids`` are the actor's indices of the envs whose observations these are and
    ``starts`` marks the envs whose episode begins with this observation: the service
    keeps per-env state (a recurrent policy's hidden state) by them."""

    actor: str
    request_id: int
    obs: np.ndarray
    env_ids: np.ndarray
    starts: np.ndarray


@event
class ActionsComputed(Event):
    """Fact: the inference service computed ``arrays`` (``action`` + extras) for a request."""

    actor: str
    request_id: int
    policy_version: int
    arrays: dict[str, np.ndarray]


@event
class BatchRequested(Event):
    """Fact: ``learner`` requested batches, a credit for a buffer: ``count`` is the total
    number of sample batches it has asked for since it started (cumulative, so repeating a
    request is harmless and a lost one is made good by the next).

    ``learner_version`` lets the buffer drop samples older than ``max_policy_lag``.
    ``buffer`` names the shard the credit is for (``""``: any buffer that serves
    ``learner``); with several shards the count is per shard. ``received``: the batches the
    learner got from that shard so far, so a restarted buffer that first hears of the
    learner owes it only ``count - received``.
    """

    learner: str
    count: int
    learner_version: int
    buffer: str = ""
    received: int = 0


@event
class SampleBatch(Event):
    """Fact: a buffer handed out a batch; ``policy_versions`` are the samples' versions;
    ``buffer`` is the shard it came from (priorities for its slots go back there)."""

    batch_id: int
    policy_version: int
    arrays: dict[str, np.ndarray]
    policy_versions: np.ndarray
    buffer: str = ""
    stream: int = 0
    """``stream``, ``seq``, ``offset``: its number on the buffer's stream to this learner
    (``tianji.rl.books``); 0: not numbered."""
    seq: int = 0
    offset: int = 0


@event
class PrioritiesUpdated(Event):
    """Fact: the learner computed new priorities for sampled replay slots."""

    policy_version: int
    indices: np.ndarray
    priorities: np.ndarray


@event
class GradientsShared(Event):
    """Fact: data-parallel learner ``learner`` (``index`` of K) computed its flat float32
    gradient ``grads`` for all-reduce step ``step`` (steps count optimizer steps from 0).

    ``digest`` is a hash of its weights before the step (checked by the peers), or ``""``
    on steps where it is not checked.
    """

    learner: str
    index: int
    step: int
    grads: np.ndarray
    digest: str


@event
class RendezvousOffered(Event):
    """Fact: data-parallel learner-0 hosts the gradient collective's rendezvous store at
    ``host:port`` for group ``generation``, with ``backend`` (``"gloo"`` or ``"nccl"``);
    the other learners join it (:mod:`tianji.services.collective`). A late subscriber gets
    it at once."""

    learner: str
    host: str
    port: int
    backend: str
    generation: int


@event
class SnapshotTaken(Event):
    """Fact (self-play): the parameter service froze the weights of ``policy_version`` as a
    league snapshot (``[selfplay] snapshot_every``); actors play against them, the league
    rates them. A late subscriber gets every snapshot still in the pool."""

    policy_version: int
    weights: dict[str, np.ndarray]


@event
class GamesPlayed(Event):
    """Fact (self-play): an actor's games that ended: game ``i`` was played against
    ``opponents[i]`` (a snapshot id ``v<version>``, or ``random`` before the first
    snapshot) from ``seats[i]`` (0: first), and the learner scored ``outcomes[i]`` (+1
    win, 0 draw, -1 loss) with the weights of ``policy_version``."""

    actor: str
    policy_version: int
    opponents: tuple[str, ...]
    seats: np.ndarray
    outcomes: np.ndarray


@event
class DrawOpponents(Event):
    """Command (self-play): draw each game's opponent with these probabilities (snapshot
    id -> probability, summing to 1), from the league's ratings; ``ratings`` are the
    snapshots' ratings, for the record."""

    probabilities: dict[str, float]
    ratings: dict[str, float]
