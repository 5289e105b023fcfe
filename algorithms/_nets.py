"""Small torch helpers shared by the in-tree algorithms: device pick, MLPs, weights as numpy.

Nothing here knows about RL; an algorithm file stays readable top to bottom and imports
only these few building blocks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tianji.algorithms._board import board_shape
from torch import nn

from tianji.rl.algorithm import GradientSync
from tianji.rl.errors import ConfigError
from tianji.rl.masks import mask_size

__all__ = [
    "MASK_FILL",
    "BOARD_DROPS_TORSO",
    "BOARD_LINES_TORSO",
    "BOARD_TORSOS",
    "BOARD_TORSO",
    "TORSOS",
    "MaskedNetwork",
    "NatureCNN",
    "adam",
    "as_hidden",
    "box_obs_problem",
    "build_network",
    "custom_torso",
    "flat_dim",
    "gradient_step",
    "is_custom",
    "is_image_space",
    "load_numpy_weights",
    "masked_head",
    "mlp",
    "numpy_weights",
    "obs_tensor",
    "pick_device",
    "polyak_update",
    "resolve_torso",
    "seeded_init",
    "sync_gradients",
]

log = logging.getLogger(__name__)


def adam(params: Any, **kwargs: Any) -> torch.optim.Adam:
    """``torch.optim.Adam`` with its fused kernel where the torch build has one for the
    parameters' device (CPU since torch 2.4, CUDA): one kernel for every parameter instead
    of a dozen per tensor, ~1/3 of a small network's optimizer step. The same update;
    falls back to the per-tensor loop elsewhere."""
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError) as exc:  # no fused kernel for this device
        log.debug("fused Adam unavailable (%s): the per-tensor one", exc)
        return torch.optim.Adam(params, **kwargs)


def pick_device(device: str) -> torch.device:
    """Resolve ``"auto"`` to CUDA when available, else CPU; pass other names through.

    Raises:
        ConfigError: if ``device`` is not a valid torch device name.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ConfigError("device", device, '"auto", "cpu", "cuda" or "cuda:N"') from exc


def box_obs_problem(observation_space: Any) -> str | None:
    """``None`` if ``observation_space`` is a ``gymnasium.spaces.Box``, else why not."""
    from gymnasium import spaces

    if not isinstance(observation_space, spaces.Box):
        return (
            f"observation space {observation_space!r} is not supported: "
            "a gymnasium.spaces.Box is needed (it is flattened to a vector)"
        )
    return None


def require_spaces(problem: str | None, observation_space: Any, action_space: Any) -> None:
    """Raise the ConfigError an algorithm's constructor gives for unsupported spaces.

    Args:
        problem: what the algorithm's ``check_spaces`` returned (``None``: supported).
    """
    if problem is not None:
        raise ConfigError("algorithm.spaces", (observation_space, action_space), problem)


def flat_dim(shape: Sequence[int]) -> int:
    """Number of elements of one item of ``shape`` (1 for a scalar shape)."""
    return int(math.prod(shape))


def as_hidden(key: str, value: Sequence[int]) -> tuple[int, ...]:
    """Validate hidden layer sizes given as a list or tuple (TOML gives lists).

    Raises:
        ConfigError: if a size is not a positive integer.
    """
    sizes = tuple(value)
    if any(type(s) is not int or s <= 0 for s in sizes):
        raise ConfigError(key, value, "a list of positive integers")
    return sizes


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    *,
    activation: type[nn.Module] = nn.ReLU,
    out_gain: float | None = None,
) -> nn.Sequential:
    """A multi-layer perceptron ``in_dim -> hidden... -> out_dim``.

    Args:
        activation: the nonlinearity after every hidden layer.
        out_gain: when given, every layer gets orthogonal init (hidden gain sqrt(2), output
            gain ``out_gain``) and zero biases, as in PPO implementations; when ``None``
            torch's default init is kept.
    """
    layers: list[nn.Module] = []
    sizes = [in_dim, *hidden]
    for a, b in itertools.pairwise(sizes):
        layers += [_linear(a, b, math.sqrt(2) if out_gain is not None else None), activation()]
    layers.append(_linear(sizes[-1], out_dim, out_gain))
    return nn.Sequential(*layers)


def _linear(a: int, b: int, gain: float | None) -> nn.Linear:
    layer = nn.Linear(a, b)
    if gain is not None:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


@contextlib.contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Build networks from ``seed`` inside this block without touching torch's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


MASK_FILL = -1e8
"""What an illegal action's logit or Q-value becomes (:func:`masked_head`): finite, so a
terminal observation with no legal action gives no NaN, and low enough that softmax gives
it probability 0 and argmax never picks it."""


def masked_head(head: torch.Tensor, obs: torch.Tensor, n: int) -> torch.Tensor:
    """``head [..., n]`` (logits or Q-values) with the actions that the trailing ``n``
    entries of ``obs [..., D + n]`` forbid set to :data:`MASK_FILL`
    (:class:`~tianji.rl.masks.MaskedObs`)."""
    legal = obs.reshape(*head.shape[:-1], -1)[..., -n:] > 0.5
    return head.masked_fill(~legal, MASK_FILL)


class MaskedNetwork(nn.Module):
    """A network over masked observations whose outputs for illegal actions are
    :data:`MASK_FILL` (DQN's Q-networks: greedy actions and targets over legal ones)."""

    def __init__(self, net: nn.Module, n: int) -> None:
        super().__init__()
        self.net, self.n = net, n

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return masked_head(self.net(obs), obs, self.n)


def host_to_device(
    array: Any, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A host array as a tensor on ``device``. On CUDA it goes through pinned (page-locked)
    host memory with a ``non_blocking`` copy, so the copy does not stall the host thread
    and overlaps the work queued before it; on the CPU it is ``torch.as_tensor`` (no copy
    where the dtype already fits)."""
    tensor = torch.as_tensor(np.asarray(array), dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def obs_tensor(obs: np.ndarray, device: torch.device, *, image: bool = False) -> torch.Tensor:
    """``obs [B, ...]`` as the network's input on ``device``: a float32 ``[B, D]`` tensor
    for an MLP; for an ``image`` network the array as it is (uint8 pixels travel to the
    device as bytes, and :class:`NatureCNN` scales them there). On CUDA through pinned
    memory (:func:`host_to_device`)."""
    if image:
        return host_to_device(obs, device)
    flat = np.asarray(obs).reshape(len(obs), -1)
    return host_to_device(flat, device, torch.float32)


TORSOS = ("auto", "mlp", "nature", "board", "board_lines", "board_drops")
"""What ``[algo] torso`` may say besides a custom ``"module:Class"`` (:func:`custom_torso`):
"auto" picks "nature" for image observations (see :func:`is_image_space`) and "mlp"
otherwise; "board", "board_lines" and "board_drops" are in :data:`BOARD_TORSOS`."""
BOARD_TORSO = "tianji.algorithms._board:BoardCNN"
"""The board games' convolution (``algorithms/_board.py``), built as a custom torso."""
BOARD_LINES_TORSO = "tianji.algorithms._board:BoardLinesCNN"
"""The board games' convolution that also sees where each side would complete a line."""
BOARD_DROPS_TORSO = "tianji.algorithms._board:BoardDropsCNN"
"""That, and per column what a piece dropped there would complete (connect four)."""
BOARD_TORSOS = {
    "board": BOARD_TORSO,
    "board_lines": BOARD_LINES_TORSO,
    "board_drops": BOARD_DROPS_TORSO,
}
"""The board games' torsos by ``[algo] torso`` name."""


def is_custom(torso: str) -> bool:
    """Whether ``torso`` names a user class (``"package.module:Class"``, ``"file.py:Class"``)."""
    return ":" in torso


def custom_torso(key: str, spec: str, observation_space: Any) -> tuple[nn.Module, int]:
    """The user's torso and its output size: ``Class(observation_space)``, a
    ``torch.nn.Module`` with an int attribute ``features``, taking what the built-in torsos
    take (float32 ``[B, D]`` flattened vectors, or uint8 images as the env gives them).

    Raises:
        ConfigError: naming ``key`` and the spec when it cannot be imported or built, or
            the object is not such a module.
    """
    from tianji.rl.registry import load_object

    cls = load_object(spec)
    try:
        torso = cls(observation_space)
    except Exception as exc:  # the user's constructor: any failure is a config error
        raise ConfigError(key, spec, f"a class taking the observation space ({exc})") from exc
    features = getattr(torso, "features", None)
    if not isinstance(torso, nn.Module) or type(features) is not int or features <= 0:
        why = "a torch.nn.Module class with an int attribute `features` (its output size)"
        raise ConfigError(key, spec, why)
    return torso, features


def is_image_space(space: Any) -> bool:
    """Whether ``space`` holds images: a uint8 Box of 2 (H, W) or 3 (C, H, W / H, W, C)
    dimensions, each side at least 36 pixels (what :class:`NatureCNN` can take)."""
    from gymnasium import spaces

    if not isinstance(space, spaces.Box) or space.dtype != np.uint8:
        return False
    shape = tuple(space.shape)
    return len(shape) in (2, 3) and sorted(shape)[-2] >= 36


def resolve_torso(key: str, torso: str, observation_space: Any) -> str:
    """``torso`` with "auto" resolved for ``observation_space``.

    Raises:
        ConfigError: for a torso name not in :data:`TORSOS`, "nature" for observations
            that are not images, or "board" for observations that are not boards.
    """
    if is_custom(torso):
        return torso
    if torso not in TORSOS:
        raise ConfigError(key, torso, f"one of {', '.join(TORSOS)}, or 'module:Class'")
    image = is_image_space(observation_space)
    if torso == "auto":
        return "nature" if image else "mlp"
    if torso == "nature" and not image:
        why = f'"mlp" or "auto" for observations {observation_space!r} (not uint8 images)'
        raise ConfigError(key, torso, why)
    if torso in BOARD_TORSOS:
        shape = board_shape(observation_space)
        if shape is None:
            why = f'"mlp" or "auto" for {observation_space!r} (not [H, W, C] piece planes)'
            raise ConfigError(key, torso, why)
        if torso != "board" and shape[2] != 2:
            why = f'"board" for {observation_space!r} (line planes need 2 piece planes)'
            raise ConfigError(key, torso, why)
        return BOARD_TORSOS[torso]
    return torso


class NatureCNN(nn.Module):
    """The Nature-DQN torso: three conv layers and a 512-unit layer, ReLU throughout.

    Takes uint8 images ``[B, C, H, W]`` (channels-last ``[B, H, W, C]`` and single-channel
    ``[B, H, W]`` are arranged first) and scales them to [0, 1] on the module's device,
    so the pixels cross process boundaries and the host-to-device copy as bytes.
    """

    features = 512

    def __init__(self, obs_shape: Sequence[int]) -> None:
        super().__init__()
        shape = tuple(obs_shape)
        self.layout = _image_layout(shape)
        channels = 1 if self.layout == "hw" else shape[-1] if self.layout == "hwc" else shape[0]
        gain = math.sqrt(2)
        self.convs = nn.Sequential(
            _conv(channels, 32, 8, 4, gain), nn.ReLU(),
            _conv(32, 64, 4, 2, gain), nn.ReLU(),
            _conv(64, 64, 3, 1, gain), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        with torch.no_grad():
            n = self.convs(self._arrange(torch.zeros(1, *shape, dtype=torch.uint8))).shape[1]
        self.fc = nn.Sequential(_linear(n, self.features, gain), nn.ReLU())

    def _arrange(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "hw":
            x = x.unsqueeze(1)
        elif self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        return x.float() / 255.0 if x.dtype == torch.uint8 else x.float()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, 512]`` features of a batch of images."""
        out: torch.Tensor = self.fc(self.convs(self._arrange(obs)))
        return out


def build_network(
    torso: str,
    observation_space: Any,
    hidden: Sequence[int],
    out_dim: int,
    *,
    activation: type[nn.Module] = nn.ReLU,
    out_gain: float | None = None,
) -> nn.Module:
    """The model builder of the in-tree algorithms: observation -> ``out_dim`` outputs;
    over masked observations (:class:`~tianji.rl.masks.MaskedObs`) a
    :class:`MaskedNetwork`, whose illegal actions' outputs are :data:`MASK_FILL`.

    Args:
        torso: a resolved torso (:func:`resolve_torso`): "nature" gives
            :class:`NatureCNN` and a linear head (``hidden`` unused: its 512-unit layer is
            the hidden layer), "mlp" an :func:`mlp` over the flattened observation, a
            ``"module:Class"`` the user's torso (:func:`custom_torso`) and a linear head.
        activation, out_gain: as for :func:`mlp` (the CNN head gets ``out_gain`` too).
    """
    net = _plain_network(torso, observation_space, hidden, out_dim, activation, out_gain)
    n = mask_size(observation_space)
    return MaskedNetwork(net, n) if n else net


def _plain_network(
    torso: str,
    observation_space: Any,
    hidden: Sequence[int],
    out_dim: int,
    activation: type[nn.Module],
    out_gain: float | None,
) -> nn.Sequential:
    shape = tuple(observation_space.shape)
    if torso == "nature":
        return nn.Sequential(NatureCNN(shape), _linear(NatureCNN.features, out_dim, out_gain))
    if is_custom(torso):
        body, features = custom_torso("algo.torso", torso, observation_space)
        return nn.Sequential(body, _linear(features, out_dim, out_gain))
    return mlp(flat_dim(shape), hidden, out_dim, activation=activation, out_gain=out_gain)


def _image_layout(shape: tuple[int, ...]) -> str:
    """ "hw", "chw" or "hwc": channels-last when the last side is a channel count (<= 4)
    and the first is not."""
    if len(shape) == 2:
        return "hw"
    return "hwc" if shape[-1] <= 4 < shape[0] else "chw"


def _conv(a: int, b: int, kernel: int, stride: int, gain: float) -> nn.Conv2d:
    layer = nn.Conv2d(a, b, kernel, stride)
    nn.init.orthogonal_(layer.weight, gain)
    assert layer.bias is not None  # Conv2d has one unless bias=False
    nn.init.zeros_(layer.bias)
    return layer


def numpy_weights(module: nn.Module) -> dict[str, np.ndarray]:
    """A module's parameters and buffers as contiguous numpy copies, keyed by state-dict name."""
    return {
        k: np.ascontiguousarray(v.detach().cpu().numpy()).copy()
        for k, v in module.state_dict().items()
    }


def load_numpy_weights(module: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Load weights made by :func:`numpy_weights` (all keys must match).

    Raises:
        ValueError: naming missing or unexpected keys, or a shape mismatch.
    """
    own = module.state_dict()
    missing, extra = sorted(own.keys() - weights.keys()), sorted(weights.keys() - own.keys())
    if missing or extra:
        raise ValueError(f"weights do not match the network: missing {missing}, extra {extra}")
    with torch.no_grad(), warnings.catch_warnings():
        # weights from a shared-memory board are read-only views: only read here
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        for k, v in own.items():
            src = torch.as_tensor(np.asarray(weights[k]))
            if tuple(src.shape) != tuple(v.shape):
                raise ValueError(f"weight {k}: shape {tuple(src.shape)} != {tuple(v.shape)}")
            v.copy_(src)


def gradient_step(
    loss: torch.Tensor,
    params: Sequence[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    sync: GradientSync | None,
    max_grad_norm: float,
) -> torch.Tensor:
    """One optimizer step on ``loss``: clear the gradients, backpropagate, average them over
    the data-parallel learners (``sync``, see :func:`sync_gradients`), clip their norm to
    ``max_grad_norm``, step.

    Returns:
        The gradients' total norm before clipping.
    """
    optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(loss)
    if sync is not None:  # data-parallel learners: average, then clip
        sync_gradients(params, sync)
    norm = nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return norm


def sync_gradients(params: Sequence[nn.Parameter], sync: GradientSync) -> None:
    """Replace the gradients of ``params`` by what ``sync`` makes of them, flattened.

    A hook that reduces tensors in place on their device
    (:class:`tianji.services.collective.CollectiveSync`) gets them as they are. Otherwise
    all gradients travel as one float32 vector (in ``params`` order) and come back
    averaged over the data-parallel learners. A parameter without a gradient contributes
    zeros and gets the averaged gradient, so every learner steps every parameter alike.

    Raises:
        ValueError: if ``sync`` returns a vector of another size.
    """
    grads = [
        p.grad if p.grad is not None else torch.zeros_like(p, memory_format=torch.contiguous_format)
        for p in params
    ]
    in_place = getattr(sync, "all_reduce_tensors", None)  # a collective on their device type
    if in_place is not None and all(g.device.type == sync.device_type for g in grads):  # type: ignore[attr-defined]
        in_place(grads)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        return
    flat = torch.cat([g.detach().reshape(-1).to("cpu", torch.float32) for g in grads])
    out = np.asarray(sync(flat.numpy()), dtype=np.float32)
    if out.shape != (flat.numel(),):
        raise ValueError(f"gradient sync returned shape {out.shape}, expected ({flat.numel()},)")
    averaged = torch.from_numpy(out)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        g.copy_(averaged[offset : offset + n].view_as(g))
        p.grad = g
        offset += n


def polyak_update(online: nn.Module, target: nn.Module, tau: float) -> None:
    """Move ``target``'s parameters toward ``online``'s by ``tau`` (1: copy them)."""
    with torch.no_grad():
        for p, t in zip(online.parameters(), target.parameters(), strict=True):
            t.lerp_(p, tau)
