"""Results of ``tianji bench transport``: rows, goals, the table and the JSON document (pure).

The JSON document (``--json``)::

    {"rows": [{"transport": "tcp", "payload_bytes": 1048576,
               "msgs_per_s": 2650.1, "bytes_per_s": 2778832281.6}, ...],
     "latency": [{"transport": "tcp", "p50_us": 71.2, "p99_us": 160.4}, ...],
     "codec": [{"event": "Heartbeat", "encode_us": 0.6, "decode_us": 0.9,
                "total_us": 1.5, "header_bytes": 160}, ...],
     "goals": [{"goal": "tcp 1 MiB bytes/s >= 0.9 x raw-socket", "measured": 0.93,
                "target": 0.9, "status": "PASS", "note": ""}, ...],
     "skipped": [{"transport": "pyzmq", "reason": "pyzmq is not installed ..."}]}

Goals compare rows of the same run (the machines are noisy; ratios travel, absolutes don't).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CEILINGS",
    "CodecRow",
    "GOALS",
    "Goal",
    "GoalResult",
    "LatencyRow",
    "PAYLOADS",
    "Report",
    "Row",
    "Skip",
    "TRANSPORTS",
    "evaluate_goals",
    "finish_report",
    "goals_markdown",
    "format_rate",
    "format_size",
]

KiB, MiB = 1 << 10, 1 << 20
PAYLOADS = (100, 64 * KiB, 1 * MiB, 16 * MiB)
TRANSPORTS = ("inproc", "tcp", "shm", "raw-socket", "memcpy", "pyzmq")
CEILINGS = ("raw-socket", "memcpy", "pyzmq")
"""Reference rows: the table shows every row's ratio to these (when measured) at its payload."""

NOTES = (
    "inproc, tcp, shm: each message is a real ArraysPublished event (uint8 array of the payload",
    "  size) encoded and decoded with tianji.runtime.codec; inproc runs both ends on one event",
    "  loop; tcp and shm send from this process to a child process that decodes every event.",
    "raw-socket, pyzmq: the payload bytes plus an 8-byte header, no codec. raw-socket: blocking",
    "  sendmsg / recv_into (one reused buffer) over loopback TCP; pyzmq: PUSH/PULL over loopback",
    "  TCP, copy=False. Both also between this process and a child.",
    "memcpy: np.copyto between two preallocated page-aligned arrays in this process.",
    "Throughput = messages the receiver fully received (and decoded) within its own window,",
    "  from the first message after the warm-up to the last; bytes/s counts payload bytes.",
    "The box is shared and noisy: compare ratios within one run, not figures across runs.",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """Throughput of one transport at one payload size."""

    transport: str
    payload_bytes: int
    msgs_per_s: float
    bytes_per_s: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class LatencyRow:
    """One-way wake-up latency of small events on one transport, in microseconds."""

    transport: str
    p50_us: float
    p99_us: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class CodecRow:
    """What encoding and decoding one event costs in this process, in microseconds."""

    event: str
    encode_us: float
    decode_us: float
    header_bytes: int

    @property
    def total_us(self) -> float:
        return self.encode_us + self.decode_us

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_us": round(self.total_us, 3)}


@dataclasses.dataclass(frozen=True, slots=True)
class Skip:
    """A transport (or one of its cells) that was not measured, and why."""

    transport: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Goal:
    """A target checked within one run.

    With ``versus``, the goal is ``metric(transport) >= target * metric(versus)`` at
    ``payload_bytes``; without, ``metric >= target``; for ``p50_us`` it is ``< target``;
    for ``codec_us`` (``transport`` names the event) encode + decode ``<= target``.
    """

    transport: str
    metric: str  # "bytes_per_s", "msgs_per_s" or "p50_us"
    target: float
    payload_bytes: int = 0
    versus: str | None = None

    @property
    def text(self) -> str:
        if self.metric == "p50_us":
            return f"{self.transport} wake-up p50 < {self.target:g} us"
        if self.metric == "codec_us":
            return f"codec {self.transport} encode + decode <= {self.target:g} us"
        unit = "bytes/s" if self.metric == "bytes_per_s" else "msg/s"
        what = f"{self.transport} {format_size(self.payload_bytes)} {unit}"
        if self.versus is None:
            return f"{what} >= {self.target:,.0f}"
        return f"{what} >= {self.target:g} x {self.versus}"


@dataclasses.dataclass(frozen=True, slots=True)
class GoalResult:
    """A goal as measured: ``status`` is PASS, MISS or N/A (with ``note`` saying why)."""

    goal: str
    measured: float | None
    target: float
    status: str
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


GOALS = (
    Goal(transport="tcp", payload_bytes=MiB, metric="bytes_per_s", target=0.9, versus="raw-socket"),
    Goal(transport="tcp", payload_bytes=MiB, metric="bytes_per_s", target=1.2, versus="pyzmq"),
    Goal(transport="tcp", payload_bytes=100, metric="msgs_per_s", target=1.5, versus="pyzmq"),
    Goal(transport="shm", payload_bytes=MiB, metric="bytes_per_s", target=0.5, versus="memcpy"),
    Goal(transport="shm", payload_bytes=MiB, metric="bytes_per_s", target=4.0, versus="tcp"),
    Goal(transport="shm", payload_bytes=64 * KiB, metric="msgs_per_s", target=100_000),
    Goal(transport="tcp", metric="p50_us", target=60),
    Goal(transport="shm", metric="p50_us", target=60),
    Goal(transport="Heartbeat", metric="codec_us", target=2.0),
)


def evaluate_goals(
    rows: Sequence[Row],
    latency: Sequence[LatencyRow],
    goals: Sequence[Goal] = GOALS,
    codec: Sequence[CodecRow] = (),
) -> list[GoalResult]:
    """Check ``goals`` against the rows of one run; a goal lacking a row is N/A."""
    by_key = {(r.transport, r.payload_bytes): r for r in rows}
    by_transport = {r.transport: r for r in latency}
    by_event = {r.event: r for r in codec}
    results = []
    for goal in goals:
        if goal.metric == "codec_us":
            cost = by_event.get(goal.transport)
            if cost is None:
                results.append(_missing(goal, f"no codec row for {goal.transport}"))
            else:
                results.append(_result(goal, cost.total_us, cost.total_us <= goal.target))
            continue
        if goal.metric == "p50_us":
            lat = by_transport.get(goal.transport)
            if lat is None:
                results.append(_missing(goal, f"no {goal.transport} latency measured"))
            else:
                ok = lat.p50_us < goal.target
                results.append(_result(goal, lat.p50_us, ok))
            continue
        row = by_key.get((goal.transport, goal.payload_bytes))
        ref = by_key.get((goal.versus, goal.payload_bytes)) if goal.versus else None
        size = format_size(goal.payload_bytes)
        if row is None:
            results.append(_missing(goal, f"no {goal.transport} {size} row"))
        elif goal.versus is not None and ref is None:
            results.append(_missing(goal, f"no {goal.versus} {size} row"))
        else:
            value: float = getattr(row, goal.metric)
            if ref is not None:
                value /= getattr(ref, goal.metric)
            results.append(_result(goal, value, value >= goal.target))
    return results


def _result(goal: Goal, measured: float, ok: bool) -> GoalResult:
    return GoalResult(goal.text, measured, goal.target, "PASS" if ok else "MISS")


def _missing(goal: Goal, note: str) -> GoalResult:
    return GoalResult(goal.text, None, goal.target, "N/A", note)


# ------------------------------------------------------------------------------- formatting
def format_size(nbytes: int) -> str:
    """``100 B``, ``64 KiB``, ``1 MiB``, ``16 MiB`` (binary units, as the payloads are)."""
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def format_rate(bytes_per_s: float) -> str:
    """A byte rate in decimal units: ``812 kB/s``, ``2.71 GB/s``."""
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.3g} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _ratio(row: Row, ref: Row | None) -> str:
    if ref is None or ref is row:
        return "-"
    return f"{row.bytes_per_s / ref.bytes_per_s:.2f}x"


def goals_markdown(goals: Sequence[dict[str, Any]], digits: int = 2) -> list[str]:
    """The goals of a report (``GoalResult.to_json`` dicts) as markdown table lines, the
    measured value with ``digits`` decimals."""
    lines = ["| goal | measured | target | status |", "|---|---:|---:|---|"]
    for g in goals:
        measured = "" if g["measured"] is None else f"{g['measured']:.{digits}f}"
        note = f" ({g['note']})" if g["note"] else ""
        lines.append(f"| {g['goal']}{note} | {measured} | {g['target']:g} | {g['status']} |")
    return lines


def _goal_line(g: GoalResult) -> str:
    if g.measured is None:
        return f"  {g.status:<4}  {g.goal:<40}  ({g.note})"
    if " x " in g.goal:
        shown = f"{g.measured:.2f}x"
    elif "p50" in g.goal:
        shown = f"{g.measured:.1f} us"
    elif g.goal.startswith("codec"):
        shown = f"{g.measured:.2f} us"
    else:
        shown = f"{g.measured:,.0f}"
    return f"  {g.status:<4}  {g.goal:<40}  measured {shown}"


@dataclasses.dataclass(slots=True)
class Report:
    """Everything one run measured; ``heading`` describes the run's settings."""

    heading: str = ""
    rows: list[Row] = dataclasses.field(default_factory=list)
    latency: list[LatencyRow] = dataclasses.field(default_factory=list)
    skipped: list[Skip] = dataclasses.field(default_factory=list)
    codec: list[CodecRow] = dataclasses.field(default_factory=list)

    def goals(self) -> list[GoalResult]:
        return evaluate_goals(self.rows, self.latency, GOALS, self.codec)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document (see the module docstring)."""
        return {
            "rows": [r.to_json() for r in self.rows],
            "latency": [r.to_json() for r in self.latency],
            "codec": [r.to_json() for r in self.codec],
            "goals": [g.to_json() for g in self.goals()],
            "skipped": [s.to_json() for s in self.skipped],
        }

    def to_table(self) -> str:
        """The human-readable report: throughput with ratios, latency, goals, notes."""
        lines = [self.heading, ""] if self.heading else []
        measured = {r.transport for r in self.rows}
        ceilings = [c for c in CEILINGS if c in measured]
        refs = "".join(f"{'vs ' + c:>15}" for c in ceilings)
        lines.append(f"{'payload':<8} {'transport':<11}{'msg/s':>13}{'bytes/s':>13}{refs}")
        by_key = {(r.transport, r.payload_bytes): r for r in self.rows}
        for size in PAYLOADS:
            label = format_size(size)
            for name in TRANSPORTS:
                row = by_key.get((name, size))
                if row is None:
                    continue
                ratios = "".join(f"{_ratio(row, by_key.get((c, size))):>15}" for c in ceilings)
                lines.append(
                    f"{label:<8} {name:<11}{row.msgs_per_s:>13,.0f}"
                    f"{format_rate(row.bytes_per_s):>13}{ratios}"
                )
                label = ""
        lines += ["", "one-way wake-up latency, 100 B events sent every ~1 ms:"]
        for lat in self.latency:
            lines.append(
                f"  {lat.transport:<11} p50 {lat.p50_us:8.1f} us   p99 {lat.p99_us:8.1f} us"
            )
        if not self.latency:
            lines.append("  (not measured)")
        if self.codec:
            lines += ["", "codec, one event in this process (best of 5 rounds):"]
            for c in self.codec:
                lines.append(
                    f"  {c.event:<22} encode {c.encode_us:6.2f} us  decode {c.decode_us:6.2f} us"
                    f"  total {c.total_us:6.2f} us  ({c.header_bytes} B header)"
                )
        lines += ["", "goals (ratios within this run):"]
        lines += [_goal_line(g) for g in self.goals()]
        if self.skipped:
            lines += ["", "not measured:"]
            lines += [f"  {s.transport}: {s.reason}" for s in self.skipped]
        lines += ["", "notes:"]
        lines += [f"  {n}" for n in NOTES]
        return "\n".join(lines)


def finish_report(
    report: dict[str, Any], table: str, name: str, out: str | None, as_json: bool
) -> int:
    """Write ``NAME.json`` and ``NAME.md`` under ``out`` (when given), print the JSON or
    the table, name the failed cells on stderr; the exit code (1 when a cell failed)."""
    import json
    import sys
    from pathlib import Path

    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(report, indent=2))
        (folder / f"{name}.md").write_text(table)
    print(json.dumps(report) if as_json else table)
    errors = [r for r in report["rows"] if "error" in r]
    if errors:
        print(f"{len(errors)} cell(s) failed", file=sys.stderr)
    return 1 if errors else 0
