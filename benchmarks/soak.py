"""Soak: one long training run, watched from outside for growth (not part of CI).

    python benchmarks/soak.py [--seconds 600] [--config examples/cartpole_ppo.toml]
                              [--every 10] [--out soak.json] [--set transport=shm ...]

Every ``--every`` seconds it records, for ``tianji train`` and each of its service
processes: resident memory (``/proc/PID/statm``) and open file descriptors
(``/proc/PID/fd``), plus tianji's entries in ``/dev/shm``. At the end it prints each
process's growth per minute, fitted (least squares) over the samples after the first
minute (start-up: imports, buffers filling), and writes every sample to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def _processes(root: int) -> dict[str, int]:
    """``tianji train`` (pid ``root``) and its service processes, by service name."""
    found = {"train": root}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        ours = "tianji.launch.worker" in words and "--parent" in words
        if ours and words[words.index("--parent") + 1] == str(root):
            found[words[words.index("--name") + 1]] = int(entry.name)
    return found


def _sample(pid: int) -> tuple[float, int] | None:
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return (rss, fds) if rss > 0 else None  # 0: exited, not reaped yet


def _shm_entries() -> int:
    try:
        return sum(1 for n in os.listdir("/dev/shm") if n.startswith("tianji-"))
    except OSError:
        return 0


def _slope_per_min(t: list[float], y: list[float]) -> float:
    if len(t) < 2:
        return 0.0
    return float(np.polyfit(np.asarray(t) / 60.0, np.asarray(y), 1)[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--config", default=str(ROOT / "examples" / "cartpole_ppo.toml"))
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--out", default="soak.json")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides"
    )
    args = parser.parse_args()
    runs = tempfile.mkdtemp(prefix="tianji-soak-")
    cmd = [sys.executable, "-m", "tianji", "train", args.config, "--no-dashboard"]
    cmd += ["--target-return", "1e12", "--max-seconds", str(args.seconds), "--run-dir", runs]
    cmd += ["--summary", str(Path(runs) / "summary.json")]
    cmd += [arg for kv in args.set for arg in ("--set", kv)]
    print("soak:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    try:
        while proc.poll() is None:
            time.sleep(args.every)
            t = time.monotonic() - started
            row: dict[str, Any] = {"t": round(t, 1), "shm": _shm_entries(), "procs": {}}
            for name, pid in sorted(_processes(proc.pid).items()):
                got = _sample(pid)
                if got is not None:
                    row["procs"][name] = {"rss_mb": round(got[0], 1), "fds": got[1]}
            rows.append(row)
            line = "  ".join(
                f"{n} {v['rss_mb']:.0f}MB/{v['fds']}fd" for n, v in row["procs"].items()
            )
            print(f"[{t:6.0f}s] shm {row['shm']}  {line}", flush=True)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
    proc.wait()
    Path(args.out).write_text(json.dumps({"command": cmd, "rows": rows}, indent=1))
    after = [r for r in rows if r["t"] >= 60]
    print(f"\ngrowth per minute after the first minute ({len(after)} samples):")
    names = sorted({n for r in after for n in r["procs"]})
    for name in names:
        pts = [(r["t"], r["procs"][name]) for r in after if name in r["procs"]]
        t = [p[0] for p in pts]
        rss = _slope_per_min(t, [p[1]["rss_mb"] for p in pts])
        fds = _slope_per_min(t, [p[1]["fds"] for p in pts])
        first, last = pts[0][1], pts[-1][1]
        print(
            f"  {name:10} rss {first['rss_mb']:7.1f} -> {last['rss_mb']:7.1f} MB "
            f"({rss:+.2f} MB/min)   fds {first['fds']} -> {last['fds']} ({fds:+.2f}/min)"
        )
    shm = [r["shm"] for r in rows]
    print(f"  /dev/shm tianji entries: min {min(shm, default=0)}, max {max(shm, default=0)}")
    print(f"  after the run: {_shm_entries()} entries; exit code {proc.returncode}")
    return proc.returncode or 0


if __name__ == "__main__":
    raise SystemExit(main())
