"""Pieces the multi-agent algorithms share: which spaces they take, per-agent inputs.

Envs adapted by ``tianji.rl.multiagent`` stack A agents: observations ``[A, D]``, actions
``MultiDiscrete([n] * A)``. One network serves every agent; a one-hot of the agent's index
appended to its observation lets it still act differently per agent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["agent_counts", "agent_inputs", "multi_agent_problem"]


def multi_agent_problem(observation_space: Any, action_space: Any) -> str | None:
    """``None`` for stacked agents (Box ``[A, D]`` observations, ``MultiDiscrete`` actions
    with the same count and start for all ``A`` agents), else what is not supported."""
    from gymnasium import spaces

    shape = getattr(observation_space, "shape", None)
    if not isinstance(observation_space, spaces.Box) or shape is None or len(shape) != 2:
        return (
            f"observation space {observation_space!r} is not supported: a gymnasium.spaces.Box "
            'of shape (agents, features) is needed ([env] api = "pettingzoo")'
        )
    nvec = np.asarray(getattr(action_space, "nvec", []))
    start = np.asarray(getattr(action_space, "start", []))
    if (
        not isinstance(action_space, spaces.MultiDiscrete)
        or nvec.shape != (shape[0],)
        or np.any(nvec != nvec[0])
        or np.any(start != start[0])
    ):
        return (
            f"action space {action_space!r} is not supported: a gymnasium.spaces.MultiDiscrete "
            f"of {shape[0]} equal discrete actions (one per agent, same size and start) is needed"
        )
    return None


def agent_inputs(obs: np.ndarray | torch.Tensor, *, with_id: bool = True) -> torch.Tensor:
    """``obs [B, A, ...]`` as float32 per-agent inputs ``[B, A, D (+ A)]``: each agent's
    flattened observation, with ``with_id`` followed by the one-hot of its index (on the
    device ``obs`` is on)."""
    x = torch.as_tensor(obs, dtype=torch.float32)
    batch, n_agents = x.shape[0], x.shape[1]
    x = x.reshape(batch, n_agents, -1)
    if not with_id:
        return x
    ids = torch.eye(n_agents, dtype=x.dtype, device=x.device).expand(batch, -1, -1)
    return torch.cat([x, ids], dim=-1)


def agent_counts(action_space: Any) -> tuple[int, int, int]:
    """``(agents, actions per agent, the first action's number)`` of a supported action
    space (see :func:`multi_agent_problem`)."""
    nvec, start = action_space.nvec, action_space.start
    return len(nvec), int(nvec[0]), int(start[0])
