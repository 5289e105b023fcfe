"""The codec's field checks (:mod:`tianji.runtime.codec`): from an event class's
annotations, one generated function that names the first field of the wrong type.

The codec runs it on every event it encodes, so a sender learns of a wrong type at
``publish()`` rather than its peer dropping the link. Leaf types are checked by exact type
(``bool`` is not an ``int`` here) and containers of leaves without recursion; ``depth``
bounds nesting, so hostile input cannot exhaust the stack.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

from tianji.runtime.events import Event, EventInfo, event_info

__all__ = ["MAX_DEPTH", "PRIMITIVES", "Check", "event_check"]

MAX_DEPTH = 32
"""Nesting of tuples/maps inside a field value that is checked (deeper is refused)."""
PRIMITIVES = (type(None), bool, int, float, str, bytes, np.ndarray)
"""The leaf types a field typed ``Any`` may hold (with lists/tuples and str-keyed maps)."""


Check = Callable[[object, int], bool]


def event_check(info: EventInfo) -> Callable[[Event], str | None]:
    """One function that checks every field of an event class and returns the name of the
    first field of the wrong type (``None``: all good), generated from the annotations.

    Leaves and maps/tuples of leaves are checked inline (the common fields, e.g. a
    heartbeat's counters, cost tens of nanoseconds a value); other fields call their
    :func:`_compile`d check.
    """
    env: dict[str, Any] = {}
    lines = ["def check(ev):"]
    for i, name in enumerate(info.fields):
        hint = info.hints[name]
        lines.append(f"    v = ev.{name}")
        leaf = _plain_leaves(hint)
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        keys = _plain_leaves(args[0]) if origin in (dict, tuple) else None
        values = _plain_leaves(args[1]) if origin is dict else None
        if leaf is not None:
            lines.append(f"    if {_type_test('v', leaf, env, f'T{i}')}: return {name!r}")
        elif keys is not None and values is not None:
            key = _type_test("k", keys, env, f"K{i}")
            value = _type_test("x", values, env, f"V{i}")
            lines.append(f"    if type(v) is not dict: return {name!r}")
            lines.append("    for k, x in v.items():")
            lines.append(f"        if {key} or {value}: return {name!r}")
        elif origin is tuple and keys is not None and len(args) == 2 and args[1] is Ellipsis:
            item = _type_test("x", keys, env, f"I{i}")
            lines.append(f"    if type(v) is not tuple: return {name!r}")
            lines.append("    for x in v:")
            lines.append(f"        if {item}: return {name!r}")
        else:
            env[f"C{i}"] = _compile(hint)
            lines.append(f"    if not C{i}(v, {MAX_DEPTH}): return {name!r}")
    lines.append("    return None")
    exec("\n".join(lines), env)  # source built above from field names (identifiers) only
    check: Callable[[Event], str | None] = env["check"]
    return check


def _plain_leaves(hint: Any) -> frozenset[type] | None:
    leaf = _leaf_types(hint)
    return leaf if leaf is not None and np.ndarray not in leaf else None


def _type_test(var: str, types_: frozenset[type], env: dict[str, Any], slot: str) -> str:
    """Source that is true when ``var``'s exact type is not one of ``types_``."""
    if len(types_) == 1:
        env[slot] = next(iter(types_))
        return f"type({var}) is not {slot}"
    env[slot] = types_
    return f"type({var}) not in {slot}"


def _compile(hint: Any) -> Check:
    """Turn a field annotation into ``check(value, depth) -> bool``.

    Leaf types are checked by exact type (``bool`` is not an ``int`` here), containers of
    leaves without recursion, so the common fields cost a few hundred nanoseconds.
    ``depth`` bounds nesting, so hostile input cannot exhaust the stack.
    """
    if hint is Any or hint is object:
        return _is_plain
    if isinstance(hint, type) and issubclass(hint, Event):
        return _compile_event(hint)
    leaf = _leaf_types(hint)
    if leaf is not None:
        if np.ndarray in leaf:  # encode may see ndarray subclasses (np.memmap)
            return lambda v, d: type(v) in leaf or isinstance(v, np.ndarray)
        return lambda v, d: type(v) in leaf
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_compile(a) for a in args]
        return lambda v, d: any(c(v, d) for c in options)
    if origin is tuple:
        return _compile_tuple(args)
    if origin is dict:
        return _compile_dict(args[0], args[1])
    raise TypeError(f"event fields cannot be annotated {hint!r}")


def _compile_event(cls: type[Event]) -> Check:
    """An event held in another's field (a heartbeat in a batch): of that exact class,
    every field checked as the event's own."""
    info = event_info(cls.TYPE)
    if info is None or info.cls is not cls:
        raise TypeError(f"event fields cannot hold {cls!r}: not declared with @event")
    fields = event_check(info)
    return lambda v, d: type(v) is cls and fields(v) is None


def _compile_tuple(args: tuple[Any, ...]) -> Check:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _compile(args[0])

        def check_items(v: object, d: int) -> bool:
            if type(v) is not tuple or d <= 0:
                return False
            for x in v:  # noqa: SIM110 - a plain loop is ~2x faster than all(); hot path
                if not item(x, d - 1):
                    return False
            return True

        return check_items
    items = [_compile(a) for a in args]
    return lambda v, d: (
        d > 0
        and type(v) is tuple
        and len(v) == len(items)
        and all(c(x, d - 1) for c, x in zip(items, v, strict=True))
    )


def _compile_dict(key_hint: Any, value_hint: Any) -> Check:
    keys, values = _leaf_types(key_hint), _leaf_types(value_hint)
    key, val = _compile(key_hint), _compile(value_hint)
    if keys is not None and values is not None and np.ndarray not in values:

        def check_leaves(v: object, d: int) -> bool:
            if type(v) is not dict:
                return False
            for k, x in v.items():  # noqa: SIM110 - faster than all(); hot path
                if type(k) not in keys or type(x) not in values:
                    return False
            return True

        return check_leaves

    def check_nested(v: object, d: int) -> bool:
        if type(v) is not dict or d <= 0:
            return False
        for k, x in v.items():  # noqa: SIM110 - faster than all(); hot path
            if not (key(k, d - 1) and val(x, d - 1)):
                return False
        return True

    return check_nested


_LEAVES: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({float, int}),
    bool: frozenset({bool}),
    str: frozenset({str}),
    bytes: frozenset({bytes}),
    type(None): frozenset({type(None)}),
    None: frozenset({type(None)}),
    np.ndarray: frozenset({np.ndarray}),
}


def _leaf_types(hint: Any) -> frozenset[type] | None:
    """The exact types a leaf annotation (or a union of leaves) admits, else ``None``."""
    if hint in _LEAVES:
        return _LEAVES[hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_leaf_types(a) for a in typing.get_args(hint)]
        if all(p is not None for p in parts):
            return frozenset().union(*(p for p in parts if p is not None))
    return None


def _is_plain(value: object, depth: int) -> bool:
    """A value of an ``Any`` field: primitives, numeric numpy scalars, lists/tuples, str maps."""
    if isinstance(value, PRIMITIVES):
        return True
    if isinstance(value, (np.bool_, np.number)):
        return True  # sent as the Python scalar
    if depth <= 0:
        return False
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v, depth - 1) for k, v in value.items())
    return False
