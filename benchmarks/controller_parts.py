"""Where the controller's CPU goes, part by part, in the scale bench's control row.

    python benchmarks/controller_parts.py --aggregators --out docs/results/controller-parts

Runs one row of ``tianji bench scale --parts control``
(:func:`tianji.bench.scale_control.measure_control`) with the controller's process timing
its parts: each named function is wrapped, in that
process only, to add up its calls and the thread CPU time they take (``time.thread_time``;
only functions that never wait, so nothing else runs inside the time). At the end the
same process also times the tally's update of one real heartbeat in a tight loop, so the
two costs of the same work are side by side: inside the running controller and with its
data in the CPU's caches.

Prints a table and writes ``OUT.json`` / ``OUT.md``. Run it alone on the machine. The
figures cover the controller's whole life (its join and warm-up too), so compare the
parts with each other, not with the row's ``controller_cpu_share``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

PARTS = {
    "tcp receive (per read)": "tianji.transports.tcp:_StreamProtocol.buffer_updated",
    "decode (per message)": "tianji.runtime.wiring:Messages.decode",
    "take a heartbeat batch": "tianji.runtime.controller:Controller._take_batch",
    "tally scan (per decision)": "tianji.rl.tally:Tally.scan",
    "tally update of one heartbeat": "tianji.rl.tally:Tally._take",
    "decision view (per decision)": "tianji.rl.tally:Tally.decision_view",
    "policy decide (per decision)": "tianji.rl.balance:BalancePolicy.decide",
    "progress snapshot": "tianji.run.progress:take_snapshot",
}

_SITE = """
import atexit, importlib, json, os, sys, time, timeit
if "--controller" in sys.argv:
    _parts = json.loads(os.environ["TIANJI_PARTS"])
    _spent = {}
    _seen = {}
    _inner = {}  # spec -> the function before it was wrapped

    def _wrap(label, spec):
        module, qual = spec.split(":")
        owner = importlib.import_module(module)
        *path, name = qual.split(".")
        for attr in path:
            owner = getattr(owner, attr)
        inner = _inner[spec] = getattr(owner, name)
        tally = _spent.setdefault(label, [0, 0.0])

        def timed(*args, **kwargs):
            started = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                tally[0] += 1
                tally[1] += time.thread_time() - started

        setattr(owner, name, timed)

    for label, spec in _parts.items():
        _wrap(label, spec)
    import tianji.rl.tally as _tally_module
    _init = _tally_module.Tally.__init__

    def _keep(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        _seen.setdefault("tallies", []).append(self)

    _tally_module.Tally.__init__ = _keep

    def _report():
        hot = None
        tallies = _seen.get("tallies", [])
        tally = max(tallies, key=lambda t: len(t._seen), default=None)  # the balancer's
        take = _inner.get("tianji.rl.tally:Tally._take")
        if tally is not None and take is not None:
            actors = [(n, hb) for n, hb in tally._seen.items() if hb.role == "actor"][:200]
            if actors:
                runs = 20
                spent = timeit.timeit(lambda: [take(tally, n, hb) for n, hb in actors], number=runs)
                hot = spent / (runs * len(actors))
        out = {k: {"calls": n, "cpu_s": s} for k, (n, s) in _spent.items()}
        with open(os.environ["TIANJI_PARTS_OUT"], "w") as f:
            json.dump({"parts": out, "hot_take_s": hot, "process_cpu_s": time.process_time()}, f)

    atexit.register(_report)
"""


def measure(services: int, aggregators: bool, seconds: float, warmup: float) -> dict[str, Any]:
    from tianji.bench.scale_control import measure_control

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(_SITE)
        out = Path(tmp, "parts.json")
        env = {"TIANJI_PARTS": json.dumps(PARTS), "TIANJI_PARTS_OUT": str(out)}
        saved = {k: os.environ.get(k) for k in [*env, "PYTHONPATH"]}
        os.environ.update(env)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, saved["PYTHONPATH"]]))
        try:
            row = measure_control(services, seconds, warmup, 1, aggregators)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        if not out.exists():
            raise SystemExit("the controller wrote no timings (its sitecustomize did not run)")
        timings: dict[str, Any] = json.loads(out.read_text())
    return {"row": row, **timings}


def table(got: dict[str, Any]) -> list[str]:
    lines = [
        "| part | calls | CPU s | us per call |",
        "|---|---:|---:|---:|",
    ]
    for label, t in got["parts"].items():
        per = t["cpu_s"] / t["calls"] * 1e6 if t["calls"] else 0.0
        lines.append(f"| {label} | {t['calls']:,} | {t['cpu_s']:.3f} | {per:.1f} |")
    if got.get("hot_take_s") is not None:
        lines.append(
            f"| tally update of one heartbeat, tight loop at exit | | | "
            f"{got['hot_take_s'] * 1e6:.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--aggregators", action="store_true", help="one per simulator node")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    got = measure(args.services, args.aggregators, args.seconds, args.warmup)
    row = got["row"]
    head = (
        f"{args.services:,} services, {'aggregators' if args.aggregators else 'direct'}: "
        f"controller CPU {row['controller_cpu_share']} of a core over the "
        f"{row['window_s']}-s window, {row['decisions_per_s']} decisions/s, "
        f"{row.get('batches_per_s', 0)} batches/s, process CPU {got['process_cpu_s']:.2f} s"
    )
    lines = table(got)
    print(head, *lines, sep="\n")
    if args.out is not None:
        command = "python benchmarks/controller_parts.py " + " ".join(argv or sys.argv[1:])
        args.out.with_suffix(".json").write_text(json.dumps({"command": command, **got}))
        text = [f"# Controller parts (`{command}`)", "", head, "", *lines]
        args.out.with_suffix(".md").write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
