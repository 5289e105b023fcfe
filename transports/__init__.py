"""Transport registry: address scheme -> transport.

In-tree transports (``inproc``, ``tcp``, ``shm``) are imported on first use. Third-party
packages add theirs through the entry-point group ``tianji.transports``::

    # in the third party's pyproject.toml
    [project.entry-points."tianji.transports"]
    quic = "tianji_quic:QuicTransport"

The entry point names a class (or zero-argument factory) returning a
:class:`tianji.runtime.core.Transport` whose ``scheme`` equals the entry-point name. The
registry itself lives in :mod:`tianji.runtime.plugins` (one place for every plug-in kind);
these are its transport functions under their long-standing names.
"""

from __future__ import annotations

from tianji.runtime.plugins import TRANSPORTS, split_address
from tianji.runtime.plugins import register_transport as register
from tianji.runtime.plugins import transport as get
from tianji.runtime.plugins import transport_for as for_address

__all__ = ["ENTRY_POINT_GROUP", "for_address", "get", "names", "register", "split_address"]

ENTRY_POINT_GROUP = TRANSPORTS.group


def names() -> list[str]:
    """All known schemes: in-tree, registered in code, and from entry points."""
    return TRANSPORTS.names()
