"""The controller's cost of a population: one policy vs a population of 4, the same actors.

    python benchmarks/population_control.py --actors 996 --out docs/results

Runs ``tianji bench scale``'s control part (a real controller over real TCP, its services
simulated with the real wire events, a progress snapshot every 2 s as ``tianji train``
takes) twice per repeat, one row after the other: a single-policy run of ``4 + actors``
services, and a population of ``--population`` members (each with its params service,
buffer, learner and monitor; the same actors split among them) balanced by the
population's balancer with one snapshot per member. Reports the controller process's CPU
share of each and their ratio (the goal: a population of 4 costs at most 1.10x). Writes
``<out>/population-control.json``. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tianji.bench.scale_control import measure_control


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/population_control.py", description=__doc__)
    p.add_argument("--actors", type=int, default=996)
    p.add_argument("--population", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    for r in range(args.repeats):
        for members in (1, args.population):
            services = 4 * members + args.actors
            row = measure_control(services, args.seconds, args.warmup, members)
            rows.append(row)
            print(
                f"repeat {r}: population {members}, {services} services: controller "
                f"{row['controller_cpu_share']:.3f} of a core, decision p99 "
                f"{row['decision_p99_ms']} ms",
                file=sys.stderr,
                flush=True,
            )

    def share(members: int) -> float:
        return statistics.median(
            r["controller_cpu_share"] for r in rows if r["population"] == members
        )

    single, population = share(1), share(args.population)
    totals = {
        "actors": args.actors,
        "population": args.population,
        "single_cpu_share_median": single,
        "population_cpu_share_median": population,
        "ratio": round(population / single, 3) if single > 0 else None,
        "goal": "ratio <= 1.10",
    }
    totals["goal_met"] = totals["ratio"] is not None and totals["ratio"] <= 1.10
    print(json.dumps(totals))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"benchmark": "population-control", "rows": rows, "totals": totals}
        (args.out / "population-control.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
