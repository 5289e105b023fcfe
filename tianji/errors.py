"""Public import path ``tianji.errors``: the error classes, re-exported from
:mod:`tianji.runtime.errors`.

Kept for users' code (``from tianji.errors import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.runtime import errors as _0
from tianji.runtime.errors import *  # noqa: F403

__all__ = list(_0.__all__)
