"""Public import path ``tianji.controller``: the controller and its balancer plug-in, re-
exported from :mod:`tianji.runtime.controller`, :mod:`tianji.services.balancer`.

Kept for users' code (``from tianji.controller import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.runtime import controller as _0
from tianji.runtime.controller import *  # noqa: F403
from tianji.services import balancer as _1
from tianji.services.balancer import *  # noqa: F403

__all__ = list(_0.__all__ + _1.__all__)
