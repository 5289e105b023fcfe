"""How a service is described for launching: a JSON-safe :class:`ServiceSpec`."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tianji.runtime.errors import ConfigError
from tianji.runtime.plugins import load_factory
from tianji.runtime.scope import split_name
from tianji.runtime.service import Service

__all__ = ["ServiceSpec", "build_service", "load_factory"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSpec:
    """One service of a launch graph.

    Attributes:
        name: unique service name in the run.
        factory: ``"package.module:Class"`` or ``"path/to/file.py:Class"``; called as
            ``factory(name, bind=..., controller=..., **options)``.
        options: JSON-serializable keyword arguments for the factory.
        bind: listen address of the service (port 0 picks a free port).
        controller: the controller address (the launcher fills it in).
        advertise: the host registered in place of the bind host (``""``: the bind host).
        local_bind: a second listener for services on the same host (``""``: none).
        role: what the service is (``actor``, ``learner``, ...): the one place a service's
            role is known before it registers. Unset, the name's part before its last
            ``-`` (``actor-3`` -> ``actor``).
    """

    name: str
    factory: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    bind: str = "tcp://127.0.0.1:0"
    controller: str = ""
    advertise: str = ""
    local_bind: str = ""
    role: str = ""

    def __post_init__(self) -> None:
        if not self.role:
            object.__setattr__(self, "role", self.name.rsplit("-", 1)[0])
        if not self.name or "/" in self.name:
            raise ConfigError("service.name", self.name, "a non-empty name without '/'")
        if ":" not in self.factory:
            raise ConfigError(f"{self.name}.factory", self.factory, "'module:attribute'")
        try:
            json.dumps(self.options)
        except TypeError as exc:
            raise ConfigError(
                f"{self.name}.options", self.options, f"JSON values ({exc})"
            ) from None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServiceSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ConfigError("service", sorted(unknown), f"only keys {sorted(fields)}")
        return cls(**data)


def build_service(spec: ServiceSpec) -> Service:
    """Instantiate the service a spec describes.

    Raises:
        ConfigError: if the factory is unknown, rejects the options or builds no Service.
    """
    factory = load_factory(spec.factory)
    placement: dict[str, Any] = {}
    if spec.advertise:
        placement["advertise"] = spec.advertise
    if spec.local_bind:
        placement["local_bind"] = spec.local_bind
    # a scoped service's factory gets its local name (services compute their peers' names
    # and check their own from it); the Service base class registers the full name
    scope = spec.options.get("scope", "")
    try:
        service = factory(
            split_name(spec.name, scope) if isinstance(scope, str) else spec.name,
            bind=spec.bind,
            controller=spec.controller or None,
            **placement,
            **spec.options,
        )
    except TypeError as exc:
        raise ConfigError(
            f"{spec.name}.options", spec.options, f"arguments {spec.factory} takes ({exc})"
        ) from None
    if not isinstance(service, Service):
        raise ConfigError(f"{spec.name}.factory", spec.factory, "a factory returning a Service")
    return service
