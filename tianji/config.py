"""Public import path ``tianji.config``: the run config sections and ``load_config``, re-
exported from :mod:`tianji.rl.config`, :mod:`tianji.run.config`.

Kept for users' code (``from tianji.config import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.rl import config as _0
from tianji.rl.config import *  # noqa: F403
from tianji.run import config as _1
from tianji.run.config import *  # noqa: F403

__all__ = list(_0.__all__ + _1.__all__)
