"""Public import path ``tianji.codec``: the event codec, re-exported from
:mod:`tianji.runtime.codec`.

Kept for users' code (``from tianji.codec import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.runtime import codec as _0
from tianji.runtime.codec import *  # noqa: F403

__all__ = list(_0.__all__)
