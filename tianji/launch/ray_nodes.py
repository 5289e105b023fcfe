"""Where a Ray run's services landed, and the params relays and heartbeat aggregators
that follow from it.

On a cluster of several nodes the params service would send every new version of the
weights to every actor and inference service, most of them on other nodes: one copy per
subscriber across the network. Once Ray has placed the run's services,
:func:`relay_specs` plans one params relay (:class:`~tianji.services.params.ParamsRelay`)
on each node that hosts services taking the weights (actors, inference services, eval
workers) but not the params service they take them from; the controller then points that
node's subscribers at the relay (it shares their locality), so each version crosses to
the node once. A population run gets one relay per member and node (the relay of member
``m1`` carries ``m1``'s weights only).

A large run (``ray.aggregate_from`` services or more) also gets one heartbeat aggregator
on each node that hosts any of its services (:func:`aggregator_specs`): the node's
services heartbeat through it, and the controller receives one batch per node and flush
instead of one message per service.

:class:`Node` is what the launcher knows of a service's node (id and
IP), reported by the actor itself once it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Final

from tianji.launch.spec import ServiceSpec
from tianji.runtime.aggregator import DEFAULT_FLUSH_INTERVAL
from tianji.runtime.controller import AGGREGATOR_ROLE, RELAY_ROLE
from tianji.runtime.scope import full_name

__all__ = ["PARAMS_TAKERS", "Node", "aggregator_specs", "relay_specs"]

PARAMS_TAKERS: Final = ("actor", "inference", "eval")
"""The roles that subscribe to the params service's weights."""

RELAY_FACTORY: Final = "tianji.services.params:ParamsRelay"
AGGREGATOR_FACTORY: Final = "tianji.runtime.aggregator:HeartbeatAggregator"


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """A Ray node a service runs on."""

    node_id: str
    ip: str


def _scope(spec: ServiceSpec) -> str:
    scope = spec.options.get("scope", "")
    return scope if isinstance(scope, str) else ""


def relay_specs(
    specs: Sequence[ServiceSpec], nodes: Mapping[str, Node]
) -> list[tuple[ServiceSpec, Node]]:
    """The relays a placed run needs (see the module docstring), each with its node.

    Args:
        specs: the run's services.
        nodes: the node of each placed service, by service name (services not in it are
            not placed yet and are left out).

    A relay is named ``relay-<k>`` (``<scope>.relay-<k>`` in a population), numbered in
    the order of its node's IP, and binds like its params service.
    """
    out: list[tuple[ServiceSpec, Node]] = []
    for params in (s for s in specs if s.role == "params" and s.name in nodes):
        scope, home = _scope(params), nodes[params.name]
        takers = {
            nodes[s.name]
            for s in specs
            if s.role in PARAMS_TAKERS and _scope(s) == scope and s.name in nodes
        }
        remote = sorted((n for n in takers if n.node_id != home.node_id), key=lambda n: n.ip)
        for k, node in enumerate(remote):
            relay = dataclasses.replace(
                params,
                name=full_name(scope, f"{RELAY_ROLE}-{k}"),
                role=RELAY_ROLE,
                factory=RELAY_FACTORY,
                options={"scope": scope} if scope else {},
            )
            out.append((relay, node))
    return out


def aggregator_specs(
    specs: Sequence[ServiceSpec],
    nodes: Mapping[str, Node],
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
) -> list[tuple[ServiceSpec, Node]]:
    """One heartbeat aggregator per node that hosts any of ``specs`` (placed ones, by
    ``nodes``), named ``aggregator-<k>`` in the order of the nodes' IPs, flushing every
    ``flush_interval`` seconds; it binds like the first service placed on its node."""
    first: dict[Node, ServiceSpec] = {}
    for spec in specs:
        node = nodes.get(spec.name)
        if node is not None and spec.role != AGGREGATOR_ROLE:
            first.setdefault(node, spec)
    placed = sorted(first, key=lambda n: n.ip)
    return [
        (
            ServiceSpec(
                name=f"{AGGREGATOR_ROLE}-{k}",
                role=AGGREGATOR_ROLE,
                factory=AGGREGATOR_FACTORY,
                options={"flush_interval": flush_interval},
                bind=first[node].bind,
            ),
            node,
        )
        for k, node in enumerate(placed)
    ]
