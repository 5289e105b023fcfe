"""The heartbeat counters and gauges that cross process boundaries are declared once
(:mod:`tianji.rl.stats`) and never spelled as string literals elsewhere."""

from __future__ import annotations

import ast

from layers import sources

from tianji.rl import stats
from tianji.runtime.aggregation import RouteStat
from tianji.runtime.aggregator import AggregatorStat
from tianji.runtime.heartbeats import ServiceStat

DECLARED = {
    value: f"{cls.__name__}.{attr}"
    for cls in (
        stats.ActorStat,
        stats.BufferStat,
        stats.LearnerStat,
        stats.ParamsStat,
        stats.InferenceStat,
        stats.MonitorStat,
        stats.LeagueStat,
        stats.Dropped,
        ServiceStat,
        RouteStat,
        AggregatorStat,
    )
    for attr, value in vars(cls).items()
    if attr.isupper() and isinstance(value, str)
}


HEARTBEAT_MAPS = frozenset({"counters", "gauges"})
READERS = frozenset({"get", "pop", "setdefault"})


def _is_heartbeat_map(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in HEARTBEAT_MAPS) or (
        isinstance(node, ast.Name) and node.id in HEARTBEAT_MAPS
    )


def literal_uses(text: str) -> list[tuple[int, str]]:
    """Declared names spelled as string literals where a heartbeat is written or read:
    ``counters[...]``, ``gauges[...]``, ``counters.get(...)`` (also ``pop``,
    ``setdefault``) and the balancer's ``total(role, key)``; and ``lag/`` or ``dropped/``
    names anywhere."""
    found: list[tuple[int, str]] = []

    def check(node: ast.expr) -> None:
        if isinstance(node, ast.Constant) and node.value in DECLARED:
            found.append((node.lineno, node.value))

    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Subscript) and _is_heartbeat_map(node.value):
            check(node.slice)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in READERS
                and _is_heartbeat_map(func.value)
            ) or (isinstance(func, ast.Name) and func.id == "total"):
                for arg in node.args:
                    check(arg)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in DECLARED
            and "/" in node.value
        ):
            found.append((node.lineno, node.value))
    return sorted(set(found))


def test_every_shared_counter_name_is_declared_once() -> None:
    spelled = [
        f"{module}:{line} spells {value!r}: use stats.{DECLARED[value]}"
        for module, text in sources().items()
        if module not in ("tianji.rl.stats", "tianji.runtime.heartbeats")
        for line, value in literal_uses(text)
    ]
    assert spelled == []


def test_a_planted_literal_is_caught() -> None:
    assert literal_uses('hb.counters.get("samples_consumed", 0)\n') == [(1, "samples_consumed")]
    assert literal_uses('self.gauges["held_samples"] = 1.0\n') == [(1, "held_samples")]
    assert literal_uses('total("learner", "learner_updates")\n') == [(1, "learner_updates")]
    assert literal_uses('key.startswith("lag/")\n') == [(1, "lag/")]
    assert literal_uses('row = {"samples_consumed": 3}\n') == []
