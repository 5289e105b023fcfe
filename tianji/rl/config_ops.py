"""The run config's sections on how a run is kept alive and placed: ``[checkpoint]``
(learner checkpoints), ``[recovery]`` (what happens when a service dies) and ``[ray]``
(placement on Ray). :class:`~tianji.rl.config.RunConfig` holds them with the others."""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import types
import typing
from collections.abc import Sequence
from typing import Any

from tianji.runtime.aggregation import DEFAULT_FLUSH_INTERVAL
from tianji.runtime.errors import ConfigError

__all__ = [
    "check_value",
    "BUFFER_ON_RESTART",
    "CheckpointConfig",
    "LEARNER_ON_DEATH",
    "RAY_DEFAULT_CPUS",
    "RAY_ROLES",
    "RESTARTABLE_ROLES",
    "RESTARTS",
    "RESTART_PERIOD_S",
    "RayConfig",
    "RecoveryConfig",
    "positive",
]


def positive(section: str, obj: object, names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming ``section.name`` for the first of ``obj``'s
    attributes ``names`` below 1."""
    for name in names:
        value = getattr(obj, name)
        if value < 1:
            raise ConfigError(f"{section}.{name}", value, "an integer >= 1")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    """``[checkpoint]``: learner checkpoints into the run directory (``tianji.rl.checkpoint``).

    Learner-0 takes one when either trigger fires (0 turns a trigger off); none are taken
    without a run directory (``run_dir = ""``)."""

    every_updates: int = 0
    """Every this many learner updates."""
    every_seconds: float = 60.0
    """At most this many seconds apart (counted from the learner's start)."""
    keep: int = 3
    """Newest checkpoints kept; older ones are deleted once a new one is written."""
    replay: bool = False
    """Also snapshot every replay buffer shard (same triggers, the newest one kept as
    ``replay-buffer-<s>.tjc``), so a resumed off-policy run keeps its data; the snapshot
    holds every stored transition (size: capacity x transition bytes)."""

    def __post_init__(self) -> None:
        if self.every_updates < 0:
            raise ConfigError("checkpoint.every_updates", self.every_updates, "an int >= 0")
        if not 0 <= self.every_seconds < float("inf"):
            raise ConfigError("checkpoint.every_seconds", self.every_seconds, "seconds >= 0")
        positive("checkpoint", self, ("keep",))

    @property
    def enabled(self) -> bool:
        return self.every_updates > 0 or self.every_seconds > 0


RESTARTABLE_ROLES = ("actor", "inference", "buffer", "eval", "params", "relay", "aggregator")
LEARNER_ON_DEATH = ("stop", "resume")
BUFFER_ON_RESTART = ("empty", "snapshot")
RESTARTS = 5
"""Restarts a service may have within ``[recovery] period_s`` unless its role says otherwise."""
RESTART_PERIOD_S = 50.0
"""``[recovery] period_s``'s default. With the restart backoff (1, 2, 4, ... <= 30 s, doubled
over deaths less than 30 s after a start), 5 restarts within 50 s survive a kill -9 of a
random running service every 10 s (or every 7 s) for as long as the run lasts: the backoff
keeps any one service below 6 deaths in 50 s, whatever the kills' order. A service that dies
right after every start is stopped at its 6th death, 31 s of backoff after its first (41 s
when each start takes 2 s); docs/architecture.md, "Faults"; benchmarks/restart_intensity.py."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryConfig:
    """``[recovery]``: what the launcher does when a service dies (its process exits, or it
    misses ``missed_heartbeats`` heartbeats in a row and is killed)."""

    restarts: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(RESTARTABLE_ROLES, RESTARTS)
    )
    """Restarts each service of a role may have within ``period_s``, e.g. ``{actor = 5,
    buffer = 1}``; roles left out keep 5; 0 turns restarts of the role off (its death ends
    the run). The learner's count applies with ``learner = "resume"`` only. A death that
    would be a service's next restart beyond this count within the period ends the run,
    naming the service, the count and the period."""
    period_s: float = RESTART_PERIOD_S
    """Seconds over which a service's restarts are counted (a sliding window, as an OTP
    supervisor's restart intensity); ``inf``: over the whole run."""
    backoff: float = 1.0
    """Seconds before a service's first restart; doubled for each further one that follows a
    death less than thirty seconds after a start (at most thirty seconds): a crash loop
    backs off, a service that lived longer comes back after ``backoff`` again."""
    missed_heartbeats: int = 5
    """A registered service silent for this many heartbeat intervals (one second each) is
    declared dead and killed (then restarted like one that exited)."""
    learner: str = "stop"
    """A dead learner: ``stop`` ends the run (non-zero exit, naming it); ``resume`` restarts
    it from the newest checkpoint (needs a run directory). With ``[learner] count`` K > 1
    the K learners restart together: the death of one kills the others, and all K resume
    from the same checkpoint (their weights must stay identical)."""
    buffer: str = "empty"
    """A restarted replay buffer starts ``empty`` or from its ``snapshot`` (needs
    ``[checkpoint] replay``); what it held is counted as ``dropped/lost_in_restart``."""

    def __post_init__(self) -> None:
        for role, count in self.restarts.items():
            if role not in (*RESTARTABLE_ROLES, "learner"):
                roles = [*RESTARTABLE_ROLES, "learner"]
                raise ConfigError(f"recovery.restarts.{role}", count, f"a role of {roles}")
            if type(count) is not int or count < 0:
                raise ConfigError(f"recovery.restarts.{role}", count, "an int >= 0")
        if not self.period_s > 0:  # also refuses NaN
            raise ConfigError("recovery.period_s", self.period_s, "seconds > 0 (inf: the run)")
        if not 0 <= self.backoff <= 60:
            raise ConfigError("recovery.backoff", self.backoff, "0 .. 60 s")
        positive("recovery", self, ("missed_heartbeats",))
        if self.learner not in LEARNER_ON_DEATH:
            raise ConfigError("recovery.learner", self.learner, " | ".join(LEARNER_ON_DEATH))
        if self.buffer not in BUFFER_ON_RESTART:
            raise ConfigError("recovery.buffer", self.buffer, " | ".join(BUFFER_ON_RESTART))

    def limit(self, role: str) -> int:
        """Restarts a service of ``role`` may have within ``period_s`` (the learner's
        applies only with ``learner = "resume"``; otherwise its death ends the run)."""
        if role == "learner":
            return self.restarts.get(role, RESTARTS) if self.learner == "resume" else 0
        return self.restarts.get(role, RESTARTS) if role in RESTARTABLE_ROLES else 0


RAY_ROLES = ("actor", "buffer", "learner", "params", "inference", "eval", "relay", "aggregator")
RAY_DEFAULT_CPUS = {
    "actor": 0.5, "learner": 0.5, "buffer": 0.2, "params": 0.1, "inference": 0.2, "eval": 0.1,
    "relay": 0.01, "aggregator": 0.01,
}  # fmt: skip
"""CPUs per service of each role on Ray: two actors, learner, buffer and params take 1.8,
so a run of the examples fits a 2-CPU machine (Ray counts reservations, not use). A params
relay and a heartbeat aggregator reserve a token 0.01 (Ray places an actor that reserves
nothing on any node, whatever node it is asked for)."""
AGGREGATE_FROM = 1000
"""``ray.aggregate_from``'s default: the run size (services) from which each node gets a
heartbeat aggregator (``tianji bench scale``'s control rows measure 1,000 services with
and without them)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RayConfig:
    """Placement on Ray (``tianji train --backend ray``): where, and what each role reserves."""

    address: str | None = None
    """Ray cluster to join (``HOST:6379``, ``auto``); none: start a local Ray instance for the
    run (or join ``RAY_ADDRESS`` when set). ``--ray-address`` sets it."""
    num_cpus: dict[str, float] = dataclasses.field(default_factory=dict)
    """CPUs each service of a role reserves, e.g. ``{learner = 1}``; roles not given keep
    :data:`RAY_DEFAULT_CPUS`."""
    num_gpus: dict[str, float] = dataclasses.field(default_factory=dict)
    """GPUs each service of a role reserves (default 0), e.g. ``{learner = 1}`` to place
    the learner on a GPU node; its ``learner.device = "auto"`` then picks CUDA."""
    custom_resources: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """Custom Ray resources each service of a role reserves: node affinity, e.g.
    ``{learner = {trainer = 1}}`` places the learner on a node started with
    ``ray start --resources '{"trainer": 4}'``."""
    relays: bool = True
    """On a cluster of several nodes, start a params relay on each node that hosts actors,
    inference services or eval workers but not their params service, so each new version
    of the weights crosses to a node once (``tianji.launch.ray_nodes``)."""
    aggregate_from: int = AGGREGATE_FROM
    """Once the run has this many services, start a heartbeat aggregator on each node that
    hosts any (``tianji.runtime.aggregator``): the node's services send it their heartbeats
    and it sends the controller one batch of them per flush interval, so the controller's
    cost grows with nodes, not services; a heartbeat then reaches the controller up to one
    flush interval later. 0: never; 1: always."""
    aggregate_flush_s: float = DEFAULT_FLUSH_INTERVAL
    """An aggregator's flush interval: the longest a heartbeat waits there. Longer batches
    cost the controller less (fewer messages and decisions) and delay what it sees of the
    run."""

    def __post_init__(self) -> None:
        if self.address is not None and not self.address.strip():
            raise ConfigError("ray.address", self.address, "HOST:PORT, 'auto' or no value")
        if type(self.aggregate_from) is not int or self.aggregate_from < 0:
            raise ConfigError("ray.aggregate_from", self.aggregate_from, "an int >= 0")
        flush = self.aggregate_flush_s
        if type(flush) not in (int, float) or not 0 < flush < float("inf"):
            raise ConfigError("ray.aggregate_flush_s", flush, "a number of seconds > 0")
        for key in ("num_cpus", "num_gpus"):
            for role, value in getattr(self, key).items():
                if role not in RAY_ROLES:
                    raise ConfigError(f"ray.{key}.{role}", value, f"a role of {list(RAY_ROLES)}")
                if type(value) not in (int, float) or not 0 <= value < float("inf"):
                    raise ConfigError(f"ray.{key}.{role}", value, "a number >= 0")
        for role, wanted in self.custom_resources.items():
            key = f"ray.custom_resources.{role}"
            if role not in RAY_ROLES:
                raise ConfigError(key, wanted, f"a role of {list(RAY_ROLES)}")
            if not isinstance(wanted, dict):
                raise ConfigError(key, wanted, "a table of resource names and amounts")
            for name, value in wanted.items():
                if name in ("CPU", "GPU") or not isinstance(name, str) or not name:
                    raise ConfigError(f"{key}.{name}", value, "a custom resource name")
                if type(value) not in (int, float) or not 0 < value < float("inf"):
                    raise ConfigError(f"{key}.{name}", value, "a number > 0")

    def resources(self, role: str) -> tuple[float, float]:
        """(CPUs, GPUs) a service of ``role`` reserves; unknown roles (e.g. a demo's
        ``producer``) reserve the actors' CPUs and no GPU."""
        cpus = self.num_cpus.get(role, RAY_DEFAULT_CPUS.get(role, RAY_DEFAULT_CPUS["actor"]))
        return float(cpus), float(self.num_gpus.get(role, 0.0))

    def custom(self, role: str) -> dict[str, float]:
        """The custom resources a service of ``role`` reserves (none by default)."""
        return {k: float(v) for k, v in self.custom_resources.get(role, {}).items()}


def check_value(key: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against a field annotation; ints are accepted for floats."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        last: ConfigError | None = None
        for option in typing.get_args(hint):
            try:
                return check_value(key, value, option)
            except ConfigError as exc:  # the next option may fit
                last = exc
        raise ConfigError(key, value, str(hint)) from last
    if hint is Any:
        return value
    if hint is type(None):
        if value is None:
            return None
        raise ConfigError(key, value, "null")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise ConfigError(key, value, " | ".join(str(m.value) for m in hint)) from None
    if hint is float and type(value) in (int, float):
        return float(value)
    if origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(key, value, "a table")
    if origin in (list, tuple, collections.abc.Sequence):
        if isinstance(value, (list, tuple)):
            items = [
                check_value(f"{key}[]", v, (typing.get_args(hint) or (Any,))[0]) for v in value
            ]
            return list(items) if origin is list else tuple(items)
        raise ConfigError(key, value, "an array")
    if isinstance(hint, type) and type(value) is hint:
        return value
    raise ConfigError(key, value, getattr(hint, "__name__", str(hint)))
