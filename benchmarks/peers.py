"""tianji beside its peers, from a checkout: ``tianji bench train`` and ``tianji bench
throughput`` with Stable-Baselines3 and Sample Factory runs added (their runners,
``sb3.py`` and ``sf_runner.py`` here, are not in the tianji package)::

    python benchmarks/peers.py train [tianji bench train's options]
    python benchmarks/peers.py throughput --peer-python /work/sfvenv/bin/python [...]

``train`` runs SB3 (``pip install "tianji[bench]"``) as the system ``sb3`` beside tianji's
(``--systems`` defaults to all four); ``throughput`` runs Sample Factory under the
interpreter of its own venv (``sf_runner.py`` says how to make it). Everything else --
the cells, the report, the JSON and markdown files -- is tianji's bench code, unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from tianji.bench import throughput_report
from tianji.bench import train as bench_train
from tianji.bench.throughput import ENVS_PER_WORKER, WORKERS, Cell, PeerCommand
from tianji.bench.throughput_work import EQUAL, sf_flags
from tianji.cli import main

HERE = Path(__file__).resolve().parent


def sb3_command(algo: str, seed: int, target: float, max_seconds: float) -> list[str]:
    """One Stable-Baselines3 run (``sb3.py``) of ``tianji bench train``'s plan."""
    return [
        *(sys.executable, str(HERE / "sb3.py"), algo, "--seed", str(seed)),
        *("--target-return", str(target), "--max-seconds", str(max_seconds)),
    ]


def sample_factory(python: str) -> PeerCommand:
    """The command of one Sample Factory cell under ``python`` (``sf_runner.py``)."""

    def command(cell: Cell, seconds: float, warmup: float, train_dir: str) -> list[str]:
        cmd = [python, str(HERE / "sf_runner.py"), "--env", cell.env, "--workers", str(WORKERS)]
        cmd += ["--envs-per-worker", str(ENVS_PER_WORKER), "--seconds", str(seconds)]
        cmd += ["--warmup", str(warmup), "--train-dir", train_dir]
        if cell.work == "equal":
            cmd.append("--sf-args=" + " ".join(sf_flags(EQUAL[cell.env])))
        return cmd

    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/peers.py", description=__doc__)
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    installed = importlib.util.find_spec("stable_baselines3") is not None
    sb3 = bench_train.Peer(
        sb3_command,
        None if installed else 'stable-baselines3 is not installed (pip install "tianji[bench]")',
    )
    bench_train.add_parser(
        sub,
        peers={"sb3": sb3},
        command=lambda: "python benchmarks/peers.py " + " ".join(sys.argv[1:]),
    )
    throughput_report.add_parser(sub, peer=sample_factory)
    return parser


if __name__ == "__main__":
    sys.exit(main(parser=build_parser()))
