"""``tianji bench transport``: the pure helpers, the peer protocol and the JSON it prints."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import tianji.transports

from tianji.bench import transport as bench
from tianji.bench.measure import (
    BenchError,
    BenchTimeout,
    RateWindow,
    Settings,
    Throughput,
    aligned_empty,
)
from tianji.bench.peer import Job, zmq_hwm
from tianji.bench.report import (
    GOALS,
    PAYLOADS,
    TRANSPORTS,
    CodecRow,
    Goal,
    LatencyRow,
    Report,
    Row,
    Skip,
    evaluate_goals,
    format_rate,
    format_size,
)
from tianji.bench.spawn import spawn_peer
from tianji.runtime import plugins
from tianji.testing import interruptible, processes_with_arg, run_async

MiB = 1 << 20
ROW_KEYS = {"transport", "payload_bytes", "msgs_per_s", "bytes_per_s"}


# ------------------------------------------------------------------------------- measure
@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_matches_numpy(q: float) -> None:
    from tianji.bench.measure import percentile

    values = np.random.default_rng(7).exponential(size=501).tolist()
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([5], q) == 5


def test_percentile_refuses_no_values_and_bad_q() -> None:
    from tianji.bench.measure import percentile

    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="101"):
        percentile([1.0], 101)


def test_rate_window_counts_after_the_warm_up_only() -> None:
    w = RateWindow(warmup_s=1.0)
    for t in (0.0, 0.2, 0.9, 1.1, 1.6, 2.1, 3.1):
        w.add(t, 10)
    # window opens at 1.1; 1.6, 2.1, 3.1 count: 3 messages over 2.0 s
    assert w.result() == Throughput(3, 30, pytest.approx(2.0))
    assert w.result().msgs_per_s == pytest.approx(1.5)
    assert w.result().bytes_per_s == pytest.approx(15.0)


def test_rate_window_falls_back_to_the_whole_stream_when_it_ended_in_the_warm_up() -> None:
    w = RateWindow(warmup_s=10.0)
    for t in (0.0, 0.5, 1.0):
        w.add(t, 4)
    assert w.result() == Throughput(2, 8, 1.0)


def test_rate_window_needs_two_messages() -> None:
    w = RateWindow(warmup_s=0.1)
    with pytest.raises(BenchError, match="0 message"):
        w.result()
    w.add(1.0, 1)
    with pytest.raises(BenchError, match="1 message"):
        w.result()


def test_throughput_from_json_round_trips_and_refuses_empty_windows() -> None:
    tp = Throughput(5, 500, 0.5)
    assert Throughput.from_json(json.loads(json.dumps(tp.to_json()))) == tp
    for bad in (None, [], {"messages": 0, "nbytes": 0, "seconds": 1.0}, {"messages": 3}):
        with pytest.raises(BenchError):
            Throughput.from_json(bad)


@pytest.mark.parametrize("nbytes", [1, 100, 65536])
def test_aligned_empty_is_page_aligned(nbytes: int) -> None:
    arr = aligned_empty(nbytes)
    assert arr.nbytes == nbytes and arr.dtype == np.uint8
    assert arr.ctypes.data % 4096 == 0


def test_settings_cap_16_mib_cells_and_bound_the_warm_up() -> None:
    s = Settings(2.0)
    assert s.warmup_s == 0.25
    assert s.duration(MiB) == pytest.approx(2.25)
    assert s.duration(16 * MiB) == pytest.approx(1.25)
    assert Settings(0.2).warmup_s == pytest.approx(0.1)
    assert s.timeout(MiB) > s.duration(MiB)


# ------------------------------------------------------------------------------- report
def _rows(**bytes_per_s: float) -> list[Row]:
    """Rows at 1 MiB (``tcp=2e9`` -> 2e9 B/s) plus 100 B and 64 KiB rows."""
    rows = [Row(t.replace("_", "-"), MiB, v / MiB, v) for t, v in bytes_per_s.items()]
    rows += [Row("tcp", 100, 150_000, 15e6), Row("pyzmq", 100, 100_000, 10e6)]
    rows += [Row("shm", 64 << 10, 120_000, 120_000 * 65536)]
    return rows


def test_goals_compare_rows_of_the_same_payload() -> None:
    rows = _rows(tcp=2.8e9, raw_socket=3e9, pyzmq=2e9, shm=11e9, memcpy=20e9)
    latency = [LatencyRow("shm", 40.0, 90.0), LatencyRow("tcp", 60.0, 90.0)]
    codec = [CodecRow("Heartbeat", 0.8, 1.2, 150)]
    results = {g.goal: g for g in evaluate_goals(rows, latency, GOALS, codec)}
    assert len(results) == len(GOALS)
    tcp_raw = results["tcp 1 MiB bytes/s >= 0.9 x raw-socket"]
    assert tcp_raw.status == "PASS" and tcp_raw.measured == pytest.approx(2.8 / 3)
    assert results["tcp 1 MiB bytes/s >= 1.2 x pyzmq"].status == "PASS"  # 1.4x
    assert results["tcp 100 B msg/s >= 1.5 x pyzmq"].status == "PASS"  # exactly 1.5x
    assert results["shm 1 MiB bytes/s >= 0.5 x memcpy"].status == "PASS"  # 0.55x
    shm_tcp = results["shm 1 MiB bytes/s >= 4 x tcp"]
    assert shm_tcp.status == "MISS" and shm_tcp.measured == pytest.approx(11 / 2.8)
    assert results["shm 64 KiB msg/s >= 100,000"].measured == 120_000
    assert results["shm wake-up p50 < 60 us"].status == "PASS"
    assert results["tcp wake-up p50 < 60 us"].status == "MISS"  # an upper bound
    codec_goal = results["codec Heartbeat encode + decode <= 2 us"]
    assert codec_goal.status == "PASS" and codec_goal.measured == pytest.approx(2.0)


def test_goals_without_their_rows_are_not_applicable_and_say_why() -> None:
    results = evaluate_goals([Row("tcp", MiB, 1.0, 1.0)], [])
    by_goal = {g.goal: g for g in results}
    assert by_goal["tcp 1 MiB bytes/s >= 0.9 x raw-socket"].note == "no raw-socket 1 MiB row"
    assert by_goal["shm wake-up p50 < 60 us"].note == "no shm latency measured"
    assert by_goal["codec Heartbeat encode + decode <= 2 us"].note == "no codec row for Heartbeat"
    assert {g.status for g in results} == {"N/A"}
    assert all(g.measured is None for g in results)


def test_a_latency_goal_is_an_upper_bound() -> None:
    goal = Goal(transport="shm", metric="p50_us", target=100)
    assert evaluate_goals([], [LatencyRow("shm", 100.0, 300.0)], [goal])[0].status == "MISS"
    assert evaluate_goals([], [LatencyRow("shm", 99.9, 300.0)], [goal])[0].status == "PASS"


def test_report_json_keeps_rows_to_four_keys_and_lists_the_rest_apart() -> None:
    report = Report(
        rows=_rows(tcp=1e9, raw_socket=3e9),
        latency=[LatencyRow("tcp", 70.0, 150.0)],
        skipped=[Skip("pyzmq", "pyzmq is not installed")],
        codec=[CodecRow("Heartbeat", 0.5, 1.0, 150)],
    )
    doc = json.loads(json.dumps(report.to_json()))
    assert set(doc) == {"rows", "latency", "goals", "skipped", "codec"}
    assert doc["codec"] == [
        {
            "event": "Heartbeat",
            "encode_us": 0.5,
            "decode_us": 1.0,
            "header_bytes": 150,
            "total_us": 1.5,
        }
    ]
    assert all(set(r) == ROW_KEYS for r in doc["rows"])
    assert doc["latency"] == [{"transport": "tcp", "p50_us": 70.0, "p99_us": 150.0}]
    assert doc["skipped"] == [{"transport": "pyzmq", "reason": "pyzmq is not installed"}]
    assert {g["status"] for g in doc["goals"]} <= {"PASS", "MISS", "N/A"}


def test_the_table_shows_ratios_goals_and_what_was_not_measured() -> None:
    report = Report(
        heading="tianji bench transport: test",
        rows=_rows(tcp=1.5e9, raw_socket=3e9, memcpy=15e9),
        skipped=[Skip("shm", "unavailable: RegistryError: no shm")],
    )
    table = report.to_table()
    tcp_line = next(line for line in table.splitlines() if line.startswith("1 MiB"))
    assert "tcp" in tcp_line and "1.5 GB/s" in tcp_line
    assert "0.50x" in tcp_line and "0.10x" in tcp_line  # vs raw-socket, vs memcpy
    assert "MISS  tcp 1 MiB bytes/s >= 0.9 x raw-socket" in table
    assert "measured 0.50x" in table
    assert "N/A   shm wake-up p50 < 60 us" in table
    assert "shm: unavailable: RegistryError: no shm" in table
    assert "no codec" in table  # the footnote on how ceilings are measured
    assert "vs pyzmq" not in Report(rows=[Row("tcp", 100, 1.0, 100.0)]).to_table()


@pytest.mark.parametrize(
    ("nbytes", "text"), [(100, "100 B"), (65536, "64 KiB"), (MiB, "1 MiB"), (16 * MiB, "16 MiB")]
)
def test_format_size(nbytes: int, text: str) -> None:
    assert format_size(nbytes) == text


def test_format_rate() -> None:
    assert format_rate(2.71e9) == "2.71 GB/s"
    assert format_rate(812e3) == "812 kB/s"
    assert format_rate(12) == "12 B/s"


# ------------------------------------------------------------------------------- peer
def test_a_job_names_its_bad_field() -> None:
    with pytest.raises(BenchError, match=r"job\.kind='udp'"):
        Job.from_json({"kind": "udp", "address": "x", "payload_bytes": 1, "warmup_s": 0.1})
    with pytest.raises(BenchError, match="payload_bytes=0"):
        Job.from_json({"kind": "tianji", "address": "x", "payload_bytes": 0, "warmup_s": 0.1})
    job = Job(kind="pyzmq", address="tcp://127.0.0.1:1", payload_bytes=100, warmup_s=0.1)
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job


def test_pyzmq_queues_hold_about_what_tianji_queues_hold() -> None:
    assert zmq_hwm(100) == zmq_hwm(65536) == 1000  # zmq's default
    assert zmq_hwm(MiB) == 64  # 64 MiB, like Limits().queue_bytes
    assert zmq_hwm(16 * MiB) == 4
    assert zmq_hwm(1 << 30) == 2


def test_a_failing_peer_is_reported_with_its_reason_and_reaped() -> None:
    async def main() -> None:
        listener = await tianji.transports.get("tcp").listen(
            "tcp://127.0.0.1:0", limits=bench.LIMITS
        )
        port = listener.address.rpartition(":")[2]
        await listener.aclose()  # nothing listens there any more
        job = Job(kind="tianji", address=f"tcp://127.0.0.1:{port}", payload_bytes=100, warmup_s=0.1)
        async with spawn_peer(job) as peer:
            with pytest.raises(BenchError, match="connect failed") as info:
                await peer.guard(asyncio.sleep(30), 20, "connecting")
            assert "connecting: peer exited 1" in str(info.value)
        assert peer.proc.returncode == 1

    run_async(main())


def test_leaving_spawn_peer_stops_a_peer_that_still_waits() -> None:
    async def main() -> int:
        job = Job(kind="pyzmq", address="tcp://127.0.0.1:1", payload_bytes=100, warmup_s=0.1)
        async with spawn_peer(job) as peer:  # PULL connects lazily and waits 30 s for data
            with pytest.raises(BenchError, match=r"timed out after 0\.5 s"):
                await peer.guard(asyncio.sleep(30), 0.5, "waiting")
        assert peer.proc.returncode is not None and peer.proc.returncode < 0  # SIGTERM
        return peer.proc.pid

    pytest.importorskip("zmq")
    pid = run_async(main())
    assert not os.path.exists(f"/proc/{pid}")


# ------------------------------------------------------------------------------- the run
def test_a_failing_or_unavailable_transport_is_skipped_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_shm() -> Any:
        raise ImportError("transports/shm.py is half-written")

    async def fake(payload_bytes: int, settings: Settings) -> Throughput:
        return Throughput(10, 10 * payload_bytes, 0.5)

    async def failing(payload_bytes: int, settings: Settings) -> Throughput:
        raise BenchError("peer exited 1: boom")

    hung: list[int] = []

    async def hanging(payload_bytes: int, settings: Settings) -> Throughput:
        hung.append(payload_bytes)
        raise BenchTimeout("sending timed out after 9 s")

    async def fake_latency(scheme: str, settings: Settings) -> LatencyRow:
        return LatencyRow(scheme, 50.0, 80.0)

    monkeypatch.setitem(plugins.TRANSPORTS._registered, "shm", broken_shm)
    monkeypatch.delitem(plugins._transports, "shm", raising=False)
    measures = {name: fake for name in bench.MEASURES} | {"tcp": failing, "inproc": hanging}
    monkeypatch.setattr(bench, "MEASURES", measures)
    monkeypatch.setattr(bench, "_latency", fake_latency)
    progress = io.StringIO()
    report = bench.run_transport_bench(0.1, progress=progress)

    skipped = {(s.transport, s.reason) for s in report.skipped}
    assert ("shm", "unavailable: ImportError: transports/shm.py is half-written") in skipped
    assert ("tcp", "1 MiB: peer exited 1: boom") in skipped
    assert ("inproc", "100 B: sending timed out after 9 s") in skipped
    assert ("inproc", "16 MiB: not run, an earlier inproc cell timed out") in skipped
    assert hung == [100]  # a transport that hung once is not tried again
    assert {r.transport for r in report.rows} >= {"raw-socket", "memcpy"}
    assert not {"tcp", "inproc"} & {r.transport for r in report.rows}
    assert [lat.transport for lat in report.latency] == ["tcp"]
    assert "raw-socket 64 KiB" in progress.getvalue()
    assert "failed: peer exited 1: boom" in progress.getvalue()


def test_the_cli_refuses_a_non_positive_duration(capsys: pytest.CaptureFixture[str]) -> None:
    from tianji.cli import main

    with pytest.raises(SystemExit) as info:
        main(["bench", "transport", "--seconds", "0"])
    assert info.value.code == 2
    assert "expected a positive number of seconds, got '0'" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_transport_json_end_to_end() -> None:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "tianji.cli", "bench", "transport", "--json", "--seconds", "0.3"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    doc = json.loads(out.stdout)  # stdout is the JSON only; progress went to stderr
    assert "[ 1/" in out.stderr and "memcpy" in out.stderr
    assert set(doc) == {"rows", "latency", "goals", "skipped", "codec"}
    assert {c["event"] for c in doc["codec"]} == {"Heartbeat", "ArraysPublished 100 B"}
    assert all(c["encode_us"] > 0 and c["decode_us"] > 0 for c in doc["codec"])
    rows = doc["rows"]
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["transport"] in TRANSPORTS
        assert row["payload_bytes"] in PAYLOADS
        assert row["msgs_per_s"] > 0 and row["bytes_per_s"] > 0
        assert row["bytes_per_s"] == pytest.approx(row["msgs_per_s"] * row["payload_bytes"])
    cells = {(r["transport"], r["payload_bytes"]) for r in rows}
    skipped = {s["transport"] for s in doc["skipped"]}
    optional = {"shm": _shm_available(), "pyzmq": _zmq_available()}
    for size in PAYLOADS:
        for name in ("inproc", "tcp", "raw-socket", "memcpy"):
            assert (name, size) in cells, (name, size, doc["skipped"])
        for name, available in optional.items():
            assert ((name, size) in cells) if available else (name in skipped), (name, size)
    latency = {lat["transport"]: lat for lat in doc["latency"]}
    assert set(latency) == {"tcp"} | ({"shm"} if optional["shm"] else set())
    for lat in latency.values():
        assert set(lat) == {"transport", "p50_us", "p99_us"}
        assert 0 < lat["p50_us"] <= lat["p99_us"]
    assert len(doc["goals"]) == len(GOALS)
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_ctrl_c_stops_the_bench_and_its_peers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tianji.cli", "bench", "transport", "--seconds", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,  # SIGINT acts as in a terminal
    )
    try:
        deadline = time.monotonic() + 60
        while not processes_with_arg("-m", "tianji.bench.peer", "--parent", str(proc.pid)):
            assert time.monotonic() < deadline and proc.poll() is None, "no peer started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert not processes_with_arg("-m", "tianji.bench.peer", "--parent", str(proc.pid))


def _shm_available() -> bool:
    try:
        tianji.transports.get("shm")
    except Exception:
        return False
    return True


def _zmq_available() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True
