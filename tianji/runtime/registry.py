"""The controller's registry as a dict that counts its changes (:class:`Registry`)."""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["Registry"]

V = TypeVar("V")


class Registry(dict[str, V]):
    """A dict that counts its changes (``version``: an entry set, anew or again, or
    removed, by any of dict's ways), so a controller plug-in can tell in O(1) that no
    service came or went since its last look instead of walking every record on every
    decision. Reads are a plain dict's."""

    version = 0

    def __setitem__(self, name: str, value: V) -> None:
        super().__setitem__(name, value)
        self.version += 1

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.version += 1

    def pop(self, name: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(name, *default)

    def popitem(self) -> tuple[str, V]:
        self.version += 1
        return super().popitem()

    def clear(self) -> None:
        self.version += 1
        super().clear()

    def update(self, *args: Any, **kwargs: V) -> None:
        self.version += 1
        super().update(*args, **kwargs)

    def setdefault(self, name: str, default: Any = None) -> Any:
        self.version += 1
        return super().setdefault(name, default)
