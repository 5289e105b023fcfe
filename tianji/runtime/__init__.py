"""The event runtime: transports' protocol, typed events and their codec, bounded queues,
the service base class, the controller's registry, event-loop selection and plug-in
loading. It knows no RL and imports nothing above it (``tests/test_layers.py``).

``run`` and ``loop_factory`` (of :mod:`tianji.runtime.loop`) keep their old import path,
``from tianji.runtime import run``.
"""

from __future__ import annotations

from tianji.runtime.loop import loop_factory, run

__all__ = ["loop_factory", "run"]
