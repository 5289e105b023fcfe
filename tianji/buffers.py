"""Public import path ``tianji.buffers``: the replay and rollout buffers, re-exported from
:mod:`tianji.rl.buffers`.

Kept for users' code (``from tianji.buffers import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.rl import buffers as _0
from tianji.rl.buffers import *  # noqa: F403

__all__ = list(_0.__all__)
