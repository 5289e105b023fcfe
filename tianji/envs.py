"""Public import path ``tianji.envs``: env construction, re-exported from
:mod:`tianji.rl.envs`.

Kept for users' code (``from tianji.envs import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.rl import envs as _0
from tianji.rl.envs import *  # noqa: F403

__all__ = list(_0.__all__)
