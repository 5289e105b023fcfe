"""Public import path ``tianji.core``: the runtime's protocols and the RL vocabulary
(Algorithm, BufferSpec, UpdateResult, ...), re-exported from :mod:`tianji.runtime.core`,
:mod:`tianji.rl.algorithm`.

Kept for users' code (``from tianji.core import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.rl import algorithm as _1
from tianji.rl.algorithm import *  # noqa: F403
from tianji.runtime import core as _0
from tianji.runtime.core import *  # noqa: F403

__all__ = list(_0.__all__ + _1.__all__)
