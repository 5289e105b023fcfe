"""``tianji bench scale``: the control plane, the data plane of one host and the weight
fan-out as a run grows; its plan, goals, table and command line.

Parts (each row of the JSON report has ``part``):

- ``control`` (:mod:`tianji.bench.scale_control`): S simulated services, 1 Hz heartbeats,
  one real controller: ``services``, ``controller_cpu_share``, ``decision_p50_ms``,
  ``decision_p99_ms``, ``register_p50_ms``, ``register_p99_ms``, ``controller_rss_mb``;
- ``actors`` (:mod:`tianji.bench.scale_actors`): N actor processes sampling CartPole
  alone: ``actors``, ``env_steps_per_s``, ``controller_cpu_share``, ``max_rss_mb_by_role``;
- ``fanout`` (:mod:`tianji.bench.scale_fanout`): weights of ``bytes`` to ``subscribers``
  on ``hosts``: ``seconds_to_all``, ``params_bytes_sent``. One host with ``tianji bench
  scale``; 2 and 4 (network namespaces, root) too with ``python benchmarks/hosts.py scale``
  from a checkout.

Goals compare rows of the same run (see :data:`GOALS`).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from tianji.bench.report import GoalResult, finish_report, goals_markdown
from tianji.bench.scale_control import SIM_PROCESSES

if TYPE_CHECKING:
    from tianji.bench.scale_fanout import MakeHosts

__all__ = ["Plan", "add_parser", "goals", "markdown", "plan", "run_bench"]

MB = 1_000_000
SIM_NODES = SIM_PROCESSES
"""Heartbeat aggregators in an aggregated control row: one per simulator process (a node)."""
AGGREGATED_FROM = 1000
"""Control rows of this many services or more are measured twice: each service sending its
heartbeats to the controller, and through its node's heartbeat aggregator."""
Row = dict[str, Any]


class Plan:
    """What one run measures."""

    def __init__(self, quick: bool, make_hosts: MakeHosts | None = None) -> None:
        self.quick = quick
        self.make_hosts = make_hosts
        self.services = (100, 1000) if quick else (100, 1000, 10_000)
        self.control_seconds, self.control_warmup = (5.0, 2.0) if quick else (20.0, 5.0)
        self.actors = (1, 2) if quick else (1, 2, 4, 8, 16, 32)
        self.actors_seconds, self.actors_warmup = (8.0, 4.0) if quick else (30.0, 10.0)
        self.sizes = [1 * MB, 10 * MB] if quick else [1 * MB, 10 * MB, 100 * MB]
        self.subscribers = (1, 8) if quick else (1, 8, 32, 64)
        self.hosts = () if quick or make_hosts is None else (2, 4)
        self.host_subscribers = (8, 32)


def plan(quick: bool, make_hosts: MakeHosts | None = None) -> Plan:
    """The plan of a full run or of ``--quick`` (CI: small counts, short windows, one host);
    a full run's fanout is on 2 and 4 hosts too when ``make_hosts`` makes them."""
    return Plan(quick, make_hosts)


def run_bench(p: Plan, parts: list[str]) -> list[Row]:
    """Measure the parts in order (progress on stderr); failed cells become ``error`` rows."""
    rows: list[Row] = []

    def cell(label: str, fn: Any, *args: Any) -> None:
        started = time.monotonic()
        print(f"[scale] {label} ...", file=sys.stderr, flush=True)
        try:
            got = fn(*args)
        except Exception as exc:  # one failed cell must not lose the others' figures
            got = [
                {"part": label.split()[0], "label": label, "error": f"{type(exc).__name__}: {exc}"}
            ]
        got = got if isinstance(got, list) else [got]
        rows.extend(got)
        took = time.monotonic() - started
        print(
            f"[scale] {label}: {json.dumps(got)[:300]} ({took:.0f} s)", file=sys.stderr, flush=True
        )

    if "control" in parts:
        from tianji.bench.scale_control import measure_control

        for s in p.services:
            cell(f"control {s} services", measure_control, s, p.control_seconds, p.control_warmup)
            if s >= AGGREGATED_FROM:  # the same services through a heartbeat aggregator a node
                label, window = f"control {s} services, aggregators", p.control_seconds
                cell(label, measure_control, s, window, p.control_warmup, 1, True)
    if "actors" in parts:
        from tianji.bench.scale_actors import measure_actors

        for n in p.actors:
            cell(f"actors {n}", measure_actors, n, p.actors_seconds, p.actors_warmup)
    if "fanout" in parts:
        from tianji.bench.scale_fanout import measure_fanout

        for n in p.subscribers:
            cell(f"fanout {n} subscribers, 1 host", measure_fanout, n, p.sizes, 1)
        for h in p.hosts:
            for n in p.host_subscribers:
                label = f"fanout {n} subscribers, {h} hosts"
                cell(label, measure_fanout, n, p.sizes, h, p.make_hosts)
    return rows


def _find(rows: list[Row], part: str, **match: Any) -> Row | None:
    for r in rows:
        if (
            r.get("part") == part
            and "error" not in r
            and all(r.get(k) == v for k, v in match.items())
        ):
            return r
    return None


def _control_goals(rows: list[Row], add: Any) -> None:
    """The controller's CPU share and decision latency, direct and with aggregators."""
    for services, share in ((1000, 0.05), (10_000, 0.5)):
        for nodes, how in ((0, "direct"), (SIM_NODES, "with aggregators")):
            r = _find(rows, "control", services=services, aggregators=nodes)
            v = r["controller_cpu_share"] if r else None
            add(f"controller CPU share at {services:,} services, {how} <= {share:g} core", v,
                share, None if v is None else v <= share)  # fmt: skip
    for nodes, how in ((0, "direct"), (SIM_NODES, "with aggregators")):
        r = _find(rows, "control", services=1000, aggregators=nodes)
        v = r["decision_p99_ms"] if r else None
        add(f"decision latency p99 at 1,000 services, {how} <= 50 ms", v, 50.0,
            None if v is None else v <= 50)  # fmt: skip


def goals(rows: list[Row]) -> list[dict[str, Any]]:
    """The issue's goals, from the rows of one run (``N/A`` where a row is missing)."""
    out: list[GoalResult] = []

    def add(
        goal: str, measured: float | None, target: float, ok: bool | None, note: str = ""
    ) -> None:
        status = "N/A" if ok is None else ("PASS" if ok else "MISS")
        value = None if measured is None else round(measured, 4)
        out.append(GoalResult(goal, value, target, status, note))

    _control_goals(rows, add)
    sizes = sorted({r["bytes"] for r in rows if r.get("part") == "fanout" and "bytes" in r})
    for size in sizes:
        one = _find(rows, "fanout", subscribers=1, hosts=1, bytes=size)
        many = max(
            (r for r in rows if r.get("part") == "fanout" and r.get("hosts") == 1
             and r.get("bytes") == size and "error" not in r),
            key=lambda r: r["subscribers"], default=None,
        )  # fmt: skip
        if one is None or many is None or many is one:
            continue
        ratio = many["seconds_to_all"] / one["seconds_to_all"]
        add(f"weights of {size / MB:g} MB to {many['subscribers']} local actors <= 2 x to 1",
            ratio, 2.0, ratio <= 2.0)  # fmt: skip
    for r in rows:  # at the largest size: the bytes scale alike at every size
        if (
            r.get("part") != "fanout"
            or "error" in r
            or r["subscribers"] < 2
            or (sizes and r["bytes"] != sizes[-1])
        ):
            continue
        # hosts with subscribers: every host but the publisher's when there are several
        holding = r["hosts"] - 1 if r["hosts"] > 1 else 1
        per_host = r["params_bytes_sent"] / (holding * r["bytes"])
        add(f"params bytes sent per subscriber host per version, {r['subscribers']} "
            f"subscribers on {holding} host(s): <= 1.1 x the weights",
            per_host, 1.1, per_host <= 1.1)  # fmt: skip
    actors = {
        r["actors"]: r["env_steps_per_s"]
        for r in rows
        if r.get("part") == "actors" and "error" not in r
    }
    if 1 in actors and 2 in actors:
        ratio = actors[2] / actors[1]
        add("sampling: 2 actor processes >= 1.6 x one", ratio, 1.6, ratio >= 1.6)
    if 32 in actors:
        ratio = actors[32] / max(actors.values())
        add("sampling: 32 actor processes >= 0.9 x the best count", ratio, 0.9, ratio >= 0.9)
    return [g.to_json() for g in out]


def _part_table(
    rows: list[Row], part: str, title: str, header: str, align: str, line: Any
) -> list[str]:
    """One part's table: ``title``, ``header`` and its ``align`` line, ``line(row)`` for
    each row of ``part`` and an error line for each failed cell."""
    empty = " |" * (header.count("|") - 3)  # the cells after the label and the error
    lines = [title, "", header, align]
    for r in rows:
        if r.get("part") == part:
            failed = "error" in r
            lines.append(
                f"| {r.get('label')} | error: {r['error'][:100]} |{empty}" if failed else line(r)
            )
    return [*lines, ""]


def _control_line(r: Row) -> str:
    nodes = r.get("aggregators") or 0
    how = f"{nodes} ({r.get('aggregator_cpu_share', 0):.3f} core)" if nodes else "none"
    return (
        f"| {r['services']:,} | {how} | {r['controller_cpu_share']:.3f} "
        f"| {_ms(r, 'decision')} | {_ms(r, 'register')} | {r.get('join_s')} "
        f"| {r['controller_rss_mb']:.0f} | {r['heartbeats_per_s']:,.0f} |"
    )


def _actors_line(r: Row) -> str:
    rss = ", ".join(f"{k} {v:.0f}" for k, v in sorted((r.get("max_rss_mb_by_role") or {}).items()))
    cpu = r.get("controller_cpu_share")
    shown = "" if cpu is None else f"{cpu:.3f}"
    return f"| {r['actors']} | {r['env_steps_per_s']:,.0f} | {shown} | {rss} |"


def _fanout_line(r: Row) -> str:
    return (
        f"| {r['subscribers']} | {r['hosts']} | {r['bytes'] / MB:g} "
        f"| {r['seconds_to_all']:.4f} | {r['params_bytes_sent'] / MB:,.1f} |"
    )


def markdown(report: dict[str, Any]) -> str:
    """The three tables and the goals."""
    rows = report["rows"]
    lines = _part_table(
        rows,
        "control",
        "### Control plane (1 Hz heartbeats, one controller)",
        "| services | aggregators (their CPU) | controller CPU (core) | decision p50 / p99 ms "
        "| register p50 / p99 ms | join s | controller RSS MB | heartbeats/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        _control_line,
    )
    lines += _part_table(
        rows,
        "actors",
        "### Actors on one host (CartPole, 4 envs each, sampling alone)",
        "| actors | env steps/s | controller CPU (core) | max RSS MB by role |",
        "|---:|---:|---:|---|",
        _actors_line,
    )
    lines += _part_table(
        rows,
        "fanout",
        "### Weight fan-out (ParamsPublished, one version at a time)",
        "| subscribers | hosts | MB | seconds to all | params MB sent |",
        "|---:|---:|---:|---:|---:|",
        _fanout_line,
    )
    lines += goals_markdown(report["goals"], digits=3)
    return "\n".join(lines) + "\n"


def _ms(r: Row, what: str) -> str:
    p50, p99 = r.get(f"{what}_p50_ms"), r.get(f"{what}_p99_ms")
    return "-" if p50 is None else f"{p50:.1f} / {p99:.1f}"


PARTS = ("control", "actors", "fanout")


def _cmd(args: argparse.Namespace, make_hosts: MakeHosts | None = None) -> int:
    from tianji.bench.train import machine
    from tianji.runtime.errors import ConfigError

    parts = [p.strip() for p in (args.parts or ",".join(PARTS)).split(",") if p.strip()]
    for part in parts:
        if part not in PARTS:
            raise ConfigError("--parts", part, f"one of {', '.join(PARTS)}")
    p = plan(args.quick, make_hosts)
    rows = run_bench(p, parts)
    report = {"quick": args.quick, "machine": machine(), "rows": rows}
    report["goals"] = goals(rows)
    table = markdown(report)
    return finish_report(report, table, "scale", args.out, args.json)


def add_parser(bench: Any, make_hosts: MakeHosts | None = None) -> None:
    """Add ``tianji bench scale`` to the ``bench`` subparsers (with ``make_hosts``, a full
    run's fanout is measured on several hosts too: ``benchmarks/hosts.py``)."""
    b = bench.add_parser(
        "scale",
        help="the control plane (simulated services), actor processes on one host and the "
        "weight fan-out as a run grows",
        description=(__doc__ or "").split("\n\n")[0],
    )
    b.add_argument("--parts", help="comma-separated: control, actors, fanout (default all)")
    b.add_argument(
        "--quick",
        action="store_true",
        help="CI: 100 and 1,000 services, 1 and 2 actors, 1 and 8 subscribers on one host",
    )
    b.add_argument("--out", metavar="DIR", help="write scale.json and scale.md here")
    b.add_argument("--json", action="store_true", help="print the JSON report, not the tables")
    b.set_defaults(func=functools.partial(_cmd, make_hosts=make_hosts))
