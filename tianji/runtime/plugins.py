"""Plug-in loading, in one place: ``"module:attr"`` / ``"file.py:attr"`` factories and the
entry-point registries of transports (``tianji.transports``) and algorithms
(``tianji.algorithms``).

A :class:`Registry` maps names to classes: in-tree ones (imported on first use), ones
registered in code, and third parties' entry points::

    # in the third party's pyproject.toml
    [project.entry-points."tianji.transports"]
    quic = "tianji_quic:QuicTransport"
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import socket
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from tianji.runtime.core import Transport
from tianji.runtime.errors import ConfigError, RegistryError

__all__ = [
    "Registry",
    "TRANSPORTS",
    "free_tcp_port",
    "load_factory",
    "register_transport",
    "split_address",
    "transport",
    "transport_for",
]


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def load_factory(spec: str) -> Any:
    """Resolve ``"module:attr"`` or ``"file.py:attr"``.

    Raises:
        ConfigError: naming the spec, if the module or attribute cannot be found.
    """
    module_name, _, attr = spec.partition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            name = f"tianji_user.{path.stem}"
            module = sys.modules.get(name)
            if module is None or getattr(module, "__file__", None) != str(path):
                mod_spec = importlib.util.spec_from_file_location(name, path)
                if mod_spec is None or mod_spec.loader is None:
                    raise ImportError(f"cannot load {path}")
                module = importlib.util.module_from_spec(mod_spec)
                sys.modules[name] = module  # dataclasses and pickling-free typing need it
                mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError, OSError) as exc:
        raise ConfigError("factory", spec, f"an importable 'module:attribute' ({exc})") from None


class Registry:
    """Names -> plug-in classes (or factories) of one kind.

    Args:
        kind: what the plug-ins are ("transport", "algorithm"), for error messages.
        group: the entry-point group third parties register under.
        builtin: in-tree names -> ``"module:attr"``, imported on first use.
    """

    def __init__(self, kind: str, group: str, builtin: Mapping[str, str]) -> None:
        self.kind = kind
        self.group = group
        self.builtin = dict(builtin)
        self._registered: dict[str, Any] = {}

    def register(self, name: str, factory: Any) -> None:
        """Register ``factory`` under ``name`` (overrides a previous one)."""
        self._registered[name] = factory

    def entry_points(self) -> dict[str, str]:
        """The third parties' ``name -> "module:attr"`` in this registry's group."""
        return {ep.name: ep.value for ep in entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Every known name: in-tree, registered in code, and from entry points."""
        return sorted({*self.builtin, *self._registered, *self.entry_points()})

    def get(self, name: str, *, specs: bool = False) -> Any:
        """The plug-in registered as ``name`` (with ``specs``, also a ``module:attr``).

        Raises:
            RegistryError: naming the unknown name and the closest known ones.
        """
        if name in self._registered:
            return self._registered[name]
        spec = self.builtin.get(name) or self.entry_points().get(name)
        if spec is None and specs and ":" in name:
            spec = name
        if spec is None:
            known = self.names()
            raise RegistryError(
                self.kind, name, difflib.get_close_matches(name, known, n=3) or known
            )
        factory = load_factory(spec)
        self._registered[name] = factory
        return factory


TRANSPORTS = Registry(
    "transport",
    "tianji.transports",
    {
        "inproc": "tianji.transports.inproc:InprocTransport",
        "tcp": "tianji.transports.tcp:TcpTransport",
        "shm": "tianji.transports.shm:ShmTransport",
    },
)
"""Address scheme -> transport class (or zero-argument factory)."""

_transports: dict[str, Transport] = {}


def transport(scheme: str) -> Transport:
    """The (shared) transport instance for ``scheme``.

    Raises:
        RegistryError: if no transport is known under ``scheme`` (or its factory builds a
            transport of another scheme).
    """
    found = _transports.get(scheme)
    if found is not None:
        return found
    made: Transport = TRANSPORTS.get(scheme)()
    if made.scheme != scheme:
        raise RegistryError("transport", scheme, TRANSPORTS.names())
    _transports[scheme] = made
    return made


def register_transport(scheme: str, factory: Any) -> None:
    """Register a transport factory for ``scheme`` (overrides a previous one)."""
    TRANSPORTS.register(scheme, factory)
    _transports.pop(scheme, None)


def split_address(address: str) -> tuple[str, str]:
    """Split ``"scheme://rest"`` into ``("scheme", "rest")``.

    Raises:
        ConfigError: if the address has no ``scheme://`` prefix.
    """
    scheme, sep, rest = address.partition("://")
    if not sep or not scheme:
        raise ConfigError("address", address, "an address like tcp://HOST:PORT or inproc://NAME")
    return scheme, rest


def transport_for(address: str) -> Transport:
    """The transport that serves ``address`` (by its scheme)."""
    return transport(split_address(address)[0])
