"""Which torch device a learner or an inference service computes on, checked on its host.

``"auto"`` takes CUDA when the host has it; with K data-parallel learners (or several
inference services) on one host, each takes its own GPU: ``cuda:{index % n}`` for the
host's ``n`` visible CUDA devices (under Ray, which sets ``CUDA_VISIBLE_DEVICES`` per
actor, that is the one GPU Ray assigned). ``"cuda"`` is the same without the CPU fallback;
``"cuda:N"`` and ``"cpu"`` are taken as given. A device the host does not have is refused
before the service starts, naming the service and the device.

Usage::

    device = resolve_device("learner-1", config.learner.device, index=1)   # "cuda:1" or "cpu"
"""

from __future__ import annotations

import torch

from tianji.runtime.errors import ConfigError

__all__ = ["resolve_device", "set_cuda_device", "torch_device"]


def resolve_device(who: str, device: str, *, index: int = 0) -> str:
    """The device service ``who`` (``index`` among its role on this host) computes on.

    Raises:
        ConfigError: keyed ``"<who> device"``, for a name torch does not know, a CUDA
            device on a host without CUDA, or a CUDA index the host does not have.
    """
    key = f"{who} device"
    if device == "auto":
        return _cuda(index, torch.cuda.device_count()) if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(key, device, '"auto", "cpu", "cuda" or "cuda:N"') from None
    if parsed.type != "cuda":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(key, device, '"cpu" or "auto": this host has no CUDA device')
    if parsed.index is None:
        return _cuda(index, count)
    if parsed.index >= count:
        have = "cuda:0" if count == 1 else f"cuda:0 .. cuda:{count - 1}"
        raise ConfigError(key, device, f"{have} (this host has {count} CUDA devices) or cpu")
    return device


def _cuda(index: int, count: int) -> str:
    return f"cuda:{index % max(count, 1)}"


def torch_device(device: str) -> torch.device:
    """``device`` (a resolved name) as a ``torch.device``."""
    return torch.device(device)


def set_cuda_device(device: str) -> None:
    """Make ``device`` the thread's current CUDA device (NCCL works on it)."""
    torch.cuda.set_device(torch.device(device))
