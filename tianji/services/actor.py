"""The actor: steps its envs (``tianji.services.collector``) with a local policy copy or an
inference service, and publishes fragments."""

from __future__ import annotations

import asyncio
import functools
import itertools
from typing import Any

import numpy as np

from tianji.rl.books import Outbox
from tianji.rl.config import RunConfig
from tianji.rl.envs import env_spaces_and_state, make_vector_env, uniform_actions
from tianji.rl.events import (
    ActionsComputed,
    ComputeActions,
    EpisodesFinished,
    GamesPlayed,
    GrantProduction,
    ParamsPublished,
    TrajectoryCollected,
)
from tianji.rl.league import LIVE
from tianji.rl.masks import legal_actions, mask_size
from tianji.rl.run_balance import balance_config
from tianji.rl.selfplay import PolicyOpponent, fixed_opponent
from tianji.rl.slots import StateSlots
from tianji.rl.stats import ActorStat, Dropped
from tianji.rl.tactics import Tactics, game_tactic
from tianji.rl.topics import (
    EPISODES,
    GAMES,
    LATEST_PARAMS,
    OPPONENTS,
    SNAPSHOTS,
    actions_topic,
    observations_topic,
    shard_of_actor,
    trajectories_topic,
)
from tianji.runtime.board import Lease
from tianji.runtime.events import Event, Heartbeat
from tianji.runtime.service import Service
from tianji.services.collector import Act, FragmentCollector
from tianji.services.common import (
    apply_run_options,
    make_algorithm,
    parse_run_config,
    transitions,
)
from tianji.services.numbered import publish_numbered
from tianji.services.opponents import OpponentPool

__all__ = ["ActorService", "FragmentCollector"]


class ActorService(Service):
    """One actor process: N envs, a local policy copy, fragments out, weights in.

    Args:
        name: service name.
        config: the run config as JSON data.
        index: the actor's index (seeds its envs).
    """

    role = "actor"

    def __init__(self, name: str, *, config: dict[str, Any], index: int, **kwargs: Any) -> None:
        run = parse_run_config(config)
        shards = run.buffer.shards
        self.trajectories = trajectories_topic(shard_of_actor(index, shards), shards)
        inference = run.inference.count
        self.observations = observations_topic(index % inference, inference)  # round-robin
        topics = [self.trajectories, EPISODES, self.observations]
        selfplay = run.env.api == "two_player"
        super().__init__(name, publishes=topics + ([GAMES] if selfplay else []), **kwargs)
        self.config = run
        apply_run_options(self, self.config)
        self.index = index
        self.seed = self.config.seed + 1000 * (index + 1)
        self.algo = make_algorithm(self.config, seed=self.seed, device="cpu")
        self.remote = self.config.actors.inference == "service"
        # a local recurrent policy's per-env state (remote: the inference service keeps it)
        self.memory = None if self.remote else StateSlots.for_algorithm(self.algo)
        self._request_ids = itertools.count()
        self._answers: dict[int, asyncio.Future[ActionsComputed]] = {}
        self.fragment_version = -1  # oldest policy version that acted in this fragment
        if self.remote:
            self.subscribe(actions_topic(name), self.on_actions)
        self.policy_version = -1
        self.sent_at_version = 0
        # What the controller lets us collect: fragments in all, and the oldest weights
        # (tianji.rl.balance); nothing until its first grant.
        self.grant = GrantProduction(limit=0, min_version=0, reason="no grant yet")
        self._revoked = False  # the last grant left nothing to collect (a pause)
        self._pending: ParamsPublished | None = None
        self._pending_lease: Lease | None = None
        self._torn = False  # the last weights loaded were overwritten on the board meanwhile
        self._have_params = asyncio.Event()
        self._wake = asyncio.Event()  # new params or a new grant: re-check _pace
        self.gauges[ActorStat.PAUSED_S] = 0.0
        self._paused_before = 0.0  # seconds of the waits that ended
        self._waiting_since: float | None = None  # loop time the wait under way began
        self.gauges[ActorStat.WAITING] = 0.0
        self.outbox = Outbox()  # numbers the fragments (tianji.rl.books)
        # Weights on demand: the params service sends the newest while we want them — while
        # a grant leaves us something to collect, or always where a waiting actor is about
        # to need the newest (BalanceConfig.weights_on_grant) — so an actor waiting for a
        # grant takes one message while the learner publishes many (tianji.runtime.demand).
        self.spec = self.algo.buffer_spec()  # the same every call (the Algorithm protocol)
        balance = balance_config(self.config, self.spec)
        self.weights_on_grant = balance.weights_on_grant
        self.subscribe(LATEST_PARAMS, self.on_params, on_demand=True)
        self.tactics = self._tactics(run)
        self.opponents = self._opponent_pool(run) if selfplay else None

    def _opponent_pool(self, run: RunConfig) -> OpponentPool:
        """The league's snapshots to play against, the fixed opponents mixed into
        training, and how to draw them (self-play)."""
        league = run.selfplay
        pool = OpponentPool(
            lambda: make_algorithm(run, seed=self.seed, device="cpu"),
            pool_size=league.pool_size,
            explore=league.opponent_explore,
            seed=self.seed,
            fixed=[
                fixed_opponent(name, seed=self.seed + 17 * (i + 1))
                for i, name in enumerate(league.train_opponents)
            ],
            live=self._live_opponent() if league.live_prob > 0 else None,
            tactics=self.tactics,
        )
        self.subscribe(SNAPSHOTS, pool.on_snapshot)
        self.subscribe(OPPONENTS, pool.on_opponents)
        return pool

    @staticmethod
    def _tactics(run: RunConfig) -> Tactics | None:
        """The one-move tactics the policy opponents play (``[selfplay] opponent_tactics``;
        None: none, which every run but a self-play one with them set has)."""
        if not run.selfplay.opponent_tactics:
            return None
        observation_space = env_spaces_and_state(run.env)[0]
        tactic = game_tactic(run.env.id)
        return Tactics(tactic, run.selfplay.opponent_tactics, mask_size(observation_space))

    def _live_opponent(self) -> PolicyOpponent:
        """The actor's own policy, with the weights it collects with, as an opponent
        (``[selfplay] live_prob``: live games)."""
        explore, algo = self.config.selfplay.opponent_explore, self.algo
        return PolicyOpponent(LIVE, lambda obs: algo.act(obs, explore=explore)["action"])

    async def on_params(self, ev: ParamsPublished) -> None:
        if ev.policy_version > max(self.policy_version, self._pending_version()):
            self._pending = ev
            self._pending_lease = self.lease_of(ev)  # weights viewed on the params board
            self._have_params.set()
            self._wake.set()
        else:
            self.counters["params_ignored"] += 1
        if self._granted() or not self.weights_on_grant:
            self.want(LATEST_PARAMS)  # collecting (or about to): keep the newest coming

    async def on_control(self, ev: Event) -> None:
        if isinstance(ev, GrantProduction):
            # The newest grant holds, lower or higher: the controller's link is ordered,
            # and a lower one takes back what was not started (a run that drains).
            was_granted = self._granted()
            self.grant = ev
            self._revoked = not self._granted()
            if self._granted() and not was_granted:
                self.want(LATEST_PARAMS)  # the newest weights published while we waited
            self.gauges[ActorStat.GRANT_LIMIT] = ev.limit
            self.gauges[ActorStat.GRANT_MIN_VERSION] = ev.min_version
            self._wake.set()
            if self._revoked:
                self.report_soon()  # (already waiting: say so now; a draining run waits for it)
        else:
            await super().on_control(ev)

    async def on_actions(self, ev: ActionsComputed) -> None:
        future = self._answers.pop(ev.request_id, None)
        if future is None or future.done():
            self.counters["answers_unexpected"] += 1
            return
        future.set_result(ev)

    async def _act_local(
        self, obs: np.ndarray, rows: range, starts: np.ndarray
    ) -> dict[str, np.ndarray]:
        if self.memory is not None:
            env_ids = np.arange(rows.start, rows.stop)
            return self.memory.act(self.algo, self.name, obs, env_ids, starts, explore=True)
        return self.algo.act(obs, explore=True)  # type: ignore[no-any-return]

    async def _act_remote(
        self, obs: np.ndarray, rows: range, starts: np.ndarray
    ) -> dict[str, np.ndarray]:
        request_id = next(self._request_ids)
        future: asyncio.Future[ActionsComputed] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = future
        request = ComputeActions(
            actor=self.name,
            request_id=request_id,
            obs=obs,
            env_ids=np.arange(rows.start, rows.stop, dtype=np.int32),
            starts=np.asarray(starts, bool),
        )
        await self.publish(request, self.observations)
        answer = await future
        if self.fragment_version < 0 or answer.policy_version < self.fragment_version:
            self.fragment_version = answer.policy_version
        return dict(answer.arrays)

    def _pending_version(self) -> int:
        return self._pending.policy_version if self._pending is not None else -1

    def _apply_params(self) -> None:
        """Load the newest weights received (with an inference service, where they live,
        only note their version); ``_torn`` while the ones we have may not be used."""
        pending, lease = self._pending, self._pending_lease
        if pending is None:
            return
        self._pending = None
        self._have_params.clear()
        if not self.remote:
            if lease is not None and not lease.valid():
                # overwritten on the board while we waited for a grant: a newer version is
                # out and wanted (on the grant); wait for it rather than collect with the
                # weights loaded before
                self.counters[ActorStat.PARAMS_SUPERSEDED] += 1
                self._torn = True
                return
            self.algo.set_weights(pending.weights, pending.policy_version)
            if lease is not None and not lease.valid():
                # overwritten while we copied (newer ones were published): what we
                # loaded may be torn; wait for the newer version, which is coming
                self.counters[ActorStat.PARAMS_TORN] += 1
                self._torn = True
                return
        self._torn = False
        self.policy_version = pending.policy_version
        self.gauges[ActorStat.POLICY_VERSION] = self.policy_version
        self.sent_at_version = 0
        self.gauges[ActorStat.FRAGMENTS_AT_VERSION] = 0
        self.report_soon()

    def _granted(self) -> bool:
        """A fragment is granted and not sent yet."""
        return self.counters[ActorStat.FRAGMENTS_SENT] < self.grant.limit

    def _may_collect(self) -> bool:
        """Granted, with weights at least as new as the grant asks (loaded only now: an
        actor waiting for a grant does not load every version published meanwhile)."""
        if not self._granted():
            return False
        self._apply_params()
        return not self._torn and self.policy_version >= self.grant.min_version

    async def _pace(self) -> None:
        """Wait until :meth:`_may_collect`: a grant, and the weights it asks for."""
        if self._may_collect():
            return
        loop = asyncio.get_running_loop()
        self._waiting_since = started = loop.time()
        self.gauges[ActorStat.WAITING] = 1.0
        if self._revoked:
            self.report_soon()  # a run that drains before it stops waits to see this
        try:
            while not self._may_collect():
                self._wake.clear()
                await self._wake.wait()
        finally:
            self.gauges[ActorStat.WAITING] = 0.0
            self._waiting_since = None
            self._paused_before += loop.time() - started
            self.gauges[ActorStat.PAUSED_S] = self._paused_before

    def heartbeat(self) -> Heartbeat:
        """The heartbeat, with ``paused_s`` counting the wait under way too (a producer
        held for a long time shows it while it lasts, not only once it goes on)."""
        if self._waiting_since is not None:
            waited = asyncio.get_running_loop().time() - self._waiting_since
            self.gauges[ActorStat.PAUSED_S] = self._paused_before + waited
        return super().heartbeat()

    async def _send_fragment(self, fragment: dict[str, np.ndarray], episodes: int) -> None:
        """Count a collected fragment and publish it, numbered on our stream: sent (a
        buffer's link took it) or unsent (no buffer connected: lost, and counted), and
        "sending" meanwhile."""
        actors = self.config.actors
        version = self.fragment_version if self.remote else self.policy_version
        samples = self.algo.postprocess(fragment)
        produced = transitions(samples)
        report = getattr(self.algo, "actor_metrics", None)
        if report is not None:  # the algorithm's own actor-side numbers
            for key, value in report().items():
                self.gauges[f"{ActorStat.ALGO_PREFIX}{key}"] = float(value)
        self.counters[ActorStat.ENV_STEPS] += actors.fragment_length * actors.envs_per_actor
        self.counters[ActorStat.SAMPLES_PRODUCED] += produced
        self.counters[ActorStat.FRAGMENTS_SENT] += 1  # in the same heartbeat as the samples
        self.counters[ActorStat.EPISODES] += episodes
        await publish_numbered(
            self,
            self.outbox,
            self.trajectories,
            functools.partial(
                TrajectoryCollected, actor=self.name, policy_version=version, arrays=samples
            ),
            produced,
            sending=produced,
            sending_key=ActorStat.SENDING,
            sent_key=ActorStat.SAMPLES_SENT,
            unsent_key=Dropped.UNSENT,
        )
        self.sent_at_version += 1
        self.gauges[ActorStat.FRAGMENTS_AT_VERSION] = self.sent_at_version
        self.report_soon()

    def _random_warm_up(self, act: Act, space: Any, obs_space: Any) -> Act:
        """``act``, with its actions replaced by uniform ones over ``space`` (legal ones,
        where ``obs_space`` carries an action mask) for this actor's
        share of the algorithm's ``random_steps`` (``ceil(random_steps / actors)`` env
        steps) in a run that starts from scratch: an actor restarted once the learner has
        published (its first weights newer than version 0) acts by the policy at once."""
        first = self._pending_version() if self._pending is not None else self.policy_version
        if not self.spec.random_steps or first > 0:
            return act
        uniform_actions(space, 1, np.random.default_rng(0))  # an unfit space fails here
        left = -(-self.spec.random_steps // self.config.actors.count)
        rng = np.random.default_rng([self.seed, 7])

        async def act_or_random(
            obs: np.ndarray, rows: range, starts: np.ndarray
        ) -> dict[str, np.ndarray]:
            nonlocal left
            out = await act(obs, rows, starts)
            if left > 0:
                left -= len(obs)
                self.counters[ActorStat.RANDOM_STEPS] += len(obs)
                legal = legal_actions(obs, obs_space) if mask_size(obs_space) else None
                out = {**out, "action": uniform_actions(space, len(obs), rng, legal)}
            return out

        return act_or_random

    async def main(self) -> None:
        import torch

        torch.set_num_threads(self.config.actors.torch_threads)
        actors = self.config.actors
        per_group = actors.envs_per_actor // actors.splits
        groups = [make_vector_env(self.config.env, per_group) for _ in range(actors.splits)]
        collector = FragmentCollector(groups, actors.fragment_length, self.seed)
        if self.opponents is not None:
            envs = [env for group in groups for env in group.envs]
            self.opponents.attach(envs, self.config.selfplay.random_opening)
        await self._have_params.wait()  # act with the learner's weights, never our own init
        await self.wait_subscribers(self.trajectories)
        if self.remote:
            await self.wait_subscribers(self.observations)
        act = self._random_warm_up(
            self._act_remote if self.remote else self._act_local,
            groups[0].single_action_space,
            groups[0].single_observation_space,
        )
        try:
            while True:
                await self._pace()
                self.fragment_version = -1
                fragment, returns, lengths = await collector.collect(act)
                await self._send_fragment(fragment, len(returns))
                # Local acting never suspends: yield once per fragment so new weights and
                # the controller's commands are handled before the next fragment starts.
                await asyncio.sleep(0)
                await self.publish(
                    EpisodesFinished(
                        actor=self.name,
                        policy_version=self.policy_version,
                        returns=np.asarray(returns, np.float64),
                        lengths=np.asarray(lengths, np.int64),
                        env_steps=self.counters[ActorStat.ENV_STEPS],
                    ),
                    EPISODES,
                )
                if self.opponents is not None:
                    await self._publish_games(collector.take_games())
        finally:
            collector.close()

    async def _publish_games(self, games: list[tuple[str, int, float]]) -> None:
        """Self-play: the games that ended, for the league's ratings."""
        assert self.opponents is not None
        self.gauges[ActorStat.SNAPSHOTS_HELD] = len(self.opponents.held)
        if self.tactics is not None:  # the opponents' moves, and those a rule narrowed
            self.counters["opponent_moves"] = self.tactics.tally.moves
            for kind, moves in self.tactics.tally.narrowed.items():
                self.counters[f"opponent_{kind}"] = moves
        if not games:
            return
        self.counters[ActorStat.GAMES] += len(games)
        opponents, seats, outcomes = zip(*games, strict=True)
        await self.publish(
            GamesPlayed(
                actor=self.name,
                policy_version=self.policy_version,
                opponents=tuple(opponents),
                seats=np.asarray(seats, np.int8),
                outcomes=np.asarray(outcomes, np.float32),
            ),
            GAMES,
        )
