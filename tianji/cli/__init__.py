"""The ``tianji`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

from tianji import __version__
from tianji.runtime.errors import TianjiError

__all__ = ["main"]


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"tianji {__version__}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from tianji.launch.local import LocalLauncher, print_progress, run_local
    from tianji.run.demo import demo_specs

    specs = demo_specs(args.events, args.size)
    print(
        f"tianji demo: producer -> relay -> consumer as 3 processes over TCP, "
        f"{args.events} events of {args.size} float32 each"
    )
    launcher = LocalLauncher(
        specs,
        until=lambda c: "consumer-0" in c.reports,
        timeout=args.timeout,
        progress=print_progress(),
        progress_interval=1.0,
    )
    result = run_local(launcher)
    report = result.reports.get("consumer-0")
    if report is None:
        print(f"run ended ({result.reason}) before the consumer reported", file=sys.stderr)
        return 1
    print(
        f"done in {result.elapsed:.1f}s: consumer {report.status}, {report.summary}; "
        f"exit codes {result.exit_codes}"
    )
    return 0 if report.status == "ok" else 1


def _cmd_bench_transport(args: argparse.Namespace) -> int:
    from tianji.bench.transport import run_transport_bench

    report = run_transport_bench(args.seconds)  # progress goes to stderr
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "transport.json").write_text(json.dumps(report.to_json(), indent=2))
        (folder / "transport.md").write_text(report.to_table() + "\n")
    print(json.dumps(report.to_json()) if args.json else report.to_table())
    return 0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from exc
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tianji", description="tianji: a runtime for distributed reinforcement learning"
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from tianji.cli.deploy import add_deploy_parsers
    from tianji.cli.evaluate import add_eval_parser
    from tianji.cli.export import add_export_parser
    from tianji.cli.train import add_train_parser

    add_train_parser(sub)
    add_eval_parser(sub)
    add_export_parser(sub)
    add_deploy_parsers(sub)

    p = sub.add_parser("version", help="print the version")
    p.set_defaults(func=_cmd_version)

    p = sub.add_parser("demo", help="run the multi-process pub/sub demo with progress")
    p.add_argument("--events", type=int, default=20_000, help="events to send (default 20000)")
    p.add_argument("--size", type=int, default=4096, help="float32 values per event")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after SECONDS")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("bench", help="measure tianji on this machine")
    bench = p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    b = bench.add_parser(
        "transport",
        help="throughput of inproc, tcp and shm against the machine's ceilings, and latency",
        description="Messages/s and bytes/s of inproc, tcp and shm for 100 B to 16 MiB "
        "payloads, with raw-socket, memcpy and (if installed) pyzmq measured in the same run "
        "as ceilings; one-way wake-up latency on tcp and shm. Progress goes to stderr.",
    )
    b.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    b.add_argument("--out", metavar="DIR", help="also write transport.json and transport.md here")
    b.add_argument(
        "--seconds",
        type=_positive_seconds,
        default=1.0,
        metavar="S",
        help="seconds per (transport, payload) cell, after a short warm-up (default 1)",
    )
    b.set_defaults(func=_cmd_bench_transport)
    from tianji.bench import allreduce, chaos, lag, memory, scale_report, throughput_report
    from tianji.bench import train as bench_train

    bench_train.add_parser(bench)
    allreduce.add_parser(bench)
    throughput_report.add_parser(bench)
    scale_report.add_parser(bench)
    lag.add_parser(bench)
    memory.add_parser(bench)
    chaos.add_parser(bench)
    return parser


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    """Entry point of the ``tianji`` console script: run the command ``argv`` names (a
    tianji error is exit code 2 with its message, Ctrl-C 130). ``parser`` (default
    :func:`build_parser`'s) is for the scripts in ``benchmarks/`` that extend ``tianji
    bench``: theirs has ``--log-level`` and commands that set ``func``."""
    args = (parser or build_parser()).parse_args(argv)
    os.environ.setdefault("TIANJI_LOG_LEVEL", args.log_level)  # worker processes inherit it
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        code: int = args.func(args)
    except TianjiError as exc:
        print(f"tianji: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tianji: interrupted; all services stopped", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
