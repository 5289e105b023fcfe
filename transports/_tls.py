"""Optional TLS for TCP links: mutual authentication with the run's own CA.

Set ``TIANJI_TLS_CERT`` and ``TIANJI_TLS_KEY`` (this service's certificate and key, PEM)
and ``TIANJI_TLS_CA`` (the CA that signed every service's certificate) on every host, or
pass a :class:`TlsFiles` to :class:`~tianji.transports.tcp.TcpTransport`. Both sides then
present a certificate and verify the other's against the CA; a peer without one signed
by it fails the TLS handshake, before the run-token handshake even starts. Services are
addressed by IP, so certificates are checked against the CA, not against a host name.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from pathlib import Path

from tianji.runtime.errors import ConfigError

__all__ = ["TLS_HINT", "TlsFiles", "client_context", "server_context", "tls_from_env"]

ENV = {"cert": "TIANJI_TLS_CERT", "key": "TIANJI_TLS_KEY", "ca": "TIANJI_TLS_CA"}
TLS_HINT = (
    "TLS settings that do not match (--tls-ca/--tls-cert/--tls-key on one side only, or another CA)"
)
"""The likely cause of a failed TLS handshake, for the error the connecting side raises."""


@dataclasses.dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: this side's certificate and key, and the run's CA certificate."""

    cert: str
    key: str
    ca: str

    def __post_init__(self) -> None:
        for field in ("cert", "key", "ca"):
            path = getattr(self, field)
            if not Path(path).is_file():
                raise ConfigError(f"tls.{field}", path, "a readable PEM file")


def tls_from_env() -> TlsFiles | None:
    """The TLS files named by the environment; ``None`` when none is set.

    Raises:
        ConfigError: when only some of the three variables are set, or a file is missing.
    """
    values = {k: os.environ.get(v, "") for k, v in ENV.items()}
    if not any(values.values()):
        return None
    missing = [ENV[k] for k, v in values.items() if not v]
    if missing:
        raise ConfigError(
            missing[0], "", "set together with the others (TIANJI_TLS_* or --tls-cert/-key/-ca)"
        )
    return TlsFiles(**values)


def _context(purpose: ssl.Purpose, files: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.create_default_context(purpose, cafile=files.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise ConfigError(
            "tls.cert", files.cert, f"a certificate matching {files.key} ({exc})"
        ) from None
    ctx.check_hostname = False  # peers are addressed by IP; the run's CA vouches for them
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A listener's context: requires and verifies the client's certificate."""
    return _context(ssl.Purpose.CLIENT_AUTH, files)


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A connecting side's context: presents its certificate, verifies the server's."""
    return _context(ssl.Purpose.SERVER_AUTH, files)
