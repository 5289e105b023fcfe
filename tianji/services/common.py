"""What every RL service needs: the run config, the algorithm, torch set-up."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from tianji import algorithms
from tianji.rl.algorithm import SupportsGradientSync
from tianji.rl.config import RunConfig, build_dataclass
from tianji.rl.envs import env_spaces_and_state
from tianji.rl.masks import mask_problem
from tianji.runtime.errors import ConfigError

if TYPE_CHECKING:
    from tianji.runtime.service import Service

__all__ = [
    "algorithms_taking",
    "apply_run_options",
    "make_algorithm",
    "parse_run_config",
    "transitions",
]

log = logging.getLogger(__name__)


def parse_run_config(data: dict[str, Any]) -> RunConfig:
    """The run config as the launcher passed it (JSON data)."""
    config: RunConfig = build_dataclass(RunConfig, data, "")
    return config


def make_algorithm(config: RunConfig, *, seed: int, device: str) -> Any:
    """Instantiate the configured algorithm for the configured env.

    Raises:
        ConfigError: for an unknown algorithm, bad ``[algo]`` keys, unsupported spaces, or
            several learners for an algorithm that cannot average gradients.
    """
    cls = algorithms.get(config.algorithm)
    algo_config = build_dataclass(cls.Config, config.algo, "algo.")
    obs_space, action_space, state_space = env_spaces_and_state(config.env)
    multi_agent = bool(getattr(cls, "multi_agent", False))
    if multi_agent and state_space is None:
        why = 'a multi-agent env: [env] api = "pettingzoo" (e.g. id = "mpe2.simple_spread_v3")'
        raise ConfigError("algorithm", config.algorithm, why)
    if state_space is not None and not multi_agent:
        why = f'a single-agent env; {config.env.id} is multi-agent: use "mappo" or "qmix"'
        raise ConfigError("algorithm", config.algorithm, why)
    problem = _space_problem(cls, obs_space, action_space)
    if problem:
        takers = algorithms_taking(obs_space, action_space, multi_agent)
        hint = f"; these take them: {', '.join(takers)}" if takers else ""
        why = f"spaces it supports: {problem}{hint}"
        raise ConfigError("algorithm", config.algorithm, why)
    extra = {"state_space": state_space} if multi_agent else {}
    algo = cls(algo_config, obs_space, action_space, seed=seed, device=device, **extra)
    if config.learner.count > 1 and not isinstance(algo, SupportsGradientSync):
        why = (
            f"1: algorithm {config.algorithm!r} has no gradient_sync (see writing-an-algorithm.md)"
        )
        raise ConfigError("learner.count", config.learner.count, why)
    return algo


def algorithms_taking(obs_space: Any, action_space: Any, multi_agent: bool) -> list[str]:
    """The known algorithms (in-tree and registered) whose ``check_spaces`` accept these
    spaces: what an error about unsupported spaces suggests instead."""
    takers = []
    for name in algorithms.names():
        try:
            cls = algorithms.get(name)
            if bool(getattr(cls, "multi_agent", False)) != multi_agent:
                continue
            if _space_problem(cls, obs_space, action_space) is None:
                takers.append(name)
        except Exception as exc:  # a broken plugin is no suggestion; the error stands
            log.debug("algorithm %r not suggested: %s", name, exc)
    return takers


def _space_problem(cls: Any, obs_space: Any, action_space: Any) -> str | None:
    """What ``cls.check_spaces`` says, or that it would ignore the observations' action
    mask (:func:`~tianji.rl.masks.mask_problem`)."""
    problem: str | None = cls.check_spaces(obs_space, action_space)
    return problem or mask_problem(cls, obs_space)


def check_lr(service: Service, lr: float | None, version: int) -> None:
    """Say so, once, when a learner's algorithm reports a learning rate of 0: from then on
    the policy no longer changes, and a run short of its target cannot reach it."""
    from tianji.rl.stats import LearnerStat

    if lr is None or lr > 0 or LearnerStat.LR_ZERO_AT_UPDATE in service.counters:
        return
    service.counters[LearnerStat.LR_ZERO_AT_UPDATE] = version
    log.warning(
        "%s: the learning rate reached 0 at update %d: the policy no longer learns "
        "(an annealed schedule ended; set algo.lr_floor > 0 or a longer "
        "algo.lr_anneal_updates)",
        service.name,
        version,
    )


def run_config_data(config: RunConfig) -> dict[str, Any]:
    """The run config as JSON data for service options."""
    return dataclasses.asdict(config)


def apply_run_options(service: Service, config: RunConfig) -> None:
    """Service runtime options that come from the run config (report interval)."""
    service.options = dataclasses.replace(
        service.options, report_interval=config.controller.report_interval
    )


def transitions(arrays: dict[str, np.ndarray]) -> int:
    """Transitions in a post-processed fragment or batch: ``T*N`` for ``[T, N, ...]``
    rollouts, the leading dimension for flat transitions."""
    first = next(iter(arrays.values()))
    reward = arrays.get("reward", first)
    return int(reward.size) if reward.ndim <= 2 else int(np.prod(reward.shape[:2]))
