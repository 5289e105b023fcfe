"""What a restart leaves behind in the process that outlives it (not part of CI).

    python benchmarks/restart_memory.py [--kills 5] [--service buffer-0|any] [--top 15]
                                        [--tracemalloc 15] [--seed 0]
                                        [--config examples/cartpole_dqn.toml] [--set K=V ...]

Runs ``tianji train`` in this process (so the launcher's controller, monitor and dashboard
live here), with replay snapshots every 5 s. After ``--warmup`` seconds it kills
``--service`` (SIGKILL to the pid it registered) ``--kills`` times, each time once its new
incarnation has run for ``--gap`` seconds (a snapshot has arrived from it). After each kill
it prints this process's RSS and a census of the objects a dead peer could leave behind
(TCP connections and their protocols, receive-buffer pools, subscription links, replay
snapshots held for restores), and at the end the types whose live count grew most.
Flat counts and RSS: a restart leaks nothing here.

``--service any`` kills a random running service of a restartable role each time (as
``tianji bench chaos`` does; the learner resumes from its checkpoint). ``--tracemalloc N``
traces this process's allocations from the first kill and prints the N source lines whose
live memory grew most by the last one.
"""

from __future__ import annotations

import argparse
import collections
import gc
import io
import json
import os
import random
import signal
import sys
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("actor", "inference", "buffer", "eval", "params", "learner")
WATCHED = ("TcpConnection", "_StreamProtocol", "BufferPool", "Link", "Checkpoint")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def census(every: bool = False) -> dict[str, int]:
    """Live objects of the watched types (``every``: of every type)."""
    gc.collect()
    kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
    return dict(kinds) if every else {k: kinds[k] for k in WATCHED}


def status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def drive(out: io.StringIO, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    url = ""
    while not url:
        for line in out.getvalue().splitlines():
            if line.startswith("dashboard: "):
                url = line.split(" ", 1)[1].strip() + "api/status"
        time.sleep(0.5)
    time.sleep(args.warmup)
    if args.tracemalloc:
        tracemalloc.start(8)
        traced = tracemalloc.take_snapshot()
    rows.append({"kill": 0, "rss_mb": round(rss_mb(), 1), **census()})
    print(rows[-1], file=sys.stderr, flush=True)
    first = census(every=True)
    pick = random.Random(args.seed)
    dead: set[int] = set()
    for k in range(1, args.kills + 1):
        while True:
            rows_now = [
                s
                for s in status(url)["services"]
                if s["pid"]
                and s["state"] == "running"
                and s["pid"] not in dead
                and (s["name"] == args.service or (args.service == "any" and s["role"] in ROLES))
            ]
            if rows_now:
                break
            time.sleep(0.5)
        time.sleep(args.gap)
        row = pick.choice(rows_now)
        os.kill(row["pid"], signal.SIGKILL)
        dead.add(row["pid"])
        time.sleep(args.gap)
        rows.append({"kill": k, "killed": row["name"], "rss_mb": round(rss_mb(), 1), **census()})
        print(rows[-1], file=sys.stderr, flush=True)
    last_all = census(every=True)
    grown = sorted(((last_all[k] - first.get(k, 0), k) for k in last_all), reverse=True)
    print("types grown most:", [(k, n) for n, k in grown[: args.top] if n > 0], file=sys.stderr)
    if args.tracemalloc:
        diff = tracemalloc.take_snapshot().compare_to(traced, "traceback")
        for stat in diff[: args.tracemalloc]:
            print(
                f"{stat.size_diff / 1024:+.1f} KiB in {stat.count_diff:+d} blocks:", file=sys.stderr
            )
            for line in stat.traceback.format()[-8:]:
                print("   ", line, file=sys.stderr)
    os.kill(os.getpid(), signal.SIGTERM)  # a clean stop of the run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "cartpole_dqn.toml"))
    p.add_argument("--service", default="buffer-0")
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--warmup", type=float, default=70.0, help="s before the first kill")
    p.add_argument("--gap", type=float, default=12.0, help="s a new incarnation runs")
    p.add_argument("--top", type=int, default=15, help="types whose count grew most")
    p.add_argument("--tracemalloc", type=int, default=0, help="source lines grown most")
    p.add_argument("--seed", type=int, default=0, help="which service --service any kills")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    from tianji.run.config import load_config
    from tianji.run.train import train

    seconds = args.warmup + args.kills * (2 * args.gap + 40) + 60
    sets = [
        "checkpoint.replay=true",
        "checkpoint.every_seconds=5",
        'recovery.buffer="snapshot"',
        "recovery.backoff=0.5",
        *(
            [f"recovery.restarts.{role}={args.kills + 1}" for role in ROLES]
            + ['recovery.learner="resume"']
            if args.service == "any"
            else [f"recovery.restarts.{args.service.rsplit('-', 1)[0]}={args.kills + 1}"]
        ),
        f"stop.max_seconds={seconds}",
        "stop.target_return=1e9",
        *args.set,
    ]
    out = io.StringIO()
    rows: list[dict[str, Any]] = []
    threading.Thread(target=drive, args=(out, args, rows), daemon=True).start()
    train(load_config(args.config, sets), dashboard="127.0.0.1:0", out=out)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
