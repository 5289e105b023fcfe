"""What one balance decision costs the controller, alone (no network): the balancer's part of
the controller's CPU, as the run grows.

    python benchmarks/balancer_decision.py --out docs/results/balancer-decision

The run is ``examples/cartpole_dqn.toml`` with P actors (P + 4 services, as ``tianji bench
scale`` simulates them), its :class:`~tianji.services.balancer.Balancer` fed from the
controller's own kind of maps (:class:`~tianji.runtime.registry.Registry` for the latest
heartbeats and the registry). Between two decisions ``changed`` actors send a new heartbeat
(each moves its fragments sent when its grant allows); every 50th decision the buffer and the
learner report too (the buffer with one offset per actor stream). Prints and writes the
microseconds per decision, measured around ``Balancer.update`` only (building heartbeats is
not timed), for each P. Run it alone on the machine. It also runs on a checkout from before
the ``Registry`` (plain dicts then), to compare the two side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tianji.rl.stats import ActorStat, BufferStat, LearnerStat
from tianji.run.config import load_config
from tianji.run.plan import RunPlan
from tianji.runtime.events import Event, Heartbeat
from tianji.services.balancer import Balancer

try:
    from tianji.runtime.registry import Registry
except ImportError:  # a checkout from before the Registry (to measure it side by side)
    Registry = dict  # type: ignore[misc,assignment]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cartpole_dqn.toml"
_PLUS_ONE = bytes((b + 1) % 256 for b in range(256))


class _Run:
    """The heartbeats of a simulated run of ``actors`` actors, a buffer and a learner."""

    def __init__(self, actors: int, fragment: int) -> None:
        self.names = [f"actor-{i}" for i in range(actors)]
        self.fragment = fragment
        self.sent = dict.fromkeys(self.names, 0)
        self.limits: dict[str, int] = {}
        self.inserted = 0
        self.heartbeats: Registry[Heartbeat] = Registry()
        self.live: Registry[Any] = Registry()
        for name in [*self.names, "buffer-0", "learner-0", "params-0", "monitor"]:
            self.live[name] = SimpleNamespace(registered_at=1.0, last_heartbeat=True)
        for name in self.names:
            self.heartbeats[name] = self.actor(name)
        self.heartbeats["buffer-0"], self.heartbeats["learner-0"] = self.buffer(), self.learner()

    async def send(self, name: str, ev: Event) -> bool:
        limit = getattr(ev, "limit", None)
        if limit is not None and name in self.sent:
            self.limits[name] = limit
        return True

    def actor(self, name: str) -> Heartbeat:
        sent = self.sent[name]
        produced = sent * self.fragment
        counters = {ActorStat.FRAGMENTS_SENT: sent, ActorStat.SAMPLES_PRODUCED: produced}
        gauges = {
            ActorStat.POLICY_VERSION: 1.0,
            ActorStat.FRAGMENTS_AT_VERSION: 1.0,
            "sent/main": float(sent * self.fragment),
        }
        return Heartbeat(
            name=name, role="actor", state="running", counters=counters, gauges=gauges,
            queue_depths={}, sent_at=0.0,
        )  # fmt: skip

    def buffer(self) -> Heartbeat:
        offsets = {f"recv/{n}/main": float(self.sent[n] * self.fragment) for n in self.names}
        return Heartbeat(
            name="buffer-0", role="buffer", state="running",
            counters={BufferStat.SAMPLES_INSERTED: self.inserted},
            gauges={BufferStat.READY: 1.0, **offsets}, queue_depths={}, sent_at=0.0,
        )  # fmt: skip

    def learner(self) -> Heartbeat:
        return Heartbeat(
            name="learner-0", role="learner", state="running",
            counters={LearnerStat.SAMPLES_CONSUMED: self.inserted, LearnerStat.LEARNER_UPDATES: 1},
            gauges={LearnerStat.PARAMS_VERSION: 1.0}, queue_depths={}, sent_at=0.0,
        )  # fmt: skip

    def move(self, actors: list[str], everyone: bool) -> None:
        for name in actors:
            if self.sent[name] < self.limits.get(name, 0):
                self.sent[name] += 1
                self.inserted += self.fragment
            self.heartbeats[name] = self.actor(name)
        if everyone:
            self.heartbeats["buffer-0"] = self.buffer()
            self.heartbeats["learner-0"] = self.learner()


async def measure(actors: int, changed: int, decisions: int, evict_mb: int = 0) -> dict[str, Any]:
    """Microseconds per ``Balancer.update`` over ``decisions`` decisions (after 100 warm-up
    ones) with ``changed`` actors' heartbeats new before each; with ``evict_mb``, that
    many MB are read and written between two decisions (untimed), as a controller's other
    work (receiving, decoding) pushes the balancer's data out of the CPU's caches."""
    plan = RunPlan.build(load_config(str(EXAMPLE), [f"actors.count={actors}"]))
    run = _Run(actors, plan.balance.fragment_samples)
    balancer = Balancer(plan.balance, run.send)
    junk = bytearray(evict_mb << 20)
    spent, k = 0.0, 0
    for i in range(decisions + 100):
        batch = [run.names[(k + j) % actors] for j in range(changed)]
        k += changed
        run.move(batch, everyone=i % 50 == 0)
        if junk:
            junk[:] = junk.translate(_PLUS_ONE)  # every byte read and written once
        started = time.perf_counter()
        await balancer.update(run.heartbeats, run.live)
        if i >= 100:
            spent += time.perf_counter() - started
    return {
        "actors": actors,
        "changed_per_decision": changed,
        "decisions": decisions,
        "evict_mb": evict_mb,
        "us_per_decision": round(spent / decisions * 1e6, 1),
        "grants_sent": balancer.commands.get("grant_production", 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[96, 996, 9996])
    parser.add_argument("--changed", type=int, default=20, help="new heartbeats per decision")
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument(
        "--evict-mb", type=int, default=0, help="MB touched between decisions (cold caches)"
    )
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    rows = []
    for actors in args.actors:
        row = asyncio.run(measure(actors, args.changed, args.decisions, args.evict_mb))
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out is not None:
        command = "python benchmarks/balancer_decision.py " + " ".join(argv or sys.argv[1:])
        args.out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}))
        lines = [
            "# One balance decision, alone (`benchmarks/balancer_decision.py`)", "",
            f"Command: `{command}`", "",
            "| actors | changed heartbeats per decision | MB touched between | us per decision |",
            "|---:|---:|---:|---:|",
            *(f"| {r['actors']:,} | {r['changed_per_decision']} | {r['evict_mb']} "
              f"| {r['us_per_decision']} |" for r in rows),
        ]  # fmt: skip
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
