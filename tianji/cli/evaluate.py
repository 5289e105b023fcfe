"""The ``tianji eval`` command line."""

from __future__ import annotations

import json
from typing import Any

from tianji.run.evaluate import evaluate, summary_line

__all__ = ["add_eval_parser"]


def _cmd_eval(args: Any) -> int:
    result = evaluate(
        args.run_dir,
        episodes=args.episodes,
        checkpoint=args.checkpoint,
        video=args.video,
        seed=args.seed,
        device=args.device,
    )
    print(json.dumps(result) if args.json else summary_line(result))
    if result["video"] and not args.json:
        print(f"video of episode 1: {result['video']}")
    return 0


def add_eval_parser(sub: Any) -> None:
    """Add ``tianji eval`` to the CLI's subparsers."""
    p = sub.add_parser(
        "eval",
        help="run a saved policy greedily and print its mean ± std return",
        description="Load a run directory's config and newest checkpoint (or --checkpoint), "
        "play --episodes episodes with greedy actions and print the mean ± std return. "
        "A line per episode goes to stderr.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by tianji train")
    p.add_argument("--episodes", type=int, default=10, metavar="N", help="episodes (default 10)")
    p.add_argument(
        "--checkpoint", metavar="PATH", help="checkpoint file (default: the run's newest)"
    )
    p.add_argument(
        "--video",
        metavar="PATH",
        help="record the first episode to PATH (.mp4, .webm or .gif; needs tianji[video])",
    )
    p.add_argument(
        "--seed",
        type=int,
        metavar="S",
        help="episode i resets with seed S+i (default: the run's seed)",
    )
    p.add_argument("--device", default="auto", help="torch device (default auto)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_cmd_eval)
