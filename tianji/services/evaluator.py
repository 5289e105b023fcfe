"""Evaluation workers (``[eval] workers``): episodes with the newest weights, apart from training.

A worker keeps the newest weights the parameter service published and, when an evaluation
is due (``[eval] every_seconds`` since its last one, or ``every_versions`` versions newer
than the weights it last evaluated; never the same version twice), plays
``[eval] episodes`` episodes with them: greedy unless ``[eval] explore``, on the
evaluation env (``[env]`` built for evaluation, i.e. without training-only shaping such as
the Atari preset's episodic lives and clipped rewards, with ``[eval] env_id`` /
``env_kwargs`` where given), from the same reset seeds every time. It publishes the
returns as :class:`~tianji.rl.events.PolicyEvaluated`; the run's monitor reports them
(``eval_return``, ``eval_policy_version``) and can stop the run on them
(``[stop] on = "eval"``).

Workers start staggered (worker ``k`` of ``W`` waits ``k / W`` of the period first), so
more workers evaluate more often. Episodes run in waves of at most :data:`WAVE` envs
stepped together, one batched forward pass per step, yielding to the event loop between
steps so heartbeats and new weights keep flowing. A recurrent policy carries its state
per env from the episode's start.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from tianji.rl.envs import env_factory
from tianji.rl.events import ParamsPublished, PolicyEvaluated
from tianji.rl.selfplay import Opponent, TwoPlayerGame, fixed_opponent
from tianji.rl.slots import StateSlots
from tianji.rl.stats import EvalStat
from tianji.rl.topics import EVALUATIONS, LATEST_PARAMS
from tianji.runtime.board import Lease
from tianji.runtime.loop import wait_set
from tianji.runtime.service import Service
from tianji.services.common import apply_run_options, make_algorithm, parse_run_config

__all__ = ["WAVE", "EvalService", "play_episodes"]

WAVE = 16
"""Evaluation envs stepped together at most (more episodes run in several waves)."""

SEED_BASE = 7_000_000
"""Evaluation reset seeds start here (plus the run's seed): apart from the actors' seeds."""


async def play_episodes(
    algo: Any,
    envs: SyncVectorEnv,
    seeds: list[int],
    *,
    explore: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """One episode per env of ``envs`` (reset with ``seeds``), to their ends.

    Returns:
        ``(returns float64, lengths int64)`` in env order: the sum of the env's rewards
        and the steps of each env's first episode (what an env does after it is ignored).
    """
    n = envs.num_envs
    obs, _ = envs.reset(seed=list[int | None](seeds))
    memory = StateSlots.for_algorithm(algo)
    ids = np.arange(n)
    starts = np.ones(n, bool)
    active = np.ones(n, bool)
    returns = np.zeros(n, np.float64)
    lengths = np.zeros(n, np.int64)
    space = envs.single_action_space
    clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    while active.any():
        if memory is not None:
            out = memory.act(algo, "eval", obs, ids, starts, explore=explore)
        else:
            out = algo.act(obs, explore=explore)
        action = out["action"] if clip is None else np.clip(out["action"], *clip)
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += np.where(active, reward, 0.0)
        lengths += active
        done = np.asarray(terminated) | np.asarray(truncated)
        active &= ~done
        starts = done
        await asyncio.sleep(0)  # heartbeats and new weights between steps
    return returns, lengths


class EvalService(Service):
    """One evaluation worker (see the module docstring).

    Args:
        name: service name (``eval-<k>``).
        config: the run config as JSON data.
        index: the worker's index ``k``.
    """

    role = "eval"

    def __init__(self, name: str, *, config: dict[str, Any], index: int = 0, **kwargs: Any) -> None:
        super().__init__(name, publishes=[EVALUATIONS], **kwargs)
        self.config = parse_run_config(config)
        apply_run_options(self, self.config)
        self.index = index
        self.settings = self.config.eval
        self.algo = make_algorithm(self.config, seed=self.config.seed + 500 + index, device="cpu")
        self.env_config = self.settings.env(self.config.env)
        self.opponents: list[str] = []
        """Self-play: the fixed opponents each evaluation plays (``eval_games`` each), each
        made anew (:func:`~tianji.rl.selfplay.fixed_opponent`) from the same seed every
        time, as the games' reset seeds are."""
        episodes = self.settings.episodes
        if self.config.env.api == "two_player":
            self.opponents = list(self.config.selfplay.eval_opponents)
            episodes = self.config.selfplay.eval_games
        self.seeds = [self.config.seed + SEED_BASE + i for i in range(episodes)]
        self.evaluated = -1  # the policy version last evaluated
        self._pending: ParamsPublished | None = None
        self._pending_lease: Lease | None = None
        self._arrived = asyncio.Event()
        self._envs: dict[int, SyncVectorEnv] = {}
        self.gauges[EvalStat.EVAL_S] = 0.0
        self.subscribe(LATEST_PARAMS, self.on_params, latest_only=True)

    async def on_params(self, ev: ParamsPublished) -> None:
        if self._pending is None or ev.policy_version > self._pending.policy_version:
            self._pending = ev
            self._pending_lease = self.lease_of(ev)
            self._arrived.set()

    def _due(self, last: float) -> bool:
        s = self.settings
        pending = self._pending
        if pending is None or pending.policy_version <= self.evaluated:
            return False
        if s.every_versions and pending.policy_version - self.evaluated >= s.every_versions:
            return True
        return bool(s.every_seconds) and time.monotonic() - last >= s.every_seconds

    def _wait_s(self, last: float) -> float | None:
        """How long to wait for new weights before checking again: until the period ends
        when newer weights wait for it, else until weights arrive."""
        pending, period = self._pending, self.settings.every_seconds
        if pending is None or pending.policy_version <= self.evaluated or not period:
            return None
        return max(0.0, period - (time.monotonic() - last))

    def _load(self) -> int | None:
        """The pending weights loaded: their version, or ``None`` if they were torn on the
        params board while copied (counted; newer ones are on their way)."""
        pending, lease = self._pending, self._pending_lease
        assert pending is not None
        self._pending = None
        self.algo.set_weights(pending.weights, pending.policy_version)
        if lease is not None and not lease.valid():
            self.counters[EvalStat.PARAMS_TORN] += 1
            return None
        return pending.policy_version

    async def main(self) -> None:
        import torch

        torch.set_num_threads(1)
        s = self.settings
        period = s.every_seconds
        # staggered: worker k of W starts k/W of a period late (its first evaluation too)
        last = time.monotonic() - period + period * self.index / max(1, s.workers)
        try:
            while True:
                while not self._due(last):
                    self._arrived.clear()
                    await wait_set(self._arrived, self._wait_s(last))
                version = self._load()
                if version is None:
                    continue
                last = time.monotonic()
                names: list[str | None] = [*self.opponents] or [None]
                for name in names:
                    seed = self.config.seed + SEED_BASE
                    opponent = fixed_opponent(name, seed) if name is not None else None
                    returns, lengths = await self._evaluate(opponent)
                    await self._report(version, returns, lengths, opponent)
                self.evaluated = version
                self.gauges[EvalStat.EVAL_S] += time.monotonic() - last
                self.counters[EvalStat.EVALUATIONS] += 1
        finally:
            for envs in self._envs.values():
                envs.close()

    async def _report(
        self, version: int, returns: np.ndarray, lengths: np.ndarray, opponent: Opponent | None
    ) -> None:
        self.counters[EvalStat.EPISODES] += int(returns.size)
        self.counters[EvalStat.ENV_STEPS] += int(lengths.sum())
        self.gauges[EvalStat.RETURN] = float(returns.mean())
        self.gauges[EvalStat.POLICY_VERSION] = version
        self.report_soon()
        against = opponent.id if opponent is not None else ""
        await self.publish(
            PolicyEvaluated(
                worker=self.name, policy_version=version, returns=returns, lengths=lengths,
                opponent=against,
            ),
            EVALUATIONS,
        )  # fmt: skip

    async def _evaluate(self, opponent: Opponent | None) -> tuple[np.ndarray, np.ndarray]:
        """Every episode of one evaluation, in waves of at most :data:`WAVE` envs; in a
        two-player game against ``opponent``, the learner first in the even games and
        second in the odd ones."""
        returns, lengths = [], []
        for start in range(0, len(self.seeds), WAVE):
            seeds = self.seeds[start : start + WAVE]
            envs = self._wave_envs(len(seeds))
            if opponent is not None:
                for i, env in enumerate(envs.envs):
                    game = env.unwrapped
                    assert isinstance(game, TwoPlayerGame)
                    game.set_opponent(opponent)
                    game.seat_rule = "first" if (start + i) % 2 == 0 else "second"
            r, n = await play_episodes(self.algo, envs, seeds, explore=self.settings.explore)
            returns.append(r)
            lengths.append(n)
        return np.concatenate(returns), np.concatenate(lengths)

    def _wave_envs(self, n: int) -> SyncVectorEnv:
        envs = self._envs.get(n)
        if envs is None:
            factory = env_factory(self.env_config, training=False)
            envs = SyncVectorEnv([factory] * n, autoreset_mode=AutoresetMode.NEXT_STEP)
            self._envs[n] = envs
        return envs
