"""Params relays and heartbeat aggregators planned from where Ray placed a run's services
(:func:`tianji.launch.ray_nodes.relay_specs`, :func:`~tianji.launch.ray_nodes.aggregator_specs`),
and ``[ray] custom_resources`` and ``aggregate_from`` checked."""

from __future__ import annotations

import pytest

from tianji.launch.ray_nodes import Node, aggregator_specs, relay_specs
from tianji.launch.spec import ServiceSpec
from tianji.rl.config_ops import RayConfig
from tianji.runtime.aggregation import DEFAULT_FLUSH_INTERVAL
from tianji.runtime.controller import AGGREGATOR_ROLE, RELAY_ROLE
from tianji.runtime.errors import ConfigError

A, B, C = Node("a" * 8, "10.0.0.1"), Node("b" * 8, "10.0.0.2"), Node("c" * 8, "10.0.0.3")


def spec(name: str, role: str, scope: str = "") -> ServiceSpec:
    options = {"scope": scope} if scope else {}
    full = f"{scope}.{name}" if scope else name
    return ServiceSpec(name=full, role=role, factory="m:F", options=options, bind="tcp://0.0.0.0:0")


def test_one_relay_per_node_of_takers_without_their_params_service() -> None:
    specs = [
        spec("params-0", "params"), spec("learner-0", "learner"), spec("buffer-0", "buffer"),
        spec("actor-0", "actor"), spec("actor-1", "actor"), spec("actor-2", "actor"),
        spec("inference-0", "inference"), spec("eval-0", "eval"),
    ]  # fmt: skip
    nodes = {
        "params-0": A, "learner-0": A, "buffer-0": B,  # a buffer takes no weights
        "actor-0": A, "actor-1": C, "actor-2": C, "inference-0": C, "eval-0": C,
    }  # fmt: skip
    relays = relay_specs(specs, nodes)
    assert [(r.name, r.role, node) for r, node in relays] == [("relay-0", RELAY_ROLE, C)]
    relay = relays[0][0]
    assert relay.factory == "tianji.services.params:ParamsRelay"
    assert relay.bind == "tcp://0.0.0.0:0" and relay.options == {}
    nodes["eval-0"] = B  # B now hosts a taker too; relays are numbered by node IP
    assert [(r.name, n) for r, n in relay_specs(specs, nodes)] == [("relay-0", B), ("relay-1", C)]


def test_everything_on_the_params_node_or_not_placed_needs_no_relay() -> None:
    specs = [spec("params-0", "params"), spec("actor-0", "actor"), spec("actor-1", "actor")]
    assert relay_specs(specs, {"params-0": A, "actor-0": A, "actor-1": A}) == []
    assert relay_specs(specs, {"actor-0": B}) == []  # the params service is not placed yet
    assert relay_specs(specs, {"params-0": A}) == []


def test_a_population_gets_one_relay_per_member_and_node_in_the_members_scope() -> None:
    specs = [
        spec("params-0", "params", "m0"), spec("actor-0", "actor", "m0"),
        spec("params-0", "params", "m1"), spec("actor-0", "actor", "m1"),
    ]  # fmt: skip
    nodes = {"m0.params-0": A, "m0.actor-0": B, "m1.params-0": B, "m1.actor-0": B}
    relays = relay_specs(specs, nodes)  # m1's actor shares its params service's node
    assert [(r.name, r.options, n) for r, n in relays] == [("m0.relay-0", {"scope": "m0"}, B)]


def test_one_aggregator_per_node_that_hosts_any_service_numbered_by_ip() -> None:
    specs = [
        spec("params-0", "params"), spec("learner-0", "learner"), spec("actor-0", "actor"),
        spec("actor-1", "actor"), spec("relay-0", RELAY_ROLE), spec("actor-2", "actor"),
    ]  # fmt: skip
    nodes = {"params-0": C, "learner-0": C, "actor-0": A, "actor-1": A, "relay-0": A}
    planned = aggregator_specs(specs, nodes)  # actor-2 is not placed yet: B hosts nothing
    assert [(a.name, a.role, node) for a, node in planned] == [
        ("aggregator-0", AGGREGATOR_ROLE, A),
        ("aggregator-1", AGGREGATOR_ROLE, C),
    ]
    aggregator = planned[0][0]
    assert aggregator.factory == "tianji.runtime.aggregator:HeartbeatAggregator"
    assert aggregator.bind == "tcp://0.0.0.0:0"
    # ray.aggregate_flush_s's default
    assert aggregator.options == {"flush_interval": DEFAULT_FLUSH_INTERVAL}
    slower = aggregator_specs(specs, nodes, flush_interval=0.05)
    assert {a.options["flush_interval"] for a, _ in slower} == {0.05}
    assert aggregator_specs(specs, {}) == []
    placed = [*specs, *(a for a, _ in planned)]  # the aggregators themselves add no node
    with_own = {**nodes, "aggregator-0": A, "aggregator-1": C}
    assert [n for _, n in aggregator_specs(placed, with_own)] == [A, C]


@pytest.mark.parametrize("value", [-1, 1.5, "many", True])
def test_a_bad_aggregate_from_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ConfigError, match=r"ray\.aggregate_from"):
        RayConfig(aggregate_from=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -0.5, float("inf"), "fast", None])
def test_a_bad_aggregate_flush_interval_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ConfigError, match=r"ray\.aggregate_flush_s"):
        RayConfig(aggregate_flush_s=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("custom", "key"),
    [
        ({"learnr": {"trainer": 1}}, "ray.custom_resources.learnr"),
        ({"learner": {"CPU": 1}}, "ray.custom_resources.learner.CPU"),
        ({"learner": {"trainer": 0}}, "ray.custom_resources.learner.trainer"),
        ({"learner": {"trainer": "one"}}, "ray.custom_resources.learner.trainer"),
        ({"learner": 1}, "ray.custom_resources.learner"),
    ],
)
def test_bad_custom_resources_are_refused_naming_the_key(custom: object, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        RayConfig(custom_resources=custom)  # type: ignore[arg-type]
    assert info.value.key == key


def test_custom_resources_and_the_relays_reservation() -> None:
    config = RayConfig(custom_resources={"learner": {"trainer": 1}})
    assert config.custom("learner") == {"trainer": 1.0} and config.custom("actor") == {}
    cpus, gpus = config.resources(RELAY_ROLE)
    assert 0 < cpus <= 0.01 and gpus == 0  # not nothing: Ray ignores node affinity then
