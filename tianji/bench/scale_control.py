"""``tianji bench scale``, control part: one controller and S simulated services over real TCP.

The controller is the real one (:class:`~tianji.runtime.controller.Controller` with the
run's :class:`~tianji.services.balancer.Balancer`, balance settings of
``examples/cartpole_dqn.toml`` with S - 4 actors), in a process of its own that also takes
a progress snapshot every 2 s as ``tianji train`` does. The S services are simulated,
many per process (``SIM_PROCESSES``), each with its own TCP connection and the real wire
events: it registers (``RegisterService`` with its role's topics), watches its role's
topics (``WatchTopics``), then sends a ``Heartbeat`` every second with its role's counters
moving as in a run (actors insert a fragment a second while granted; the learner consumes
what the buffer inserted) and reads the controller's commands (pause/resume, grants).

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
import sys
import threading
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


def _topics() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Role -> (topics it publishes, topics it watches), as the real services of a
    one-learner, one-shard DQN run."""
    from tianji.rl import topics as t

    traj = t.trajectories_topic(0, 1)
    learner = t.learner_name(0)
    return {
        "actor": ((traj, t.EPISODES), (t.LATEST_PARAMS,)),
        "buffer": ((t.batches_topic(learner),), (traj, t.REQUESTS, t.priorities_topic(0, 1))),
        "learner": (
            (t.REQUESTS, t.priorities_topic(0, 1), t.LEARNER_PARAMS, t.CHECKPOINTS),
            (t.batches_topic(learner),),
        ),
        "params": ((t.LATEST_PARAMS,), (t.LEARNER_PARAMS,)),
        "monitor": ((), (t.EPISODES, t.CHECKPOINTS)),
    }


ROLES = ("actor", "buffer", "learner", "params", "monitor")


def roles_of(services: int) -> list[tuple[str, str]]:
    """``(name, role)`` of a run of ``services``: params, buffer, learner, monitor and
    ``services - 4`` actors."""
    if services < 5:
        raise ValueError(f"services={services}: at least 5 (4 fixed services and an actor)")
    fixed = [("params-0", "params"), ("buffer-0", "buffer"), ("learner-0", "learner")]
    fixed.append(("monitor", "monitor"))
    return fixed + [(f"actor-{i}", "actor") for i in range(services - 4)]


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


# ------------------------------------------------------------------------- the controller
async def _controller_main(job: dict[str, Any]) -> dict[str, Any]:
    from tianji.run.config import load_config
    from tianji.run.plan import RunPlan
    from tianji.run.progress import RunFacts, take_snapshot
    from tianji.runtime.controller import Controller
    from tianji.runtime.events import Heartbeat
    from tianji.services.balancer import Balancer

    services = int(job["services"])
    config = load_config(str(EXAMPLE), [f"actors.count={services - 4}"])
    plan = RunPlan.build(config)

    class TimedBalancer(Balancer):
        """The run's balancer, timing each heartbeat to the end of the decision that
        first saw it."""

        pending: list[float] = []  # noqa: RUF012 (replaced per instance below)
        latencies: list[float] = []  # noqa: RUF012

        async def update(self, heartbeats: Any, live: Any) -> None:
            seen, self.pending = self.pending, []
            await super().update(heartbeats, live)
            done = time.time()
            self.latencies.extend(done - t for t in seen)

    balancer = TimedBalancer(plan.balance)
    balancer.pending, balancer.latencies = [], []

    class TimedController(Controller):
        heartbeats_received = 0

        async def on_request(self, ev: Any, conn: Any) -> None:
            if isinstance(ev, Heartbeat):
                balancer.pending.append(ev.sent_at)
                self.heartbeats_received += 1
            await super().on_request(ev, conn)

    class Watch:  # what the progress snapshot reads of the monitor (nothing moves here)
        env_steps = 0
        env_steps_by_actor: dict[str, int] = {}  # noqa: RUF012
        episodes = 0
        returns: Any = __import__("collections").deque(maxlen=20)

        def mean_return(self) -> float | None:
            return None

    ctl = TimedController(bind="tcp://127.0.0.1:0", plugins=[balancer])
    task = asyncio.create_task(ctl.run())
    await ctl.wait_ready()
    print(json.dumps({"address": ctl.address}), flush=True)
    facts = RunFacts(services=tuple(n for n, _ in roles_of(services)))

    async def progress() -> None:
        last = None
        started = time.monotonic()
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            last = take_snapshot(ctl, Watch(), time.monotonic() - started, facts, last)

    progress_task = asyncio.create_task(progress())
    try:
        await ctl.wait_until(lambda c: len(c.registry) >= services, JOIN_TIMEOUT)
        await asyncio.sleep(float(job["warmup"]))
        cpu0, t0 = _cpu_s(), time.monotonic()
        beats0, decisions0 = ctl.heartbeats_received, balancer.decisions
        commands0 = sum(balancer.commands.values())
        balancer.latencies.clear()
        await asyncio.sleep(float(job["seconds"]))
        window = time.monotonic() - t0
        cpu = _cpu_s() - cpu0
        latencies = [x * 1000 for x in balancer.latencies]
        return {
            "services": services,
            "registered": len(ctl.registry),
            "controller_cpu_share": round(cpu / window, 4),
            "decision_p50_ms": round(percentile(latencies, 50), 2) if latencies else None,
            "decision_p99_ms": round(percentile(latencies, 99), 2) if latencies else None,
            "controller_rss_mb": round(_rss_mb(), 1),
            "heartbeats_per_s": round((ctl.heartbeats_received - beats0) / window, 1),
            "decisions_per_s": round((balancer.decisions - decisions0) / window, 1),
            "commands_per_s": round((sum(balancer.commands.values()) - commands0) / window, 1),
            "window_s": round(window, 2),
        }
    finally:
        progress_task.cancel()
        ctl.stop("bench over")
        try:
            await asyncio.wait_for(task, 30)
        except Exception as exc:  # the figures are in; say why the controller did not end well
            log.warning("the controller's end: %r", exc)


# ------------------------------------------------------------------------- the simulators
class _Sim:
    """One simulated service: its connection, its counters and its registry timings."""

    def __init__(self, name: str, role: str, phase: float) -> None:
        self.name, self.role, self.phase = name, role, phase
        self.conn: Any = None
        self.sent_at = 0.0
        self.waiting: set[str] = set()
        self.answered: float | None = None
        self.limit: int | None = None  # fragments granted in all (None: no grant yet)
        self.counters: dict[str, int] = {}
        self.gauges: dict[str, float] = {}


async def _sim_main(job: dict[str, Any]) -> dict[str, Any]:
    from tianji.rl.stats import ActorStat, BufferStat, LearnerStat
    from tianji.runtime.codec import Codec
    from tianji.runtime.core import Limits
    from tianji.runtime.errors import TianjiError
    from tianji.runtime.events import (
        Heartbeat,
        PublishersChanged,
        RegisterService,
        ServiceRegistered,
        Shutdown,
        WatchTopics,
    )
    from tianji.runtime.plugins import transport_for

    topology = _topics()
    codec = Codec()
    address = job["address"]
    transport = transport_for(address)
    limits = Limits()
    fragment = 256  # samples an actor inserts per second
    sims = [
        _Sim(name, role, phase)
        for (name, role), phase in zip(job["names"], job["phases"], strict=True)
    ]
    host = f"sim-{os.getpid()}"

    def frames(ev: Any) -> list[Any]:
        return [b"", *codec.encode(ev)]  # CONTROL topic, then the event

    async def reader(sim: _Sim) -> None:
        from tianji.rl.events import GrantProduction

        try:
            while True:
                got = await sim.conn.recv()
                ev = codec.decode(got[1:])
                if isinstance(ev, ServiceRegistered):
                    sim.waiting.discard("")
                elif isinstance(ev, PublishersChanged):
                    sim.waiting.discard(ev.topic)
                elif isinstance(ev, GrantProduction):
                    sim.limit = ev.limit
                elif isinstance(ev, Shutdown):
                    return
                if sim.answered is None and not sim.waiting:
                    sim.answered = time.time()
                    answered.append(sim)
                    if len(answered) == len(sims):
                        all_answered.set()
        except TianjiError as exc:  # the controller closed the link: the bench is over
            log.debug("%s: link closed: %r", sim.name, exc)

    async def join(sim: _Sim, gate: asyncio.Semaphore) -> None:
        publishes, watches = topology[sim.role]
        async with gate:
            delay = 0.05
            while True:  # as a service does: a refused or reset connect is tried again
                try:
                    sim.conn = await transport.connect(address, limits=limits)
                    break
                except TianjiError as exc:
                    log.debug("%s: connect: %r; again", sim.name, exc)
                    retries.append(sim.name)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            tasks.append(asyncio.create_task(reader(sim)))
            sim.waiting = {"", *watches}
            sim.sent_at = time.time()
            reg = RegisterService(
                name=sim.name,
                role=sim.role,
                address=f"tcp://127.0.0.1:{10000 + hash(sim.name) % 50000}",
                publishes=publishes,
                host=host,
                pid=os.getpid(),
                local_address="",
                locality=host,
                run_digest="",
            )
            await sim.conn.send(frames(reg))
            await sim.conn.send(frames(WatchTopics(topics=watches)))

    answered: list[_Sim] = []
    retries: list[str] = []  # connects that failed (the controller's accept queue was full)
    all_answered = asyncio.Event()
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    tasks: list[asyncio.Task[None]] = []
    gate = asyncio.Semaphore(64)  # connections being made at once, per simulator
    joined0 = time.time()
    await asyncio.gather(*(join(s, gate) for s in sims))
    await all_answered.wait()
    joined = time.time()
    start = time.monotonic()
    inserted = consumed = 0
    next_beat = {id(s): start + s.phase for s in sims}
    while not stop.is_set():  # until the driver closes our stdin
        now = time.monotonic()
        for sim in sims:
            if next_beat[id(sim)] > now:
                continue
            next_beat[id(sim)] += 1.0
            c = sim.counters
            granted = sim.limit is None or c.get(ActorStat.FRAGMENTS_SENT, 0) < sim.limit
            if sim.role == "actor" and granted:
                c[ActorStat.ENV_STEPS] = c.get(ActorStat.ENV_STEPS, 0) + fragment
                c[ActorStat.SAMPLES_PRODUCED] = c.get(ActorStat.SAMPLES_PRODUCED, 0) + fragment
                c[ActorStat.FRAGMENTS_SENT] = c.get(ActorStat.FRAGMENTS_SENT, 0) + 1
                c[ActorStat.EPISODES] = c.get(ActorStat.EPISODES, 0) + 10
                sim.gauges[ActorStat.POLICY_VERSION] = float(int(now - start))
                inserted += fragment
            elif sim.role == "buffer":
                c[BufferStat.SAMPLES_INSERTED] = inserted * int(job["scale"])
                c[BufferStat.SAMPLES_SENT] = consumed
                sim.gauges[BufferStat.SIZE] = float(min(inserted, 100_000))
            elif sim.role == "learner":
                consumed = inserted * int(job["scale"]) * 2
                c[LearnerStat.SAMPLES_RECEIVED] = consumed
                c[LearnerStat.SAMPLES_CONSUMED] = consumed
                c[LearnerStat.LEARNER_UPDATES] = int(now - start)
                sim.gauges[LearnerStat.PARAMS_VERSION] = float(int(now - start))
            hb = Heartbeat(
                name=sim.name,
                role=sim.role,
                state="running",
                counters=dict(c),
                gauges={**sim.gauges, "rss_mb": 250.0, "max_rss_mb": 260.0},
                queue_depths={},
                sent_at=time.time(),
            )
            try:
                sim.conn.send_nowait(frames(hb))
            except TianjiError as exc:  # full or gone: this heartbeat is skipped
                log.debug("%s: heartbeat not sent: %r", sim.name, exc)
        await asyncio.sleep(0.01)
    for sim in sims:
        sim.conn.abort()
    for task in tasks:
        task.cancel()
    waits = [(s.answered - s.sent_at) * 1000 for s in sims if s.answered is not None]
    return {"register_ms": waits, "join_s": joined - joined0, "connect_retries": len(retries)}


def _worker(kind: str) -> int:
    import logging

    from tianji.runtime.loop import run

    logging.basicConfig(
        level=os.environ.get("TIANJI_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {kind} %(levelname)s %(name)s: %(message)s",
    )

    _raise_fd_limit()
    job = json.loads(sys.stdin.readline())
    main = _controller_main if kind == "controller" else _sim_main
    result = run(main(job))
    print(json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------------- the driver
def measure_control(services: int, seconds: float, warmup: float) -> dict[str, Any]:
    """One control row: a controller process, ``SIM_PROCESSES`` simulator processes.

    Raises:
        RuntimeError: when a process fails or the join does not finish (with its stderr).
    """
    import subprocess

    names = roles_of(services)
    # the buffer's and learner's counters stand for the whole run: scale them by the
    # number of simulator processes (each sees its own actors' inserts)
    cmd = [sys.executable, "-m", "tianji.bench.scale_control"]
    job: dict[str, Any] = {"services": services, "seconds": seconds, "warmup": warmup}
    ctl = start_json_child([*cmd, "--controller"], job)
    sims: list[subprocess.Popen[str]] = []
    try:
        assert ctl.stdout is not None
        line = ctl.stdout.readline()
        if not line:
            err = ctl.stderr.read() if ctl.stderr is not None else ""
            raise RuntimeError(f"the controller did not start: {err[-2000:]}")
        address = json.loads(line)["address"]
        run_s = JOIN_TIMEOUT + warmup + seconds  # at most
        parts = _split(names, SIM_PROCESSES)
        for k, part in enumerate(parts):
            phases = [((i * SIM_PROCESSES + k) / max(1, services)) % 1.0 for i in range(len(part))]
            job = {  # (a new job per simulator)
                "address": address,
                "names": part,
                "phases": phases,
                "scale": len(parts),
            }
            sim = start_json_child([*cmd, "--sim"], job)
            sims.append(sim)
        deadline = time.monotonic() + run_s + 60
        while ctl.poll() is None:  # a simulator that dies ends the row, with its reason
            for sim in sims:
                if sim.poll() is not None:
                    err = sim.stderr.read() if sim.stderr is not None else ""
                    start = max(0, err.find("Traceback"))  # its error, not what followed
                    raise RuntimeError(f"a simulator exited {sim.returncode}: {err[start:][:1500]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no result within {run_s + 60:.0f} s")
            time.sleep(0.5)
        out, err = ctl.communicate(timeout=60)
        if ctl.returncode != 0:
            raise RuntimeError(f"the controller failed: {err[-2000:]}")
        row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        register: list[float] = []
        retried = 0
        joins: list[float] = []
        for sim in sims:
            sim_out, _ = sim.communicate(timeout=60)  # closes its stdin: it stops, reports
            lines = sim_out.strip().splitlines()
            if lines and lines[-1].startswith("{"):
                got = json.loads(lines[-1])
                register += got["register_ms"]
                joins.append(got["join_s"])
                retried += got["connect_retries"]
        row["register_p50_ms"] = round(percentile(register, 50), 2) if register else None
        row["register_p99_ms"] = round(percentile(register, 99), 2) if register else None
        row["join_s"] = round(max(joins), 2) if joins else None
        row["connect_retries"] = retried
        return {"part": "control", **row}
    finally:
        for proc in [ctl, *sims]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _split(items: Sequence[tuple[str, str]], parts: int) -> list[list[tuple[str, str]]]:
    return [list(items[k::parts]) for k in range(parts) if items[k::parts]]


if __name__ == "__main__":
    sys.exit(_worker("controller" if "--controller" in sys.argv else "sim"))
