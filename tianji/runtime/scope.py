"""Scopes: several groups of services in one run, each seeing only its own topics.

A population run (``[population]``) runs one group of services per member — its params
service, buffers, learners, inference services, actors, evaluation workers and monitor —
beside the other members' groups, under one controller. Each group is a *scope* (``m0``,
``m1``, ...). A scoped service:

* is registered, heartbeats and is commanded under its **full name** ``<scope>.<name>``
  (``m1.learner-0``), which is unique in the run;
* keeps its **local name** (``learner-0``) as ``Service.name``: the RL services compute the
  names and topics of their peers from indices (``learner_name(0)``, ``batches_topic``), and
  those stay exactly what they are in a single-policy run;
* publishes and subscribes to its scope's topics (:func:`scoped_topic`) for every topic it
  names, so the members' data never meet: no sample of one member can reach another
  member's learner.

Seen from the controller, a member's services are those whose full name starts with its
scope; :func:`local_view` strips it off, so code written for one policy (the balancer, the
books, the progress snapshot) reads a member's heartbeats as if it were a whole run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Generic, TypeVar

from tianji.runtime.errors import ConfigError
from tianji.runtime.registry import Registry

__all__ = [
    "SEPARATOR",
    "ScopedViews",
    "check_scope",
    "full_name",
    "local_view",
    "scope_of",
    "scoped_topic",
    "split_name",
    "unscoped_topic",
]

SEPARATOR = "."
"""Between a scope and a service's local name, or a topic."""
_SCOPE = re.compile(r"[a-z][a-z0-9_]{0,31}")

V = TypeVar("V")


def check_scope(scope: str) -> str:
    """``scope`` if it is a valid scope name (lower-case letters, digits, ``_``).

    Raises:
        ConfigError: naming the scope otherwise.
    """
    if scope and not _SCOPE.fullmatch(scope):
        raise ConfigError("scope", scope, "lower-case letters, digits and _ (e.g. 'm0')")
    return scope


def full_name(scope: str, name: str) -> str:
    """``<scope>.<name>`` (``name`` itself without a scope)."""
    return f"{scope}{SEPARATOR}{name}" if scope else name


def split_name(name: str, scope: str) -> str:
    """The local name of ``name`` in ``scope``: ``m1.learner-0`` -> ``learner-0``; a name
    that is already local (no scope prefix) is returned as it is.

    Raises:
        ConfigError: for a name with another scope's prefix.
    """
    if not scope:
        return name
    prefix = scope + SEPARATOR
    if name.startswith(prefix):
        return name[len(prefix) :]
    if SEPARATOR in name.split("#", 1)[0]:
        raise ConfigError("name", name, f"a service name in scope {scope!r} ({prefix}...)")
    return name


def scope_of(name: str) -> str:
    """The scope of a full service name (``""`` for an unscoped one)."""
    head, dot, _ = name.partition(SEPARATOR)
    return head if dot and _SCOPE.fullmatch(head) else ""


def scoped_topic(scope: str, topic: str) -> str:
    """The topic ``topic`` of ``scope`` on the wire: ``@<scope>`` right after the event
    type (which stays the first ``/`` part): ``SampleBatch/learner-0`` in ``m1`` is
    ``SampleBatch/@m1/learner-0``."""
    if not scope:
        return topic
    kind, sep, rest = topic.partition("/")
    return f"{kind}/@{scope}/{rest}" if sep else f"{kind}/@{scope}"


def unscoped_topic(scope: str, topic: str) -> str:
    """The inverse of :func:`scoped_topic` (a topic of no scope is returned as it is)."""
    if not scope:
        return topic
    kind, _, rest = topic.partition("/")
    mark = f"@{scope}"
    if rest == mark:
        return kind
    if rest.startswith(mark + "/"):
        return f"{kind}/{rest[len(mark) + 1 :]}"
    return topic


def local_view(values: Mapping[str, V], scope: str) -> dict[str, V]:
    """The entries of ``values`` (keyed by full service names) in ``scope``, keyed by
    their local names (``m1.actor-0#2`` -> ``actor-0#2``)."""
    prefix = scope + SEPARATOR
    n = len(prefix)
    return {k[n:]: v for k, v in values.items() if k.startswith(prefix)}


class ScopedViews(Generic[V]):
    """Every scope's :func:`local_view` of one mapping keyed by full names (the
    controller's heartbeats or registry), kept up to date cheaply: a call where no key
    came or went only re-files the entries whose value changed (an identity check per
    entry), instead of every scope filtering and re-keying every entry. A key that came or
    went re-files everything into fresh dicts (so a view being iterated is never resized).
    The views are :class:`~tianji.runtime.registry.Registry` dicts: their ``version`` moves
    with every entry re-filed, so a plug-in reading a member's registry view can tell that
    nobody came or went as cheaply as on the controller's own registry.

    Usage::

        views = ScopedViews()
        views.of(controller.heartbeats)["m1"]   # m1's heartbeats under local names
    """

    def __init__(self) -> None:
        self._seen: dict[str, V] = {}
        self._views: dict[str, dict[str, V]] = {}
        self._names: dict[str, tuple[str, str]] = {}  # full name -> (scope, local name)

    def of(self, values: Mapping[str, V]) -> dict[str, dict[str, V]]:
        """scope -> its entries under local names (unscoped entries under ``""``)."""
        seen = self._seen
        if seen.keys() != values.keys():
            self._refile(values)
            return self._views
        names, views = self._names, self._views
        for name, value in values.items():
            if seen[name] is not value:
                seen[name] = value
                scope, local = names[name]
                views[scope][local] = value
        return views

    def view(self, values: Mapping[str, V], scope: str) -> dict[str, V]:
        """``scope``'s entries of ``values`` under local names (empty when it has none)."""
        return self.of(values).get(scope, {})

    def _refile(self, values: Mapping[str, V]) -> None:
        views: dict[str, dict[str, V]] = {}
        for name, value in values.items():
            split = self._names.get(name)
            if split is None:
                scope = scope_of(name)
                split = self._names[name] = (scope, name[len(scope) + 1 :] if scope else name)
            view = views.get(split[0])
            if view is None:
                view = views[split[0]] = Registry()  # a registry's view counts changes too
            view[split[1]] = value
        self._views, self._seen = views, dict(values)
        if len(self._names) > 4 * len(values) + 1024:  # names that left long ago
            self._names = {n: self._names[n] for n in values}
