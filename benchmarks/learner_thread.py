"""Where a short update runs: a learner's updates on its loop's thread against a worker
thread, the same example run twice, one after the other (``[learner] inline_below_ms``).

    python benchmarks/learner_thread.py halfcheetah_sac --seconds 90 --out docs/results

Each run is ``tianji train examples/<example>.toml --max-seconds S``; the figure is the
learner's mean milliseconds per update (its ``update_s`` gauge over its updates, from the
last metrics row) and its updates per second. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = {"inline": "100.0", "worker thread": "0"}


def one(example: str, seconds: float, inline_below_ms: str, work: Path) -> dict[str, Any]:
    summary = work / "summary.json"
    command = [
        sys.executable, "-m", "tianji.cli", "train", str(ROOT / "examples" / f"{example}.toml"),
        "--max-seconds", str(seconds), "--no-dashboard", "--summary", str(summary),
        "--set", f"learner.inline_below_ms={inline_below_ms}",
    ]  # fmt: skip
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=seconds + 300)
    s = json.loads(summary.read_text())
    last = json.loads((Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()[-1])
    updates, spent = last["learner_updates"], last["learner"]["update_s"]
    return {
        "command": " ".join(command[1:]),
        "learner_updates": updates,
        "update_ms": round(1000 * spent / updates, 2),
        "learner_updates_per_s_running": s["learner_updates_per_s_running"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/learner_thread.py", description=__doc__)
    p.add_argument("example")
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    runs = {}
    for mode, value in MODES.items():
        with tempfile.TemporaryDirectory() as tmp:
            runs[mode] = one(args.example, args.seconds, value, Path(tmp))
        print(mode, json.dumps(runs[mode]), flush=True)
    ratio = runs["worker thread"]["update_ms"] / runs["inline"]["update_ms"]
    title = f"learner updates inline vs in a worker thread, {args.seconds:.0f} s each"
    lines = [
        f"# {args.example}: {title}",
        "", "| updates run | ms per update | updates per s |", "|---|---|---|",
        *(f"| {m} | {r['update_ms']} | {r['learner_updates_per_s_running']} |"
          for m, r in runs.items()),
        "", f"worker thread / inline, ms per update: {ratio:.2f}x",
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        report = {"example": args.example, "seconds": args.seconds, "runs": runs,
                  "thread_over_inline": round(ratio, 3), "unix": time.time()}  # fmt: skip
        (args.out / f"learner-thread-{args.example}.json").write_text(json.dumps(report, indent=2))
        (args.out / f"learner-thread-{args.example}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
