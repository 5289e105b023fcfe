"""tianji: a runtime for distributed reinforcement learning.

Start with :mod:`tianji.runtime.core` (the vocabulary), then :mod:`tianji.runtime.events` and
:mod:`tianji.runtime.service`.
"""

import logging
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tianji")
except PackageNotFoundError as exc:  # running from a source tree without an install
    logging.getLogger(__name__).debug("%r: version 0.0.0+source", exc)
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
