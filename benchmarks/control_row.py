"""One row of ``tianji bench scale --parts control``, several times in a row, to read a
change against the machine's run-to-run spread.

    python benchmarks/control_row.py --services 1000 --aggregators --repeat 3 \\
        --out docs/results/scale-control-ticks-1000-repeat

Each repeat is :func:`tianji.bench.scale_control.measure_control` with the bench's own
settings (a 20-s window after a 5-s warm-up). Prints one line per repeat and writes
``OUT.json`` / ``OUT.md``. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

KEYS = (
    "controller_cpu_share",
    "decisions_per_s",
    "batches_per_s",
    "decision_p50_ms",
    "decision_p99_ms",
    "aggregator_cpu_share",
)


def commit() -> str:
    here = Path(__file__).resolve().parents[1]
    got = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return got.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    from tianji.bench.scale_control import measure_control

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--aggregators", action="store_true", help="one per simulator node")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: at least 1")
    rows: list[dict[str, Any]] = []
    for k in range(args.repeat):
        row = measure_control(args.services, args.seconds, args.warmup, 1, args.aggregators)
        rows.append(row)
        print(f"[{k + 1}/{args.repeat}]", json.dumps({key: row.get(key) for key in KEYS}))
    shares = [r["controller_cpu_share"] for r in rows]
    how = "2 aggregators" if args.aggregators else "direct heartbeats"
    head = (
        f"{args.services:,} services, {how}, {args.repeat} runs at {commit()}: controller CPU "
        f"min {min(shares):.4f}, median {statistics.median(shares):.4f}, max {max(shares):.4f}"
    )
    print(head)
    if args.out is not None:
        command = "python benchmarks/control_row.py " + " ".join(argv or sys.argv[1:])
        args.out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}))
        lines = [f"# One control row, repeated (`{command}`)", "", head, ""]
        lines += ["| run | " + " | ".join(KEYS) + " |", "|---" * (len(KEYS) + 1) + "|"]
        for k, row in enumerate(rows, 1):
            lines.append(f"| {k} | " + " | ".join(str(row.get(key)) for key in KEYS) + " |")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
