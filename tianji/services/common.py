"""What every RL service needs: the run config, the algorithm, torch set-up."""

from __future__ import annotations

import dataclasses
from typing import Any

from tianji import algorithms
from tianji.config import RunConfig, build_dataclass
from tianji.envs import env_spaces
from tianji.errors import ConfigError

__all__ = ["make_algorithm", "parse_run_config"]


def parse_run_config(data: dict[str, Any]) -> RunConfig:
    """The run config as the launcher passed it (JSON data)."""
    config: RunConfig = build_dataclass(RunConfig, data, "")
    return config


def make_algorithm(config: RunConfig, *, seed: int, device: str) -> Any:
    """Instantiate the configured algorithm for the configured env.

    Raises:
        ConfigError: for an unknown algorithm, bad ``[algo]`` keys or unsupported spaces.
    """
    cls = algorithms.get(config.algorithm)
    algo_config = build_dataclass(cls.Config, config.algo, "algo.")
    obs_space, action_space = env_spaces(config.env)
    problem = cls.check_spaces(obs_space, action_space)
    if problem:
        raise ConfigError("algorithm", config.algorithm, f"spaces it supports: {problem}")
    return cls(algo_config, obs_space, action_space, seed=seed, device=device)


def run_config_data(config: RunConfig) -> dict[str, Any]:
    """The run config as JSON data for service options."""
    return dataclasses.asdict(config)
