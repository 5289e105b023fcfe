"""The run-token handshake of byte-stream transports (sans-I/O).

Right after the preamble each side sends a 16-byte random nonce. The client answers the
server's nonce with a 32-byte proof, ``HMAC-SHA256(token, label | own role | peer nonce |
own nonce)``; the server checks it before it reads anything else and only then sends its
own proof, which the client checks the same way. A refused client therefore sees the
connection close during the handshake instead of a connection that looks established.
The roles differ (``client`` / ``server``), so a proof cannot be reflected back, and fresh
nonces on both sides mean a recorded proof is worth nothing later. The token itself
never crosses the wire.

A side without a token proves with the empty key and does not check the peer's proof: it
only talks to peers that do not require one either, because a side *with* a token refuses
every peer whose proof does not match its own token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from tianji.runtime.errors import BadFrame, ConfigError

__all__ = [
    "NONCE_BYTES",
    "PROOF_BYTES",
    "TOKEN_HINT",
    "Handshake",
    "load_token",
    "token_from_env",
]

NONCE_BYTES = 16
PROOF_BYTES = 32
_LABEL = b"tianji-run-token-v1|"
ENV = "TIANJI_TOKEN"
TOKEN_HINT = "a different run token on each side (TIANJI_TOKEN or --token-file)"
"""The likely cause of a refused handshake, for the error a refused side raises."""


def token_from_env() -> bytes | None:
    """The run token from ``TIANJI_TOKEN`` (``None`` when unset or empty)."""
    value = os.environ.get(ENV, "")
    return value.encode() if value else None


def load_token(path: str | Path) -> str:
    """Read a token file (surrounding whitespace is ignored).

    Raises:
        ConfigError: naming the file when it cannot be read or holds no token.
    """
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError("--token-file", str(path), f"a readable file ({exc.strerror})") from None
    if not token:
        raise ConfigError("--token-file", str(path), "a file holding a non-empty token")
    return token


class Handshake:
    """One side's state of the handshake.

    Args:
        role: ``"client"`` or ``"server"``.
        token: the run token, or ``None`` to require none.
    """

    def __init__(self, role: str, token: bytes | None) -> None:
        self.role = role.encode()
        self.peer_role = b"server" if role == "client" else b"client"
        self.token = token
        self.nonce = os.urandom(NONCE_BYTES)
        self.peer_nonce: bytes | None = None
        self.done = False

    def hello(self) -> bytes:
        """What this side sends after the preamble."""
        return self.nonce

    def _proof(self, role: bytes, first: bytes, second: bytes) -> bytes:
        key = self.token or b""
        return hmac.new(key, _LABEL + role + b"|" + first + second, hashlib.sha256).digest()

    def on_hello(self, peer_nonce: bytes) -> bytes | None:
        """The peer's nonce arrived; returns the proof to send now (the client's), or
        ``None`` (the server proves only after it has checked the client)."""
        self.peer_nonce = bytes(peer_nonce)
        return self._own_proof() if self.role == b"client" else None

    def _own_proof(self) -> bytes:
        assert self.peer_nonce is not None
        return self._proof(self.role, self.peer_nonce, self.nonce)

    def on_proof(self, proof: bytes) -> bytes | None:
        """Check the peer's proof; returns the server's own proof to send once the
        client's proof checked out (``None`` on the client).

        Raises:
            BadFrame: ``auth_failed`` when this side has a token and the peer's proof does
                not match it (wrong token, or none).
        """
        assert self.peer_nonce is not None
        expected = self._proof(self.peer_role, self.nonce, self.peer_nonce)
        if self.token is not None and not hmac.compare_digest(bytes(proof), expected):
            without = self._proof_without_token()
            tokenless = hmac.compare_digest(bytes(proof), without)
            why = "has no token" if tokenless else "has a different token"
            raise BadFrame("auth_failed", f"the peer {why} (it does not know this run's token)")
        self.done = True
        return self._own_proof() if self.role == b"server" else None

    def _proof_without_token(self) -> bytes:
        assert self.peer_nonce is not None
        msg = _LABEL + self.peer_role + b"|" + self.nonce + self.peer_nonce
        return hmac.new(b"", msg, hashlib.sha256).digest()
