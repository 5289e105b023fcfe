"""The heartbeat counters and gauges that cross process boundaries, declared once.

A service reports ``counters`` (cumulative integers) and ``gauges`` (current values) in
its heartbeats; the controller's balancer, the progress line, the run summary, the
dashboard and the recovery code read them. Every name that one process writes and
another reads is declared here, per role, and used by both sides through these constants
(``tests/test_stats_contract.py`` fails on such a name spelled as a string literal
anywhere else). A service's private counters (e.g. ``link_reconnects``) stay literals in
the one file that writes them; the summary shows them as they are.

Flow control, and which counter says what happened (see ``docs/architecture.md``, "One
flow-control contract"): actors count what they produce, buffers what they insert, send,
evict and drop, learners what they receive, consume and drop; every sample ends in exactly
one of consumed, dropped (``dropped/<reason>``), buffered or held, which
:func:`tianji.services.balancer.accounting` checks.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ActorStat",
    "BookStat",
    "BufferStat",
    "DROPPED",
    "Dropped",
    "EvalStat",
    "InferenceStat",
    "LeagueStat",
    "LearnerStat",
    "MonitorStat",
    "ParamsStat",
]

DROPPED: Final = "dropped/"
"""Prefix of every drop counter: ``dropped/<reason>``, in any role."""


class Dropped:
    """The reasons a sample is dropped (counter ``dropped/<reason>``)."""

    STALE: Final = "dropped/stale"
    """Older than ``learner.max_policy_lag`` versions when it would be consumed."""
    EVICTED: Final = "dropped/evicted"
    """Pushed out of a full buffer before it was consumed."""
    LOST_IN_RESTART: Final = "dropped/lost_in_restart"
    """Held by a service that died (counted on its retired incarnation)."""
    SHUTDOWN: Final = "dropped/shutdown"
    """Held by a learner when the run stopped."""
    UNSENT: Final = "dropped/unsent"
    """A fragment an actor (or a rollout batch a buffer) could not deliver."""
    LOST_IN_TRANSIT: Final = "dropped/lost_in_transit"
    """Sent and never received: a gap in a stream's numbers at the receiver."""


class BookStat:
    """The two-ended sample books (:mod:`tianji.rl.books`): what senders and receivers of
    numbered streams report, in any role."""

    SENT: Final = "sent/"
    """Gauge ``sent/<stream>``: samples a sender sent on one of its streams."""
    RECV: Final = "recv/"
    """Gauge ``recv/<sender>/<stream>``: the offset up to which a receiver has a stream."""
    JOIN: Final = "join/"
    """Gauge ``join/<sender>/<stream>``: the offset where a receiver joined a stream."""
    RECEIVED: Final = "samples_received"
    """Samples (or draws) a receiver took from streams (buffer and learner)."""
    DUPLICATES: Final = "duplicates_discarded"
    """Messages a receiver discarded as duplicates (numbered before what it had)."""
    UNNUMBERED: Final = "unnumbered_received"
    """Samples received in messages without stream numbers (made by hand, not by tianji)."""
    DRAWS_LOST: Final = "draws_lost_in_transit"
    """Off-policy: replay draws sent and never received (copies: no sample lost)."""
    DRAWS_UNUSED: Final = "draws_unused"
    """Off-policy: replay draws a learner received and never used (it stopped)."""
    DRAWS_UNSENT: Final = "draws_unsent"
    """Off-policy: replay draws a buffer could not deliver."""


class ActorStat:
    """What an actor reports."""

    ENV_STEPS: Final = "env_steps"
    SAMPLES_PRODUCED: Final = "samples_produced"
    SAMPLES_SENT: Final = "samples_sent"
    """Samples of fragments delivered to a buffer's link (numbered on the stream)."""
    FRAGMENTS_SENT: Final = "fragments_sent"
    PARAMS_TORN: Final = "params_torn"
    """Weights loaded from the params board while the board overwrote them (newer ones were
    published meanwhile): not used; the actor waits for the newer version."""
    PARAMS_SUPERSEDED: Final = "params_superseded"
    """Weights received while waiting for a grant and overwritten on the params board
    before the grant came: not loaded; the actor asks for the newest."""
    EPISODES: Final = "episodes"
    RANDOM_STEPS: Final = "random_steps"
    """Env steps acted uniformly at random (the algorithm's ``random_steps`` warm-up)."""
    GAMES: Final = "games"
    """Self-play: games that ended (against league snapshots, or ``random`` before one)."""
    SNAPSHOTS_HELD: Final = "snapshots_held"
    """Self-play (gauge): league snapshots it can play against."""
    ALGO_PREFIX: Final = "algo/"
    """Gauges ``algo/<name>``: what the algorithm's ``actor_metrics()`` reported after the
    actor's last fragment."""
    # gauges
    POLICY_VERSION: Final = "policy_version"
    """The version of the weights it acts with."""
    FRAGMENTS_AT_VERSION: Final = "fragments_at_version"
    PAUSED_S: Final = "paused_s"
    SENDING: Final = "sending"
    """Samples of the fragment being published now (produced, not yet sent or unsent)."""
    WAITING: Final = "waiting"
    """1.0 while it waits for a grant, weights or a resume (produces nothing)."""
    GRANT_LIMIT: Final = "grant_limit"
    GRANT_MIN_VERSION: Final = "grant_min_version"


class BufferStat:
    """What a buffer (replay or rollout) reports."""

    SAMPLES_RECEIVED: Final = "samples_received"
    """Samples taken from actors' streams (duplicates discarded, gaps counted lost)."""
    SAMPLES_INSERTED: Final = "samples_inserted"
    SAMPLES_SENT: Final = "samples_sent"
    """Samples delivered to learners (on-policy: taken out; replay: draws)."""
    SAMPLES_RESTORED: Final = "samples_restored"
    BATCHES_SENT: Final = "batches_sent"
    # gauges
    BUFFERED_SAMPLES: Final = "buffered_samples"
    """Samples it holds now (lost if it dies)."""
    SENDING: Final = "sending"
    """On-policy: samples of the batch being published now (taken out, not yet sent)."""
    READY: Final = "ready"
    """1.0 once it holds ``min_size`` samples (0.0 while filling)."""
    SIZE: Final = "size"


class LearnerStat:
    """What a learner reports."""

    LEARNER_UPDATES: Final = "learner_updates"
    """Updates done: the policy version of its weights."""
    SAMPLES_RECEIVED: Final = "samples_received"
    SAMPLES_CONSUMED: Final = "samples_consumed"
    LAG_SUM: Final = "lag_sum"
    LAG_MAX: Final = "lag_max"
    LAG_PREFIX: Final = "lag/"
    """``lag/<k>``: samples consumed k versions after they were produced."""
    CHECKPOINTS_TAKEN: Final = "checkpoints_taken"
    LR_ZERO_AT_UPDATE: Final = "lr_zero_at_update"
    PBT_ADOPTED: Final = "pbt/adopted"
    """Population runs: other members' states adopted (PBT exploits, ``AdoptState``)."""
    PBT_ADOPT_FAILED: Final = "pbt/adopt_failed"
    """Population runs: ``AdoptState`` commands whose state did not load (logged)."""
    # gauges
    HELD_SAMPLES: Final = "held_samples"
    """Samples received and not yet consumed or dropped (lost if it dies)."""
    PARAMS_VERSION: Final = "params_version"
    """The newest version it published."""
    SNAPSHOTS: Final = "snapshots"
    """Self-play: league snapshots taken (``[selfplay] snapshot_every``)."""
    HYPERPARAMETER_PREFIX: Final = "hp/"
    """``hp/<name>``: a hyperparameter's value since the last PBT exploit it adopted."""
    CONSUME_LIMIT: Final = "consume_limit"
    WAITING_S: Final = "waiting_s"
    """Seconds spent waiting for the controller's consumption grant."""
    IDLE_S: Final = "idle_s"
    """Seconds spent waiting for a batch."""
    UPDATE_S: Final = "update_s"
    """Seconds spent in updates."""
    POLICY_LAG_MEAN: Final = "policy_lag_mean"


class InferenceStat:
    """What an inference service reports."""

    REQUESTS: Final = "requests"
    """Requests answered."""
    FORWARD_PASSES: Final = "forward_passes"
    ENVS_ANSWERED: Final = "envs_answered"
    """Observations answered (the rows of all requests)."""
    REQUESTS_MALFORMED: Final = "requests_malformed"
    """Requests refused (wrong observation shape or dtype, mismatched env ids)."""
    PARAMS_TORN: Final = "params_torn"
    """Weights overwritten on the params board while they were loaded: not used."""
    ANSWERS_LATE: Final = "answers_late"
    """Answers held until the asking actor's subscription link came up (at start-up or after
    a reconnect), then delivered."""
    ANSWERS_UNDELIVERED: Final = "answers_undelivered"
    """Answers dropped because the asking actor had no link to this service for
    ``ANSWER_WAIT_S`` seconds (it left or cannot reach us)."""
    # gauges
    REQUESTS_PER_PASS: Final = "requests_per_pass"
    ENVS_PER_PASS: Final = "envs_per_pass"
    FORWARD_S: Final = "forward_s"
    """Seconds spent in forward passes."""
    INLINE: Final = "inline"
    """1.0 while forward passes run inline on the event loop (cheaper than a thread hand-off)."""


class EvalStat:
    """What an evaluation worker reports."""

    EVALUATIONS: Final = "evaluations"
    EPISODES: Final = "eval_episodes"
    ENV_STEPS: Final = "eval_env_steps"
    """Env steps of evaluation episodes (not counted as the run's env steps)."""
    PARAMS_TORN: Final = "params_torn"
    """Weights overwritten on the params board while they were loaded: not used."""
    # gauges
    RETURN: Final = "eval_return"
    """Mean return of the newest evaluation."""
    POLICY_VERSION: Final = "eval_policy_version"
    EVAL_S: Final = "eval_s"
    """Seconds spent playing evaluation episodes."""


class MonitorStat:
    """What the run's monitor reports (read by the run summary)."""

    CHECKPOINTS_WRITTEN: Final = "checkpoints_written"
    CHECKPOINT_ERRORS: Final = "checkpoint_errors"


class ParamsStat:
    """What the parameter service reports."""

    PARAMS_VERSION: Final = "params_version"
    SNAPSHOTS: Final = "snapshots"
    """Self-play: league snapshots taken (``[selfplay] snapshot_every``)."""


class LeagueStat:
    """What the self-play league reports (:mod:`tianji.services.league`)."""

    SNAPSHOTS: Final = "league_snapshots"
    """Snapshots that entered the league."""
    GAMES_RATED: Final = "games_rated"
    """Games the league rated."""
    GAMES_UNRATED: Final = "games_unrated"
    """Games against a snapshot the league never saw (e.g. it restarted): not rated."""
    GAMES_LIVE: Final = "games_live"
    """Live games, against the learner's own current weights (``live_prob``): not rated."""
    # gauges
    LEARNER_RATING: Final = "learner_rating"
    NEWEST_RATING: Final = "newest_rating"
    """The newest snapshot's rating."""
