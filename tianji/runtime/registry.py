"""The controller's registry and latest heartbeats as dicts that log their changes
(:class:`Registry`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["Registry", "Stamp", "stamp", "unchanged"]

V = TypeVar("V")

LOG_SLACK = 4096
"""Changes the log keeps beyond four per entry before it forgets its older half."""


Stamp = tuple[Mapping[str, Any], int]
"""A mapping as a reader last saw it: the mapping itself (held, so a new mapping that reuses
a freed one's id is never taken for it) and its :attr:`Registry.version` then."""


def stamp(mapping: Mapping[str, Any]) -> Stamp | None:
    """``mapping``'s stamp now; None for a mapping that does not count its changes."""
    version = getattr(mapping, "version", None)
    return None if version is None else (mapping, version)


def unchanged(mapping: Mapping[str, Any], seen: Stamp | None) -> bool:
    """Whether ``mapping`` is the one ``seen`` was taken of and has not changed since."""
    return seen is not None and seen[0] is mapping and seen[1] == getattr(mapping, "version", None)


class Registry(dict[str, V]):
    """A dict that counts its changes (``version``) and logs which keys they touched, so a
    controller plug-in can tell in O(1) that no service came or went since its last look,
    and read only the heartbeats that changed (:meth:`changed_since`) instead of checking
    every entry on every decision. Reads are a plain dict's; every way of changing it is
    counted (bulk changes, ``update`` or ``clear``, are counted but not logged: a reader
    from before them reads everything again)."""

    version = 0

    def __init__(self) -> None:
        super().__init__()
        self._log: list[str] = []  # keys set or removed, the last len(_log) changes
        self._base = 0  # the version before the oldest change in the log

    def changed_since(self, version: int) -> list[str] | None:
        """The keys set or removed since ``version`` (a :attr:`version` read before them;
        a key may repeat), or None when the log no longer reaches back that far."""
        if version < self._base or version > self.version:
            return None
        return self._log[version - self._base :]

    def _logged(self, name: str) -> None:
        self.version += 1
        log = self._log
        log.append(name)
        if len(log) > 4 * len(self) + LOG_SLACK:  # forget the older half
            half = len(log) // 2
            del log[:half]
            self._base += half

    def _unlogged(self) -> None:
        self.version += 1
        self._log.clear()
        self._base = self.version

    def __setitem__(self, name: str, value: V) -> None:
        super().__setitem__(name, value)
        self._logged(name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._logged(name)

    def pop(self, name: str, *default: Any) -> Any:
        self._logged(name)
        return super().pop(name, *default)

    def popitem(self) -> tuple[str, V]:
        item = super().popitem()
        self._logged(item[0])
        return item

    def clear(self) -> None:
        super().clear()
        self._unlogged()

    def update(self, *args: Any, **kwargs: V) -> None:
        super().update(*args, **kwargs)
        self._unlogged()

    def setdefault(self, name: str, default: Any = None) -> Any:
        self._logged(name)
        return super().setdefault(name, default)
