"""A trained policy as one plain torch module: observations in, greedy actions out.

:class:`GreedyPolicy` wraps an algorithm's own network (no copy) with what ``act(obs,
explore=False)`` does around it, in torch only, so ``torch.jit.trace`` and
``torch.onnx.export`` can take it and a program without tianji can run it (``tianji
export``, ``docs/evaluation.md``, "Policies outside tianji"). Each in-tree algorithm builds
one in its ``greedy_module()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["GreedyPolicy"]


class GreedyPolicy(nn.Module):
    """``obs [B, ...] -> action [B, ...]``: the body's head, then the greedy action.

    Args:
        body: maps the network input to the head (a tuple's first element is taken:
            actor-critics return ``(head, value)``).
        image: the input is uint8 images, passed as they are (the body scales them);
            else observations are flattened to float32 ``[B, D]``.
        discrete_start: for discrete actions, the first action's index (the head is
            logits or Q-values: the action is their argmax plus this).
        low, high: for Box actions, the bounds; the head is the action (clipped to them),
            or with ``squash`` a pre-``tanh`` value mapped onto them.
        squash: apply ``tanh`` first (SAC's mean; TD3's body ends in ``tanh`` already and
            passes ``unit=True``).
        unit: the head is a unit action in [-1, 1], mapped onto ``[low, high]``.
        action_shape: the shape of one action (Box).
    """

    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self,
        body: nn.Module,
        *,
        image: bool,
        discrete_start: int | None = None,
        low: np.ndarray | None = None,
        high: np.ndarray | None = None,
        squash: bool = False,
        unit: bool = False,
        action_shape: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.body, self.image = body, image
        self.discrete = discrete_start is not None
        self.start = int(discrete_start or 0)
        self.squash, self.unit = squash, unit or squash
        self.action_shape = tuple(int(n) for n in action_shape)
        if not self.discrete:
            assert low is not None and high is not None, "Box actions need their bounds"
            lo = torch.as_tensor(np.asarray(low, np.float32).reshape(-1))
            hi = torch.as_tensor(np.asarray(high, np.float32).reshape(-1))
            self.register_buffer("low", lo)
            self.register_buffer("high", hi)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The greedy actions for a batch of observations."""
        x = obs if self.image else obs.flatten(1).to(torch.float32)
        head = self.body(x)
        if isinstance(head, tuple):
            head = head[0]
        if self.discrete:
            greedy: torch.Tensor = head.argmax(dim=1) + self.start
            return greedy
        if self.squash:
            head = torch.tanh(head)
        if self.unit:
            action = self.low + (head + 1.0) * 0.5 * (self.high - self.low)
        else:
            action = torch.minimum(torch.maximum(head, self.low), self.high)
        out: torch.Tensor = action.reshape(action.shape[0], *self.action_shape)
        return out
