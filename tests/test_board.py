"""The weights board: one shared-memory write per event for every subscriber on the host,
read without a copy, guarded by per-slot sequence numbers; and the services that use it
(the publisher writes a large event once, local subscribers get it from the board,
others over their links)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pytest

from tianji.rl.events import ParamsPublished
from tianji.rl.topics import LATEST_PARAMS
from tianji.runtime.board import BOARD_MIN_BYTES, SHM_DIR, SLOTS, Board, BoardReader
from tianji.runtime.codec import Codec
from tianji.runtime.controller import Controller
from tianji.runtime.errors import BadFrame
from tianji.runtime.heartbeats import ServiceStat
from tianji.runtime.service import Service
from tianji.testing import run_async

pytestmark = pytest.mark.skipif(not Board.available(), reason="no writable /dev/shm")


def frames_of(value: int, n: int = 1000) -> list[bytes]:
    return [b"header", np.full(n, value, np.uint8).tobytes()]


def test_a_put_is_read_back_without_a_copy_and_its_lease_ends_when_the_slot_is_reused() -> None:
    board, reader = Board(), BoardReader()
    try:
        refs = [board.put(frames_of(v)) for v in range(SLOTS)]
        first = reader.resolve(*refs[0], [6, 1000])
        assert first is not None
        views, lease = first
        assert bytes(views[0]) == b"header" and set(bytes(views[1])) == {0}
        assert lease.valid()
        board.put(frames_of(99))  # reuses slot 0
        assert not lease.valid()
        assert reader.resolve(*refs[0], [6, 1000]) is None  # superseded
        later = reader.resolve(*refs[1], [6, 1000])
        assert later is not None and set(bytes(later[0][1])) == {1} and later[1].valid()
    finally:
        reader.close()
        board.close()


def test_a_larger_event_moves_to_a_new_board_and_old_views_stay_readable() -> None:
    board, reader = Board(), BoardReader()
    try:
        small = board.put(frames_of(5, 100))
        views, lease = reader.resolve(*small, [6, 100]) or ([], None)
        old_name = board.name
        big = board.put(frames_of(7, 1 << 20))
        assert board.name != old_name
        assert not os.path.exists(os.path.join(SHM_DIR, old_name))  # unlinked
        assert set(bytes(views[1])) == {5} and lease is not None and lease.valid()
        got = reader.resolve(*big, [6, 1 << 20])
        assert got is not None and set(bytes(got[0][1])) == {7}
    finally:
        reader.close()
        board.close()
    assert not os.path.exists(os.path.join(SHM_DIR, board.name))


@pytest.mark.parametrize(
    ("name", "slot", "seq", "lengths", "reason"),
    [
        ("../etc/passwd", 0, 2, [1], "bad_board"),
        ("tianji-1-1-boardgone", 0, 2, [1], "board_gone"),
        (None, 7, 2, [1], "bad_board"),
        (None, 0, 2, [1 << 30], "bad_board"),
    ],
)
def test_a_malformed_reference_is_a_typed_error(
    name: str | None, slot: int, seq: int, lengths: list[int], reason: str
) -> None:
    board, reader = Board(), BoardReader()
    try:
        board.put(frames_of(1))
        with pytest.raises(BadFrame) as err:
            reader.resolve(name or board.name, slot, seq, lengths)
        assert err.value.reason == reason
    finally:
        reader.close()
        board.close()


class Subscriber(Service):
    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.got: list[tuple[int, bytes, bool | None]] = []
        self.three = asyncio.Event()
        self.subscribe(LATEST_PARAMS, self.on_params)

    async def on_params(self, ev: ParamsPublished) -> None:
        lease = self.lease_of(ev)
        w = ev.weights["w"]
        self.got.append((ev.policy_version, bytes(w[:4]), None if lease is None else lease.valid()))
        if len(self.got) >= 3:
            self.three.set()


def test_a_large_event_is_written_once_for_the_local_subscribers_and_sent_to_remote_ones() -> None:
    size = 2 * BOARD_MIN_BYTES

    async def main() -> tuple[Service, list[Subscriber], str]:
        ctl = Controller(bind="tcp://127.0.0.1:0")
        ctl_task = asyncio.create_task(ctl.run())
        await ctl.wait_ready()
        kw = {"bind": "tcp://127.0.0.1:0", "controller": ctl.address}
        pub = Service("params-0", publishes=[LATEST_PARAMS], local_bind="shm://", **kw)
        pub.share_on_board(LATEST_PARAMS)
        local = [Subscriber(f"actor-{i}", local_bind="shm://", **kw) for i in range(3)]
        remote = Subscriber("far", **kw)
        remote.locality = "another-host"  # told the TCP address, as a service elsewhere
        subs = [*local, remote]
        tasks = [asyncio.create_task(s.run()) for s in (pub, *subs)]
        await pub.wait_subscribers(LATEST_PARAMS, len(subs))
        for version in (1, 2):
            w = np.full(size, version, np.uint8)
            await pub.publish(
                ParamsPublished(policy_version=version, weights={"w": w}), LATEST_PARAMS
            )
        small = np.full(10, 3, np.uint8)  # below BOARD_MIN_BYTES: over the links
        await pub.publish(ParamsPublished(policy_version=3, weights={"w": small}), LATEST_PARAMS)
        await asyncio.gather(*(s.three.wait() for s in subs))
        assert pub._board.board is not None
        board = pub._board.board.name  # removed when the publisher stops
        for s in (*subs, pub):
            s.stop("test over")
        await asyncio.gather(*tasks)
        ctl.stop("test over")
        await ctl_task
        return pub, subs, board

    pub, subs, board = run_async(main(), timeout=60)
    *local, remote = subs
    assert pub.counters[ServiceStat.BOARD_WRITES] == 2  # one per large version, not per link
    for s in local:
        assert s.got == [
            (1, b"\x01" * 4, True),
            (2, b"\x02" * 4, True),
            (3, b"\x03" * 4, None),
        ]
        assert s.counters[ServiceStat.BOARD_READS] == 2
    assert remote.got == [(1, b"\x01" * 4, None), (2, b"\x02" * 4, None), (3, b"\x03" * 4, None)]
    sent = pub.counters[ServiceStat.PUBLISHED_BYTES]
    assert 2 * 2 * size < sent < 2 * 2 * size + 10_000  # each version: board + the remote link
    assert board and not os.path.exists(os.path.join(SHM_DIR, board))


def test_subscribers_on_the_publishers_host_read_the_board_over_tcp_too() -> None:
    """Locality, not the transport, decides: TCP subscribers that say they share the
    publisher's host get references; one elsewhere gets the weights over its link."""
    size = 2 * BOARD_MIN_BYTES

    async def main() -> tuple[Service, list[Subscriber]]:
        ctl = Controller(bind="tcp://127.0.0.1:0")
        ctl_task = asyncio.create_task(ctl.run())
        await ctl.wait_ready()
        kw = {"bind": "tcp://127.0.0.1:0", "controller": ctl.address}
        pub = Service("params-0", publishes=[LATEST_PARAMS], **kw)  # no shm listener
        pub.share_on_board(LATEST_PARAMS)
        subs = [Subscriber(f"actor-{i}", **kw) for i in range(2)]
        subs.append(Subscriber("far", **kw))
        subs[-1].locality = "another-host/net:1"
        tasks = [asyncio.create_task(s.run()) for s in (pub, *subs)]
        await pub.wait_subscribers(LATEST_PARAMS, len(subs))
        for version in (1, 2, 3):
            w = np.full(size, version, np.uint8)
            await pub.publish(
                ParamsPublished(policy_version=version, weights={"w": w}), LATEST_PARAMS
            )
        await asyncio.gather(*(s.three.wait() for s in subs))
        for s in (*subs, pub):
            s.stop("test over")
        await asyncio.gather(*tasks)
        ctl.stop("test over")
        await ctl_task
        return pub, subs

    pub, subs = run_async(main(), timeout=60)
    *near, far = subs
    assert pub.counters[ServiceStat.BOARD_WRITES] == 3
    for s in near:
        assert [(v, w, valid) for v, w, valid in s.got] == [
            (v, bytes([v]) * 4, True) for v in (1, 2, 3)
        ]
        assert s.counters[ServiceStat.BOARD_READS] == 3
    assert far.got == [(v, bytes([v]) * 4, None) for v in (1, 2, 3)]
    assert far.counters[ServiceStat.BOARD_READS] == 0


def test_an_on_board_reference_survives_the_codec() -> None:
    from tianji.runtime.events import BoardPosted

    ev = BoardPosted(topic=LATEST_PARAMS, board="tianji-1-2-board00", slot=1, seq=4, lengths=(3, 9))
    codec = Codec()
    assert codec.decode(codec.encode(ev)) == ev


def test_a_reference_to_a_board_the_publisher_outgrew_is_skipped_not_fatal() -> None:
    from tianji.runtime.events import BoardPosted

    svc = Service("actor-0")
    ref = BoardPosted(topic=LATEST_PARAMS, board="tianji-1-1-boardgone", slot=0, seq=2,
                      lengths=(10,))  # fmt: skip
    assert svc._board.resolve(ref, "peer") is None
    assert svc.counters[ServiceStat.BOARD_SUPERSEDED] == 1
    bad = BoardPosted(topic=LATEST_PARAMS, board="../x", slot=0, seq=2, lengths=(10,))
    with pytest.raises(BadFrame):
        svc._board.resolve(bad, "peer")
