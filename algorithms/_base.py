"""The boilerplate every in-tree algorithm shares, written once: :class:`AlgorithmBase`.

The constructor (spaces checked; config, device, a seeded numpy generator, the update
count ``version``; then the subclass's networks), Adam built on first use, the
data-parallel hook (``gradient_sync``), the weights actors get (``get_weights`` /
``set_weights``) and the learner's checkpoint state (``state_dict`` / ``load_state_dict``).
An algorithm names its modules in three class attributes, builds them in ``_build`` and
keeps its own config, networks, ``act`` and ``update``; the services see only the
:class:`tianji.rl.algorithm.Algorithm` protocol, unchanged.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from tianji.algorithms._multiagent import multi_agent_problem
from tianji.algorithms._nets import (
    adam,
    gradient_step,
    load_numpy_weights,
    numpy_weights,
    pick_device,
    require_spaces,
)
from torch import nn

from tianji.rl.algorithm import GradientSync
from tianji.rl.errors import ConfigError
from tianji.rl.masks import mask_problem
from tianji.rl.pbt import HyperRange

__all__ = ["AlgorithmBase", "Spaces"]


class Spaces(NamedTuple):
    """The spaces an algorithm is built for."""

    observation: Any
    action: Any
    state: Any = None
    """The env's global state (multi-agent envs only)."""


class AlgorithmBase:
    """Weights, checkpoint state, optimizer and device of an algorithm.

    Usage (a subclass names its modules and builds them in :meth:`_build`; the constructor
    is this class's, the one :class:`tianji.rl.algorithm.Algorithm` documents)::

        class DQN(AlgorithmBase):
            networks = ("q", "q_target")  # in state_dict, under these keys, in this order
            trained = ("q",)              # what Adam steps (gradients sync in this order)
            published = "q"               # what actors get (a dotted path, e.g. "net.actor")

            def _build(self, spaces, seed):   # spaces.observation, .action (, .state)
                with seeded_init(seed):
                    self.q = ...

        algo = DQN(DQN.Config(), observation_space, action_space, seed=0, device="cpu")

    ``state_dict()`` is ``{network: its state_dict, ..., "optimizer": ..., "version": n}``
    plus what :meth:`_extra_state` adds (PPO's return statistics).
    """

    networks: ClassVar[tuple[str, ...]]
    trained: ClassVar[tuple[str, ...]]
    published: ClassVar[str]
    multi_agent: ClassVar[bool] = False
    """Stacked agents (``obs [N, A, D]``) and a ``state_space`` (MAPPO, QMIX)."""
    action_masks: ClassVar[bool] = False
    """Honours action masks in the observations (:mod:`tianji.rl.masks`): never picks an
    illegal action. An algorithm that does not is refused masked observations."""
    adam_eps: ClassVar[float] = 1e-8
    """Adam's epsilon (torch's default; PPO and MAPPO use 1e-5)."""
    perturbable: ClassVar[Mapping[str, HyperRange]] = {}
    """The ``Config`` fields population-based training may change mid-run (name -> range
    and perturbation scale, :class:`~tianji.rl.pbt.HyperRange`): only fields the learner's
    ``update`` reads from ``self.config`` every time (see :meth:`set_hyperparameters`)."""

    config: Any
    device: torch.device
    version: int
    rng: np.random.Generator
    gradient_sync: GradientSync | None

    @classmethod
    def check_spaces(cls, observation_space: Any, action_space: Any) -> str | None:
        """``None`` if the algorithm supports the spaces, else a message naming the
        unsupported one. For a multi-agent algorithm: stacked agents
        (:func:`~tianji.algorithms._multiagent.multi_agent_problem`); a single-agent one
        says its own."""
        if not cls.multi_agent:
            raise NotImplementedError(f"{cls.__name__}.check_spaces")
        problem = multi_agent_problem(observation_space, action_space)
        return f"{cls.__name__}: {problem}" if problem else None

    def __init__(
        self,
        config: Any,
        observation_space: Any,
        action_space: Any,
        *,
        seed: int = 0,
        device: str = "auto",
        state_space: Any = None,
    ) -> None:
        """Check the spaces, set what every algorithm has, then build the algorithm's own
        networks and state (:meth:`_build`).

        Args:
            config: the algorithm's ``Config``.
            observation_space, action_space: the env's (per env: ``[A, ...]`` stacked
                agents for a multi-agent algorithm).
            seed: seeds the networks' initialization and the algorithm's generators.
            device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda:N"``.
            state_space: the env's global state space; required by (and only by) a
                multi-agent algorithm (``multi_agent = True``).

        Raises:
            ConfigError: if the spaces are not supported or ``device`` is not a device.
            TypeError: if ``state_space`` is missing for a multi-agent algorithm or given
                to a single-agent one.
        """
        if (state_space is None) == self.multi_agent:
            need = "needs" if self.multi_agent else "takes no"
            raise TypeError(f"{type(self).__name__} {need} state_space")
        problem = self.check_spaces(observation_space, action_space) or mask_problem(
            type(self), observation_space
        )
        require_spaces(problem, observation_space, action_space)
        self.config = config
        self.device = pick_device(device)
        self.version = 0
        self.rng = np.random.default_rng(seed)
        self._optimizer: torch.optim.Optimizer | None = None  # built on first update
        self.gradient_sync = None  # set by the learner when K > 1
        self._build(Spaces(observation_space, action_space, state_space), seed)

    def _build(self, spaces: Spaces, seed: int) -> None:
        """Build the networks (under ``seeded_init(seed)``) and the algorithm's own state."""
        raise NotImplementedError

    def _module(self, name: str) -> nn.Module:
        module: nn.Module = operator.attrgetter(name)(self)
        return module

    def trained_parameters(self) -> list[nn.Parameter]:
        """The parameters Adam steps, module by module in ``trained`` order."""
        return [p for name in self.trained for p in self._module(name).parameters()]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam, built on first use: actors never update, and building an optimizer imports
        a good part of torch (seconds of start-up per actor process)."""
        if self._optimizer is None:
            params = self.trained_parameters()
            self._optimizer = adam(params, lr=self.config.lr, eps=self.adam_eps)
        return self._optimizer

    def _gradient_step(self, loss: torch.Tensor) -> torch.Tensor:
        """One optimizer step on ``loss`` (synced, clipped to ``config.max_grad_norm``);
        returns the gradients' norm before clipping."""
        return gradient_step(
            loss,
            self.trained_parameters(),
            self.optimizer,
            self.gradient_sync,
            self.config.max_grad_norm,
        )

    def set_hyperparameters(self, values: Mapping[str, float]) -> None:
        """Change perturbable hyperparameters from the next update on (a PBT explore step):
        ``config`` is replaced (its checks run again) and a new ``lr`` goes into every
        optimizer at once.

        Raises:
            ConfigError: for a name outside :attr:`perturbable` or a value its config refuses.
        """
        unknown = sorted(set(values) - set(self.perturbable))
        if unknown:
            declared = ", ".join(self.perturbable) or "none"
            why = f"hyperparameters {type(self).__name__} declares perturbable ({declared})"
            raise ConfigError("hyperparameters", unknown, why)
        kinds = {f.name: f.type for f in dataclasses.fields(self.config)}
        typed = {k: int(v) if kinds.get(k) in (int, "int") else float(v) for k, v in values.items()}
        self.config = dataclasses.replace(self.config, **typed)
        if "lr" in typed:
            for optimizer in self._optimizers():
                for group in optimizer.param_groups:
                    group["lr"] = typed["lr"]

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers built so far (Adam's, and any an algorithm keeps beside it)."""
        found = [v for v in vars(self).values() if isinstance(v, torch.optim.Optimizer)]
        for value in vars(self).values():
            if isinstance(value, dict):
                found += [v for v in value.values() if isinstance(v, torch.optim.Optimizer)]
        return found

    def get_weights(self) -> dict[str, np.ndarray]:
        """The ``published`` module's weights (all an actor needs), contiguous numpy arrays."""
        return numpy_weights(self._module(self.published))

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        """Load the weights the learner published at ``version`` updates (``version`` drives
        schedules, e.g. DQN's epsilon)."""
        load_numpy_weights(self._module(self.published), weights)
        self.version = version

    def state_dict(self) -> dict[str, Any]:
        """Everything a learner needs to continue (see ``tianji.rl.checkpoint``): the
        networks (with target networks), Adam's moments and rate, the update count."""
        state: dict[str, Any] = {name: self._module(name).state_dict() for name in self.networks}
        state.update(optimizer=self.optimizer.state_dict(), version=self.version)
        state.update(self._extra_state())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (same config and spaces)."""
        for name in self.networks:
            self._module(name).load_state_dict(state[name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        """More of the learner's state for :meth:`state_dict` (none by default)."""
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`_extra_state` saved."""
