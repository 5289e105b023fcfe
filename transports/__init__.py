"""Transport registry: address scheme -> transport.

In-tree transports are listed in ``_BUILTIN`` and imported on first use. Third-party
packages add theirs through the entry-point group ``tianji.transports``::

    # in the third party's pyproject.toml
    [project.entry-points."tianji.transports"]
    quic = "tianji_quic:QuicTransport"

The entry point names a class (or zero-argument factory) returning a
:class:`tianji.core.Transport` whose ``scheme`` equals the entry-point name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from tianji.core import Transport
from tianji.errors import ConfigError, RegistryError

__all__ = ["get", "for_address", "names", "register", "split_address"]

ENTRY_POINT_GROUP = "tianji.transports"
_BUILTIN: dict[str, str] = {
    "inproc": "tianji.transports.inproc:InprocTransport",
    "tcp": "tianji.transports.tcp:TcpTransport",
    "shm": "tianji.transports.shm:ShmTransport",
}
_factories: dict[str, Callable[[], Transport]] = {}
_instances: dict[str, Transport] = {}


def register(scheme: str, factory: Callable[[], Transport]) -> None:
    """Register a transport factory for ``scheme`` (overrides a previous one)."""
    _factories[scheme] = factory
    _instances.pop(scheme, None)


def _load(spec: str) -> Callable[[], Transport]:
    module, _, attr = spec.partition(":")
    factory: Callable[[], Transport] = getattr(importlib.import_module(module), attr)
    return factory


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """All known schemes: in-tree, registered in code, and from entry points."""
    return sorted({*_BUILTIN, *_factories, *_entry_points()})


def get(scheme: str) -> Transport:
    """Return the (shared) transport instance for ``scheme``.

    Raises:
        RegistryError: if no transport is known under ``scheme``.
    """
    if scheme in _instances:
        return _instances[scheme]
    factory = _factories.get(scheme)
    if factory is None:
        spec = _BUILTIN.get(scheme) or _entry_points().get(scheme)
        if spec is None:
            raise RegistryError("transport", scheme, names())
        factory = _load(spec)
    transport = factory()
    if transport.scheme != scheme:
        raise RegistryError("transport", scheme, names())
    _instances[scheme] = transport
    return transport


def split_address(address: str) -> tuple[str, str]:
    """Split ``"scheme://rest"`` into ``("scheme", "rest")``.

    Raises:
        ConfigError: if the address has no ``scheme://`` prefix.
    """
    scheme, sep, rest = address.partition("://")
    if not sep or not scheme:
        raise ConfigError("address", address, "an address like tcp://HOST:PORT or inproc://NAME")
    return scheme, rest


def for_address(address: str) -> Transport:
    """Return the transport that serves ``address`` (by its scheme)."""
    return get(split_address(address)[0])
