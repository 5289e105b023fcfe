"""TCP addresses: ``tcp://host:port``, and ``tcp://[v6]:port`` for IPv6 hosts."""

from __future__ import annotations

__all__ = ["format_tcp_address", "parse_tcp_address"]


def parse_tcp_address(address: str) -> tuple[str, int]:
    """``tcp://host:port`` or ``tcp://[v6]:port`` -> ``(host, port)``.

    Raises:
        ValueError: naming the address, if it is not of that form.
    """
    scheme, sep, rest = address.partition("://")
    host, colon, port_s = rest.rpartition(":")
    if scheme != "tcp" or not sep or not colon or not host or not port_s.isdigit():
        raise ValueError(f"not a tcp address: {address!r} (expected tcp://HOST:PORT)")
    port = int(port_s)
    if port > 65535:
        raise ValueError(f"port out of range in {address!r}")
    return host.strip("[]"), port


def format_tcp_address(host: str, port: int) -> str:
    """The address of ``host`` (a name, an IPv4 or an IPv6 address) and ``port``."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
