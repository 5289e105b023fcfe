"""Run configuration: small frozen dataclasses, one per section (loaded from TOML with
``--set`` overrides by :mod:`tianji.run.config`).

A run config file looks like ``examples/cartpole_ppo.toml``::

    algorithm = "ppo"
    seed = 0
    transport = "tcp"          # inproc (one process) | tcp | shm

    [env]
    id = "CartPole-v1"

    [actors]
    count = 2
    envs_per_actor = 4
    fragment_length = 128

    [algo]                     # the algorithm's own Config fields
    learning_rate = 2.5e-4

Unknown keys are errors naming the key and the allowed ones; values are type-checked.
The ``[checkpoint]``, ``[recovery]`` and ``[ray]`` sections are in
:mod:`tianji.rl.config_ops`.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import typing
from collections.abc import Mapping
from typing import Any

from tianji.rl.config_ops import (
    CheckpointConfig,
    RayConfig,
    RecoveryConfig,
    check_value,
    positive,
)
from tianji.rl.league import SelfPlayConfig
from tianji.rl.pbt import PopulationConfig
from tianji.rl.tactics import check_game_tactics
from tianji.runtime.errors import ConfigError

__all__ = [
    "ActorConfig",
    "ControllerConfig",
    "EnvConfig",
    "InferenceConfig",
    "LearnerConfig",
    "Mode",
    "RunConfig",
    "StopConfig",
    "build_dataclass",
    "to_dict",
]


PRESETS = ("", "atari", "mujoco")
"""The values of ``[env] preset``."""
APIS = ("gymnasium", "pettingzoo", "two_player")
"""The values of ``[env] api``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnvConfig:
    """Which environment the actors step."""

    id: str = "CartPole-v1"
    """A gymnasium id, or ``package.module:Class`` / ``path/file.py:Class`` of an env class;
    with ``api = "pettingzoo"`` a PettingZoo env module (``"mpe2.simple_spread_v3"``, its
    ``parallel_env`` is called) or ``module:callable`` returning a parallel env."""
    api: str = "gymnasium"
    """"gymnasium" (one agent), "pettingzoo" (a cooperative multi-agent parallel env, seen
    as one env with stacked agents: see ``tianji.rl.multiagent``) or "two_player" (a
    two-player PettingZoo AEC game module such as ``"pettingzoo.classic.connect_four_v3"``,
    learned by self-play: see ``[selfplay]`` and ``tianji.rl.selfplay``)."""
    team_reward: str = "sum"
    """Multi-agent envs: the team reward is the "sum" or "mean" of the agents' rewards."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env constructor."""
    wrappers: list[str] = dataclasses.field(default_factory=list)
    """Wrappers applied in order, each ``module:Class`` (e.g.
    ``"gymnasium.wrappers:TimeAwareObservation"``), called as ``Class(env)``."""
    preset: str = ""
    """A standard env setup: ``"atari"`` (an ``ALE/<Game>-v5`` id with the usual
    preprocessing, see ``tianji.rl.atari``), ``"mujoco"`` (a gymnasium MuJoCo id such as
    ``HalfCheetah-v5`` with its standard time limit, see ``tianji.rl.mujoco``) or "" (the env
    as made, plus ``wrappers``)."""
    preset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The preset's options (``"atari"``: the fields of ``tianji.rl.atari.AtariOptions``;
    ``"mujoco"``: of ``tianji.rl.mujoco.MujocoOptions``)."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError("env.preset", self.preset, " | ".join(f'"{p}"' for p in PRESETS))
        if self.preset_options and not self.preset:
            raise ConfigError("env.preset_options", self.preset_options, "empty without a preset")
        if self.preset and self.api != "gymnasium":
            raise ConfigError("env.preset", self.preset, f'"" with api = "{self.api}"')
        if self.api not in APIS:
            raise ConfigError("env.api", self.api, " | ".join(f'"{a}"' for a in APIS))
        if self.team_reward not in ("sum", "mean"):
            raise ConfigError("env.team_reward", self.team_reward, '"sum" or "mean"')


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ActorConfig:
    """Actor processes and what each collects."""

    count: int = 2
    """Actor services (one process each)."""
    envs_per_actor: int = 4
    """Environments each actor steps as one vector env."""
    fragment_length: int = 128
    """Steps per env in one trajectory fragment sent to the buffer."""
    inference: str = "local"
    """"local": each actor runs its own policy copy; "service": one inference service
    batches the observations of all actors into one forward pass and answers each."""
    splits: int = 1
    """Groups of envs per actor (an env ring): with ``inference = "service"`` one group
    steps its envs while another waits for its actions. ``envs_per_actor`` must be a
    multiple of it."""
    torch_threads: int = 1
    """torch intra-op threads of each actor's local policy (more only pays for a large
    network, e.g. a CNN, with cores to spare)."""

    def __post_init__(self) -> None:
        counts = ("count", "envs_per_actor", "fragment_length", "splits", "torch_threads")
        positive("actors", self, counts)
        if self.envs_per_actor % self.splits:
            why = f"a divisor of actors.envs_per_actor={self.envs_per_actor}"
            raise ConfigError("actors.splits", self.splits, why)
        if self.inference not in ("local", "service"):
            raise ConfigError("actors.inference", self.inference, '"local" or "service"')


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InferenceConfig:
    """The inference services of ``[actors] inference = "service"`` runs."""

    count: int = 1
    """Inference services; actor ``i`` asks service ``i % count``."""
    max_wait_ms: float = 1.0
    """After the first request of a batch, wait at most this long for more."""
    batch_requests: int = 0
    """Requests a batch waits for (up to ``max_wait_ms``); 0: one per actor assigned to the
    service (with ``splits = K`` the other groups are stepping meanwhile)."""
    max_batch_envs: int = 0
    """At most this many observations per forward pass (0: no limit)."""
    offload_above_ms: float = 0.5
    """A forward pass runs in a worker thread (the event loop keeps receiving and replying)
    when a pass over 8 observations takes longer than this; cheaper ones (a small MLP) run
    inline, where the thread hand-off would cost more than the pass. 0: always the thread."""
    device: str = "auto"
    """Torch device of the forward pass ("auto": CUDA when available)."""
    torch_threads: int = 1
    """Torch intra-op threads of each inference service."""

    def __post_init__(self) -> None:
        positive("inference", self, ("count", "torch_threads"))
        for key in ("max_wait_ms", "offload_above_ms"):
            if getattr(self, key) < 0:
                raise ConfigError(f"inference.{key}", getattr(self, key), "a number >= 0")
        for key in ("batch_requests", "max_batch_envs"):
            if type(getattr(self, key)) is not int or getattr(self, key) < 0:
                raise ConfigError(f"inference.{key}", getattr(self, key), "an int >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LearnerConfig:
    """The learner service."""

    torch_threads: int = 1
    """torch intra-op threads of the learner's updates."""
    inline_below_ms: float = 100.0
    """An off-policy learner without data-parallel peers runs its updates on its event
    loop's thread while they take less than this many milliseconds on average (a thread
    hand-off and a second OpenMP team cost short updates more than they save); past it, or
    after one update over a second, they move to a worker thread for the rest of the run
    (``tianji.services.update_runner``). On-policy updates (epochs over a rollout) always
    run in the worker thread. 0: always the thread."""
    device: str = "auto"
    """"auto" (CUDA when available), "cpu", "cuda", "cuda:1", ..."""
    prefetch: int = 2
    """Sample batches requested ahead from the buffer."""
    publish_interval: int | None = None
    """Publish weights every this many updates. Unset: every update for on-policy runs
    (each update is a policy version the actors wait for); for off-policy runs the
    updates one actor fragment pays for (``replay_ratio`` x fragment samples / batch size,
    at least 1), so an actor starts each fragment with fresh weights and nobody encodes,
    sends and decodes weights that are replaced before use (see
    :func:`tianji.rl.balance.publish_every`)."""
    max_policy_lag: int = 4
    """On-policy: samples older than this many policy versions are dropped (reason stale)."""
    count: int = 1
    """Data-parallel learners (K): each samples its own batches, they average gradients every
    optimizer step and so hold identical weights; learner-0 publishes them."""
    sync_timeout: float = 60.0
    """Seconds a learner waits at a gradient all-reduce step for its peers (K > 1), and
    for the group to form, before it fails naming the peers and the step."""
    allreduce: str = "auto"
    """K > 1: how the learners average gradients. "collective": PyTorch's process group
    (gloo; NCCL when learner-0 computes on CUDA); "transport": each learner publishes its
    gradient to the others over tianji's transports (no per-call latency, K - 1 copies);
    "auto": the collective on CUDA or when (K - 1) x parameters >= 2 M, else the transport
    (the faster one in ``docs/scaling.md``)."""
    rendezvous_port: int = 0
    """K > 1: the port learner-0's rendezvous store listens on (0: a free one). The learners
    of a hand deployment across hosts must reach it, and each other's gloo/NCCL ports."""

    def __post_init__(self) -> None:
        positive("learner", self, ("torch_threads", "prefetch", "count"))
        if not self.inline_below_ms >= 0:
            raise ConfigError("learner.inline_below_ms", self.inline_below_ms, "a number >= 0")
        if self.publish_interval is not None and self.publish_interval < 1:
            raise ConfigError("learner.publish_interval", self.publish_interval, "an int >= 1")
        if self.max_policy_lag < 0:
            raise ConfigError("learner.max_policy_lag", self.max_policy_lag, "an int >= 0")
        if not self.sync_timeout > 0:
            raise ConfigError("learner.sync_timeout", self.sync_timeout, "a number of seconds > 0")
        if self.allreduce not in ("auto", "collective", "transport"):
            expected = '"auto", "collective" or "transport"'
            raise ConfigError("learner.allreduce", self.allreduce, expected)
        if type(self.rendezvous_port) is not int or not 0 <= self.rendezvous_port <= 65535:
            raise ConfigError("learner.rendezvous_port", self.rendezvous_port, "a port 0..65535")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BufferConfig:
    """``[buffer]``: the replay / rollout buffer services."""

    shards: int = 1
    """Buffer services ``buffer-0..S-1``. Actor i publishes to shard ``i % S``; learner j
    samples from the shards ``s`` with ``s % K == j`` (S >= K) or from shard ``j % S``
    (S < K). Each shard holds its own ``buffer_capacity`` and waits for its own
    ``learning_starts`` samples."""

    def __post_init__(self) -> None:
        positive("buffer", self, ("shards",))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StopConfig:
    """When a run ends (whichever comes first)."""

    max_env_steps: int | None = None
    """Total env steps over all actors."""
    max_seconds: float | None = None
    """Wall-clock seconds since the run started."""
    target_return: float | None = None
    """Stop once the mean return of the last ``window`` training episodes reaches this."""
    window: int = 20
    """Episodes in the moving mean for ``target_return`` and ``final_return``."""
    on: str = "train"
    """What ``target_return`` is compared with: "train" (the moving mean of the training
    episodes' returns) or "eval" (the mean return of the newest evaluation; needs
    ``[eval] workers``)."""
    start_timeout: float = 45.0
    """Seconds after every service joined within which the first env step must arrive;
    otherwise the run stops as failed, naming the links that never came up (a publisher
    nobody can reach) or, when none failed, saying so (0: wait forever)."""

    def __post_init__(self) -> None:
        if not self.start_timeout >= 0:
            raise ConfigError("stop.start_timeout", self.start_timeout, "a number of seconds >= 0")
        if self.on not in STOP_ON:
            raise ConfigError("stop.on", self.on, " | ".join(f'"{x}"' for x in STOP_ON))


STOP_ON = ("train", "eval")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EvalConfig:
    """``[eval]``: evaluation workers, which play episodes with the newest weights, apart
    from training (greedy by default, on the env without training-only shaping, e.g. the
    Atari preset's episodic lives and reward clipping)."""

    workers: int = 0
    """Evaluation workers (0: none). Each evaluates on its own schedule, staggered, so more
    workers evaluate more often."""
    every_seconds: float = 10.0
    """A worker evaluates when this many seconds passed since its last evaluation (0: not
    by time) ..."""
    every_versions: int = 0
    """... or when the newest weights are this many policy versions past the ones it last
    evaluated (0: not by versions). Never twice the same version."""
    episodes: int = 10
    """Episodes per evaluation (the same reset seeds every time, so evaluations of
    different versions compare like with like)."""
    explore: bool = False
    """Sample actions as the actors do instead of taking the policy's mode."""
    env_id: str = ""
    """Evaluate on this env id instead of ``[env] id`` (wrappers and preset kept)."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the evaluation env instead of ``[env] kwargs``."""

    def __post_init__(self) -> None:
        if type(self.workers) is not int or self.workers < 0:
            raise ConfigError("eval.workers", self.workers, "an integer >= 0")
        if type(self.episodes) is not int or self.episodes < 1:
            raise ConfigError("eval.episodes", self.episodes, "a positive integer")
        if not self.every_seconds >= 0:
            raise ConfigError("eval.every_seconds", self.every_seconds, "seconds >= 0")
        if type(self.every_versions) is not int or self.every_versions < 0:
            raise ConfigError("eval.every_versions", self.every_versions, "an integer >= 0")
        if self.workers and not self.every_seconds and not self.every_versions:
            raise ConfigError(
                "eval.every_seconds", self.every_seconds, "> 0 when every_versions is 0"
            )

    def env(self, train: EnvConfig) -> EnvConfig:
        """The evaluation env: ``train`` with the id and kwargs replaced where given."""
        return dataclasses.replace(
            train,
            id=self.env_id or train.id,
            kwargs=dict(self.env_kwargs) if self.env_kwargs else dict(train.kwargs),
        )


class Mode(enum.StrEnum):
    """How the controller paces producers and learners (``[controller] mode``); only the
    balance policy (:mod:`tianji.rl.balance`) reads it."""

    RELAXED = "relaxed"
    """Asynchronous, balanced, staleness-bounded."""
    SYNC = "sync"
    """One version's worth of fragments per round; the learner waits for every actor."""
    UNBALANCED = "unbalanced"
    """Asynchronous with no limits (to measure what the balance buys)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    """How the controller balances production and consumption (see ``tianji.rl.balance``)."""

    mode: Mode = Mode.RELAXED
    """relaxed: asynchronous, balanced, staleness-bounded; sync: actors collect one
    fragment per policy version and the learner waits for every actor; unbalanced:
    asynchronous with no limits (to measure what the balance buys)."""
    replay_ratio: float | None = None
    """Off-policy, an override: samples the learner consumes per sample inserted. Unset: the
    algorithm's own ``updates_per_step`` x its batch size (its ``BufferSpec``), so an
    algorithm says what it needs in its own units (``[algo] updates_per_step``)."""
    tolerance: float | None = None
    """Off-policy: the allowed deviation of the consumed/inserted ratio from the replay
    ratio over one round of inserts (a fragment from every actor); over the run the ratio
    converges to it (an absolute error buffer, as Reverb's rate limiter). Unset: a quarter
    of the replay ratio."""
    max_collecting: int = 0
    """Producers that may collect at once (hold an unfinished grant). 0: for an off-policy
    run, as many as the CPU cores of the machine that plans the run (its learner shares
    them: 32 replay actors collecting together on 2 cores starve it); no bound for an
    on-policy run (``lag_target`` bounds what is outstanding). Set it for runs spread over
    hosts."""
    lag_target: int = 1
    """On-policy: a fragment is granted only with weights it will be consumed at most this
    many policy versions after (``learner.max_policy_lag`` is the hard bound: older samples
    are dropped as stale). 1 lets actors collect the next batch while the learner trains on
    the previous one."""
    report_interval: float = 0.01
    """Seconds between two progress reports of one service (they are sent on change)."""
    watchdog_seconds: float = 30.0
    """Seconds without a sample produced or consumed (while producers and learners are up)
    after which the controller logs who waits for what and the progress line, the summary
    and ``/api/status`` show the run as stalled (0: off)."""

    def __post_init__(self) -> None:
        if not self.watchdog_seconds >= 0:
            raise ConfigError(
                "controller.watchdog_seconds", self.watchdog_seconds, "a number of seconds >= 0"
            )
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise ConfigError("controller.mode", self.mode, " | ".join(Mode)) from None
        if self.max_collecting < 0:
            raise ConfigError("controller.max_collecting", self.max_collecting, "an int >= 0")
        if self.replay_ratio is not None and not self.replay_ratio > 0:
            raise ConfigError("controller.replay_ratio", self.replay_ratio, "a number > 0")
        if self.tolerance is not None and not 0 <= self.tolerance < (self.replay_ratio or 1e300):
            bound = "" if self.replay_ratio is None else f" < replay_ratio {self.replay_ratio}"
            raise ConfigError("controller.tolerance", self.tolerance, f"0 <= tolerance{bound}")
        if self.lag_target < 0:
            raise ConfigError("controller.lag_target", self.lag_target, "an int >= 0")
        if not 0 <= self.report_interval <= 1:
            raise ConfigError("controller.report_interval", self.report_interval, "0 .. 1 s")


RUN_DIR_ENV = "TIANJI_RUN_DIR"
"""The environment variable that sets the default ``run_dir``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """A whole training run."""

    algorithm: str = "ppo"
    """An algorithm name (``tianji.algorithms.names()``) or ``module:Class``."""
    seed: int = 0
    """Base seed; actor i uses seed + 1000 * (i + 1)."""
    transport: str = "tcp"
    """inproc (every service in one process), tcp or shm (one process per service)."""
    name: str = ""
    """Run name (defaults to algorithm-env)."""
    run_dir: str = dataclasses.field(default_factory=lambda: os.environ.get(RUN_DIR_ENV, "runs"))
    """Where run directories go: each run writes ``<run_dir>/<name>-<YYYYmmdd-HHMMSS>/``
    (resolved config, metrics rows, TensorBoard event files, checkpoints, summary); "" writes
    none. Default: ``$TIANJI_RUN_DIR``, else ``runs``."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    actors: ActorConfig = dataclasses.field(default_factory=ActorConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    inference: InferenceConfig = dataclasses.field(default_factory=InferenceConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    stop: StopConfig = dataclasses.field(default_factory=StopConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    controller: ControllerConfig = dataclasses.field(default_factory=ControllerConfig)
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = dataclasses.field(default_factory=RecoveryConfig)
    selfplay: SelfPlayConfig = dataclasses.field(default_factory=SelfPlayConfig)
    population: PopulationConfig = dataclasses.field(default_factory=PopulationConfig)
    algo: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Fields of the algorithm's own ``Config`` (checked against it)."""

    def __post_init__(self) -> None:
        if self.transport not in ("inproc", "tcp", "shm"):
            raise ConfigError("transport", self.transport, "one of inproc, tcp, shm")
        shards = self.buffer.shards
        if shards > self.actors.count:
            why = f"at most actors.count={self.actors.count} (one actor each)"
            raise ConfigError("buffer.shards", shards, why)
        if shards > 1 and self.controller.mode == Mode.SYNC:
            raise ConfigError(
                "buffer.shards", shards, "1 with controller.mode = 'sync' (one round of all actors)"
            )
        if self.selfplay != SelfPlayConfig() and self.env.api != "two_player":
            why = 'set only for self-play: [env] api = "two_player"'
            raise ConfigError("selfplay", to_dict(self.selfplay), why)
        if self.selfplay.live_prob > 0 and self.actors.inference == "service":
            why = '0 with [actors] inference = "service" (actors hold no weights to play)'
            raise ConfigError("selfplay.live_prob", self.selfplay.live_prob, why)
        check_game_tactics(self.env.id, self.selfplay.opponent_tactics)
        self._check_population()
        if self.stop.on == "eval" and not self.eval.workers:
            raise ConfigError("stop.on", self.stop.on, '"train" when eval.workers is 0')
        if self.actors.inference == "service" and self.inference.count > self.actors.count:
            why = f"at most actors.count={self.actors.count} (each serves one actor or more)"
            raise ConfigError("inference.count", self.inference.count, why)
        recovery = self.recovery
        if recovery.buffer == "snapshot" and not self.checkpoint.replay:
            why = "'empty' unless [checkpoint] replay = true (no snapshot to restart from)"
            raise ConfigError("recovery.buffer", recovery.buffer, why)
        if recovery.learner == "resume" and not self.checkpoint.enabled:
            why = "'stop' when checkpoints are off (nothing to resume from)"
            raise ConfigError("recovery.learner", recovery.learner, why)

    def _check_population(self) -> None:
        size = self.population.size
        if size > self.actors.count:
            why = f"at most actors.count={self.actors.count} (every member needs an actor)"
            raise ConfigError("population.size", size, why)
        if size > 1 and self.env.api == "two_player":
            raise ConfigError("population.size", size, "1 with self-play (one learning policy)")
        if self.population.objective == "eval" and not self.eval.workers:
            raise ConfigError("population.objective", "eval", '"train" when eval.workers is 0')


def build_dataclass(cls: type[Any], data: Mapping[str, Any], prefix: str) -> Any:
    """Build the dataclass ``cls`` from a mapping, checking keys and value types.

    Raises:
        ConfigError: for an unknown key (naming the allowed ones) or a wrongly typed value.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(prefix or "config", data, "a table of keys")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(dotted, value, f"one of {sorted(fields)}{hint}")
        hint_type = hints[key]
        if dataclasses.is_dataclass(hint_type):
            kwargs[key] = build_dataclass(hint_type, value, f"{dotted}.")  # type: ignore[arg-type]
        else:
            kwargs[key] = check_value(dotted, value, hint_type)
    return cls(**kwargs)


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as plain data (for the saved, resolved config and summaries)."""
    return dataclasses.asdict(config)
