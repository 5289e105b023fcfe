"""TCP links prove the run's secret token before anything else is read."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import pytest
from tianji.transports import tcp
from tianji.transports._auth import NONCE_BYTES, load_token
from tianji.transports._framing import PREAMBLE, encode_prefix

from tianji.run.train import run_token
from tianji.runtime.core import Limits
from tianji.runtime.errors import BrokenByPeer, ConfigError

LIMITS = Limits()


async def pair(server_token: str | None, client_token: str | None) -> tuple[object, object]:
    listener = await tcp.TcpTransport(token=server_token).listen("tcp://127.0.0.1:0", limits=LIMITS)
    try:
        client = await tcp.TcpTransport(token=client_token).connect(listener.address, limits=LIMITS)
    except BrokenByPeer as exc:
        accepted = None
        with contextlib.suppress(TimeoutError):
            accepted = await asyncio.wait_for(listener.accept(), 0.3)
        await listener.aclose()
        return exc, accepted
    server = await asyncio.wait_for(listener.accept(), 5)
    await client.send([b"hello"])
    got = await asyncio.wait_for(server.recv(), 5)
    client.abort()
    server.abort()
    await listener.aclose()
    return bytes(got[0]), None


def test_peers_with_the_same_token_talk() -> None:
    got, _ = asyncio.run(pair("s3cret", "s3cret"))
    assert got == b"hello"


def test_peers_without_tokens_talk() -> None:
    got, _ = asyncio.run(pair(None, None))
    assert got == b"hello"


@pytest.mark.parametrize(
    ("client_token", "logged"), [("wrong", "different token"), (None, "has no token")]
)
def test_a_client_without_the_token_is_refused_with_a_logged_reason(
    client_token: str | None, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tianji.transports.tcp")
    error, accepted = asyncio.run(pair("s3cret", client_token))
    assert isinstance(error, BrokenByPeer) and accepted is None
    assert any("auth_failed" in r.message and logged in r.message for r in caplog.records), [
        r.message for r in caplog.records
    ]


def test_a_client_with_a_token_refuses_a_listener_that_does_not_know_it() -> None:
    error, _ = asyncio.run(pair(None, "s3cret"))
    assert isinstance(error, BrokenByPeer) and "refused the listener" in str(error)


def _raw_client(address: str, payload: bytes) -> bytes:
    host, port = tcp.parse_tcp_address(address)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(payload)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return received


def test_frames_behind_a_bad_proof_are_never_read(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tianji.transports.tcp")

    async def scenario() -> tuple[bytes, bool]:
        listener = await tcp.TcpTransport(token="s3cret").listen("tcp://127.0.0.1:0", limits=LIMITS)
        message = encode_prefix([5]) + b"sneak"
        payload = PREAMBLE + b"n" * NONCE_BYTES + b"p" * 32 + message
        reply = await asyncio.to_thread(_raw_client, listener.address, payload)
        try:
            await asyncio.wait_for(listener.accept(), 0.3)
            accepted = True
        except TimeoutError:
            accepted = False
        await listener.aclose()
        return reply, accepted

    reply, accepted = asyncio.run(scenario())
    assert not accepted  # the connection never reached the service
    assert reply.startswith(PREAMBLE)  # it only ever got the listener's hello and proof
    assert len(reply) <= len(PREAMBLE) + NONCE_BYTES + 32  # hello, maybe its proof
    assert any("auth_failed" in r.message for r in caplog.records)


def test_a_peer_that_never_proves_anything_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp, "HANDSHAKE_TIMEOUT", 0.3)

    async def scenario() -> bytes:
        listener = await tcp.TcpTransport(token="s3cret").listen("tcp://127.0.0.1:0", limits=LIMITS)
        reply = await asyncio.to_thread(_raw_client, listener.address, b"")
        await listener.aclose()
        return reply

    assert len(asyncio.run(scenario())) == len(PREAMBLE) + NONCE_BYTES  # then closed


def test_a_run_generates_its_own_token_unless_one_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TIANJI_TOKEN", raising=False)
    with run_token() as token:
        assert len(token) == 64 and tcp.token_from_env() == token.encode()
    assert tcp.token_from_env() is None  # restored after the run
    monkeypatch.setenv("TIANJI_TOKEN", "given")
    with run_token() as token:
        assert token == "given"


def test_token_files_are_read_and_bad_ones_named(tmp_path) -> None:
    path = tmp_path / "token"
    path.write_text("  abc123\n")
    assert load_token(path) == "abc123"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="non-empty"):
        load_token(path)
    with pytest.raises(ConfigError, match="nope"):
        load_token(tmp_path / "nope")
