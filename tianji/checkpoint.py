"""Public import path ``tianji.checkpoint``: the checkpoint format, re-exported from
:mod:`tianji.rl.checkpoint`.

Kept for users' code (``from tianji.checkpoint import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.rl import checkpoint as _0
from tianji.rl.checkpoint import *  # noqa: F403

__all__ = list(_0.__all__)
