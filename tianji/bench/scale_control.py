"""``tianji bench scale``, control part: one controller and S simulated services over real TCP.

The controller is the real one (:class:`~tianji.runtime.controller.Controller` with the
run's :class:`~tianji.services.balancer.Balancer`, balance settings of
``examples/cartpole_dqn.toml`` with S - 4 actors), in a process of its own that also takes
a progress snapshot every 2 s as ``tianji train`` does. The S services are simulated
(:mod:`tianji.bench.scale_sim`), many per process (``SIM_PROCESSES``), each with its own
TCP connection and the real wire events.

Measured, after every service registered and a warm-up, over a window of ``seconds``:

- ``controller_cpu_share``: the controller process's CPU time / the window (1.0 = a core);
- ``decision_p50_ms`` / ``decision_p99_ms``: from a heartbeat's ``sent_at`` (the simulator's
  clock, the same host) to the end of the balance decision that first saw it;
- ``register_p50_ms`` / ``register_p99_ms``: from a service's ``RegisterService`` and
  ``WatchTopics`` to its ``ServiceRegistered`` and first ``PublishersChanged`` of every
  watched topic (the registry's answer, taken during the join);
- ``join_s``: from the first connection to the last service answered;
- ``controller_rss_mb``: the controller process's resident memory at the window's end;
- ``heartbeats_per_s`` received, ``decisions_per_s`` made and ``commands_per_s`` sent (pause,
  resume, grants) in the window.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tianji.bench.measure import percentile
from tianji.bench.spawn import start_json_child

__all__ = ["ROLES", "SIM_PROCESSES", "measure_control", "roles_of"]

log = logging.getLogger(__name__)

SIM_PROCESSES = 2
JOIN_TIMEOUT = 600.0
PROGRESS_EVERY = 2.0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole_dqn.toml"


ROLES = ("actor", "buffer", "learner", "params", "monitor")


def roles_of(services: int, population: int = 1) -> list[tuple[str, str]]:
    """``(name, role)`` of a run of ``services``: params, buffer, learner, monitor and
    ``services - 4`` actors; with a ``population`` of N, each member ``m<k>`` has its own
    four (under full names, ``m1.learner-0``) and ``services - 4 N`` actors go round-robin
    to the members (as ``[population]`` splits them)."""
    fixed = [("params-0", "params"), ("buffer-0", "buffer"), ("learner-0", "learner")]
    fixed.append(("monitor", "monitor"))
    actors = services - len(fixed) * population
    if actors < population:
        raise ValueError(f"services={services}: at least {5 * population} for {population}")
    if population == 1:
        return fixed + [(f"actor-{i}", "actor") for i in range(actors)]
    names = [(f"m{k}.{n}", r) for k in range(population) for n, r in fixed]
    return names + [(f"m{i % population}.actor-{i // population}", "actor") for i in range(actors)]


class Timed:
    """A balance plug-in (one :class:`~tianji.services.balancer.Balancer` or a population's)
    timing each heartbeat to the end of the decision that first saw it."""

    def __init__(self, inner: Any, balancers: list[Any]) -> None:
        self.inner = inner
        self.balancers = balancers
        self.roles = inner.roles
        self.pending: list[float] = []
        self.latencies: list[float] = []

    @property
    def decisions(self) -> int:
        return sum(b.decisions for b in self.balancers)

    @property
    def commands(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for b in self.balancers:
            for key, n in b.commands.items():
                total[key] = total.get(key, 0) + n
        return total

    def attach(self, send: Any) -> None:
        self.inner.attach(send)

    async def update(self, heartbeats: Any, live: Any) -> None:
        seen, self.pending = self.pending, []
        await self.inner.update(heartbeats, live)
        done = time.time()
        self.latencies.extend(done - t for t in seen)

    def gauges(self) -> dict[str, float]:
        gauges: dict[str, float] = self.inner.gauges()
        return gauges

    def forget(self, name: str) -> None:
        self.inner.forget(name)

    def retired(self, hb: Any) -> Any:
        return self.inner.retired(hb)

    def rejoined(self, retired: str, heartbeats: Any) -> None:
        self.inner.rejoined(retired, heartbeats)


def _raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_s_of(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` of this host used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------- the controller
def _timed_controller(services: int, population: int = 1) -> tuple[Any, Timed]:
    """The run's controller and balancer for ``services`` (``examples/cartpole_dqn.toml``
    with ``services - 4`` actors; with a ``population``, a balancer per member with its
    share of them), the balancer timing each heartbeat to the end of the decision that
    first saw it."""
    from tianji.run.config import load_config
    from tianji.run.plan import RunPlan
    from tianji.runtime.controller import Controller
    from tianji.runtime.events import Heartbeat, HeartbeatBatch
    from tianji.services.balancer import Balancer
    from tianji.services.population import PopulationBalancer

    names = roles_of(services, population)
    members = sorted({n.split(".", 1)[0] for n, _ in names if "." in n}) or [""]
    balancers = {}
    for m in members:
        actors = sum(1 for n, r in names if r == "actor" and n.startswith(m))
        plan = RunPlan.build(load_config(str(EXAMPLE), [f"actors.count={actors}"]))
        balancers[m] = Balancer(plan.balance)
    inner = PopulationBalancer(balancers) if population > 1 else balancers[""]
    balancer = Timed(inner, list(balancers.values()))

    class TimedController(Controller):
        heartbeats_received = 0  # direct and in batches
        batches_received = 0

        async def on_request(self, ev: Any, conn: Any) -> None:
            if isinstance(ev, Heartbeat):
                balancer.pending.append(ev.sent_at)
                self.heartbeats_received += 1
            elif isinstance(ev, HeartbeatBatch):  # each heartbeat timed from its sent_at
                balancer.pending.extend(hb.sent_at for hb in ev.heartbeats)
                self.heartbeats_received += len(ev.heartbeats)
                self.batches_received += 1
            await super().on_request(ev, conn)

    return TimedController(bind="tcp://127.0.0.1:0", plugins=[balancer]), balancer


class _Watch:  # what the progress snapshot reads of the monitor (nothing moves here)
    env_steps = 0
    env_steps_by_actor: dict[str, int] = {}  # noqa: RUF012
    episodes = 0
    returns: Any = __import__("collections").deque(maxlen=20)

    def mean_return(self) -> float | None:
        return None


async def _controller_main(job: dict[str, Any]) -> dict[str, Any]:
    from tianji.run.members import MemberController
    from tianji.run.progress import RunFacts, take_snapshot
    from tianji.runtime.scope import local_view

    services, population = int(job["services"]), int(job.get("population", 1))
    ctl, balancer = _timed_controller(services, population)
    task = asyncio.create_task(ctl.run())
    await ctl.wait_ready()
    print(json.dumps({"address": ctl.address}), flush=True)
    names = dict(roles_of(services, population))
    if population == 1:
        views = {"": (ctl, RunFacts(services=tuple(names)))}
    else:  # as a population run: one snapshot per member, on its view of the controller
        views = {
            scope: (
                MemberController(  # the views the balancer files, as a population run has
                    ctl, scope, [b], balancer.inner.heartbeat_views, balancer.inner.registry_views
                ),
                RunFacts(services=tuple(local_view(names, scope))),
            )
            for scope, b in balancer.inner.members.items()
        }

    async def progress() -> None:
        last: dict[str, Any] = {}
        started = time.monotonic()
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            for scope, (view, facts) in views.items():
                elapsed = time.monotonic() - started
                last[scope] = take_snapshot(view, _Watch(), elapsed, facts, last.get(scope))

    progress_task = asyncio.create_task(progress())
    try:
        everyone = services + int(job.get("aggregators", 0))
        await ctl.wait_until(lambda c: len(c.registry) >= everyone, JOIN_TIMEOUT)
        await asyncio.sleep(float(job["warmup"]))
        window = await _window(ctl, balancer, float(job["seconds"]))
        return {"services": services, "population": population, **window}
    finally:
        progress_task.cancel()
        ctl.stop("bench over")
        try:
            await asyncio.wait_for(task, 30)
        except Exception as exc:  # the figures are in; say why the controller did not end well
            log.warning("the controller's end: %r", exc)


async def _window(ctl: Any, balancer: Any, seconds: float) -> dict[str, Any]:
    """The controller's figures over a window of ``seconds`` from now (and the CPU of the
    aggregators registered with it, processes of this host)."""
    from tianji.runtime.controller import AGGREGATOR_ROLE

    aggregators = [r.pid for r in ctl.registry.values() if r.role == AGGREGATOR_ROLE]
    agg_cpu0, batches0 = _cpu_s_of(aggregators), ctl.batches_received
    cpu0, t0 = _cpu_s(), time.monotonic()
    beats0, decisions0 = ctl.heartbeats_received, balancer.decisions
    commands0 = sum(balancer.commands.values())
    balancer.latencies.clear()
    await asyncio.sleep(seconds)
    window = time.monotonic() - t0
    cpu = _cpu_s() - cpu0
    agg_cpu = _cpu_s_of(aggregators) - agg_cpu0
    latencies = [x * 1000 for x in balancer.latencies]
    return {
        "registered": len(ctl.registry),
        "controller_cpu_share": round(cpu / window, 4),
        "decision_p50_ms": round(percentile(latencies, 50), 2) if latencies else None,
        "decision_p99_ms": round(percentile(latencies, 99), 2) if latencies else None,
        "controller_rss_mb": round(_rss_mb(), 1),
        "heartbeats_per_s": round((ctl.heartbeats_received - beats0) / window, 1),
        "decisions_per_s": round((balancer.decisions - decisions0) / window, 1),
        "commands_per_s": round((sum(balancer.commands.values()) - commands0) / window, 1),
        "window_s": round(window, 2),
        "aggregators": len(aggregators),
        "aggregator_cpu_share": round(agg_cpu / window, 4),  # all of them together
        "batches_per_s": round((ctl.batches_received - batches0) / window, 1),
    }


def _worker(kind: str) -> int:
    import logging

    from tianji.runtime.loop import run

    logging.basicConfig(
        level=os.environ.get("TIANJI_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {kind} %(levelname)s %(name)s: %(message)s",
    )

    _raise_fd_limit()
    job = json.loads(sys.stdin.readline())
    if kind == "controller":
        result = run(_controller_main(job))
    elif kind == "aggregator":
        result = run(_aggregator_main(job))
    else:
        from tianji.bench.scale_sim import Simulator

        async def simulate() -> dict[str, Any]:
            return await Simulator(job).run()

        result = run(simulate())
    print(json.dumps(result), flush=True)
    return 0


async def _aggregator_main(job: dict[str, Any]) -> dict[str, Any]:
    """A node's real heartbeat aggregator, of the node (locality) a simulator stands for,
    until stdin closes."""
    from tianji.runtime.aggregator import HeartbeatAggregator
    from tianji.runtime.loop import in_daemon_thread

    agg = HeartbeatAggregator(job["name"], bind="tcp://127.0.0.1:0", controller=job["address"])
    agg.locality = job["locality"]
    task = asyncio.create_task(agg.run())
    await agg.wait_ready()
    print(json.dumps({"address": agg.address}), flush=True)
    await in_daemon_thread(sys.stdin.read, "stdin")
    agg.stop("bench over")
    await task
    return dict(agg.counters)


def _first_line(proc: subprocess.Popen[str], what: str) -> dict[str, Any]:
    """The JSON line a child prints when it is up.

    Raises:
        RuntimeError: with its stderr, if it ended instead.
    """
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read() if proc.stderr is not None else ""
        raise RuntimeError(f"the {what} did not start: {err[-2000:]}")
    got: dict[str, Any] = json.loads(line)
    return got


# ------------------------------------------------------------------------- the driver
def measure_control(
    services: int, seconds: float, warmup: float, population: int = 1, aggregators: bool = False
) -> dict[str, Any]:
    """One control row: a controller process, ``SIM_PROCESSES`` simulator processes; with
    a ``population`` of N, the services are N members' (:func:`roles_of`) and the
    controller balances them as a population run does. With ``aggregators``, each
    simulator process stands for a node with a real heartbeat aggregator process
    (:class:`~tianji.runtime.aggregator.HeartbeatAggregator`) that its services heartbeat
    through (registration and commands stay on their own controller links).

    Raises:
        RuntimeError: when a process fails or the join does not finish (with its stderr).
    """
    cmd = [sys.executable, "-m", "tianji.bench.scale_control"]
    nodes = SIM_PROCESSES if aggregators else 0
    job: dict[str, Any] = {
        "services": services, "seconds": seconds, "warmup": warmup, "population": population,
        "aggregators": nodes,
    }  # fmt: skip
    ctl = start_json_child([*cmd, "--controller"], job)
    sims: list[subprocess.Popen[str]] = []
    try:
        address = _first_line(ctl, "controller")["address"]
        for k in range(nodes):  # up before the services, as a launcher starts them
            agg_job = {"address": address, "name": f"aggregator-{k}", "locality": f"node-{k}"}
            sims.append(start_json_child([*cmd, "--aggregator"], agg_job))
            _first_line(sims[-1], "aggregator")
        # the buffer's and learner's counters stand for the whole run: scale them by the
        # number of simulator processes (each sees its own actors' inserts)
        parts = _split(roles_of(services, population), SIM_PROCESSES)
        for k, part in enumerate(parts):
            phases = [((i * SIM_PROCESSES + k) / max(1, services)) % 1.0 for i in range(len(part))]
            job = {  # (a new job per simulator)
                "address": address,
                "names": part,
                "phases": phases,
                "scale": len(parts),
                "locality": f"node-{k}" if aggregators else "",
                "aggregated": aggregators,
            }
            sims.append(start_json_child([*cmd, "--sim"], job))
        _wait_for(ctl, sims, JOIN_TIMEOUT + warmup + seconds + 60)
        out, err = ctl.communicate(timeout=60)
        if ctl.returncode != 0:
            raise RuntimeError(f"the controller failed: {err[-2000:]}")
        row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return {"part": "control", **row, **_registry_figures(sims)}
    finally:
        for proc in [ctl, *sims]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait_for(ctl: subprocess.Popen[str], sims: list[subprocess.Popen[str]], limit: float) -> None:
    """Wait for the controller's process to end; a simulator that dies ends the row, with
    its reason.

    Raises:
        RuntimeError: a simulator's error, or none within ``limit`` seconds.
    """
    deadline = time.monotonic() + limit
    while ctl.poll() is None:
        for sim in sims:
            if sim.poll() is not None:
                err = sim.stderr.read() if sim.stderr is not None else ""
                start = max(0, err.find("Traceback"))  # its error, not what followed
                raise RuntimeError(f"a simulator exited {sim.returncode}: {err[start:][:1500]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no result within {limit:.0f} s")
        time.sleep(0.5)


def _registry_figures(sims: list[subprocess.Popen[str]]) -> dict[str, Any]:
    """Stop the simulators (their stdin closes) and merge what they report: the
    registry's answer times, the join's length and the connect retries."""
    register: list[float] = []
    retried = 0
    joins: list[float] = []
    aggregated: dict[str, int] = {}  # the aggregators' counters, summed
    for sim in sims:
        sim_out, _ = sim.communicate(timeout=60)  # closes its stdin: it stops, reports
        lines = sim_out.strip().splitlines()
        if lines and lines[-1].startswith("{"):
            got = json.loads(lines[-1])
            if "register_ms" not in got:  # an aggregator's counters
                for key in ("heartbeats_in", "heartbeats_out", "batches_out", "superseded"):
                    aggregated[f"aggregator_{key}"] = aggregated.get(f"aggregator_{key}", 0)
                    aggregated[f"aggregator_{key}"] += int(got.get(key, 0))
                continue
            register += got["register_ms"]
            joins.append(got["join_s"])
            retried += got["connect_retries"]
    return {
        "register_p50_ms": round(percentile(register, 50), 2) if register else None,
        "register_p99_ms": round(percentile(register, 99), 2) if register else None,
        "join_s": round(max(joins), 2) if joins else None,
        "connect_retries": retried,
        **aggregated,
    }


def _split(items: Sequence[tuple[str, str]], parts: int) -> list[list[tuple[str, str]]]:
    return [list(items[k::parts]) for k in range(parts) if items[k::parts]]


if __name__ == "__main__":
    kinds = [k for k in ("controller", "aggregator") if f"--{k}" in sys.argv]
    sys.exit(_worker(kinds[0] if kinds else "sim"))
