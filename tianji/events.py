"""Public import path ``tianji.events``: the typed events (runtime control events and RL
events), re-exported from :mod:`tianji.runtime.events`, :mod:`tianji.rl.events`.

Kept for users' code (``from tianji.events import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.rl import events as _1
from tianji.rl.events import *  # noqa: F403
from tianji.runtime import events as _0
from tianji.runtime.events import *  # noqa: F403

__all__ = list(_0.__all__ + _1.__all__)
