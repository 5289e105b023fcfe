"""Public import path ``tianji.service``: the service base class, re-exported from
:mod:`tianji.runtime.service`.

Kept for users' code (``from tianji.service import ...``); code inside tianji imports the
modules themselves (``tests/test_layers.py``). See ``docs/architecture.md``, "Public import
paths".
"""

from __future__ import annotations

from tianji.runtime import service as _0
from tianji.runtime.service import *  # noqa: F403

__all__ = list(_0.__all__)
