"""The ``tianji train`` command line: its parser and the run options it shares with
``tianji controller`` and ``tianji serve``."""

from __future__ import annotations

import json
import os
from typing import Any

from tianji.dashboard import add_dashboard_options
from tianji.rl.config import Mode, RunConfig
from tianji.run.rundir import RunDirectory
from tianji.run.train import train
from tianji.runtime.errors import ConfigError

__all__ = ["SHORTCUTS", "add_run_options", "add_train_parser", "config_from_args"]

SHORTCUTS = {
    "env": "env.id",
    "actors": "actors.count",
    "envs_per_actor": "actors.envs_per_actor",
    "transport": "transport",
    "seed": "seed",
    "max_env_steps": "stop.max_env_steps",
    "max_seconds": "stop.max_seconds",
    "target_return": "stop.target_return",
    "mode": "controller.mode",
    "learners": "learner.count",
    "ray_address": "ray.address",
    "run_dir": "run_dir",
}


def add_train_parser(sub: Any) -> None:
    """Add ``tianji train`` to the CLI's subparsers."""
    p = sub.add_parser("train", help="train an algorithm from a TOML run config")
    add_run_options(p, resume=True)
    p.add_argument(
        "--transport", choices=["inproc", "tcp", "shm"], help="inproc: all services in one process"
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="the run's secret token (default: TIANJI_TOKEN, else a fresh one per run)",
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: one process per service here (default); ray: one Ray actor per service",
    )
    p.add_argument(
        "--ray-address", metavar="ADDR", help="Ray cluster to join, e.g. HOST:6379 (ray.address)"
    )
    p.set_defaults(func=_cmd_train)


def add_run_options(p: Any, *, run: bool = True, resume: bool = False) -> None:
    """The config argument and ``--set`` (and with ``run``, the options of a whole run:
    shortcuts, stop conditions, ``--summary``, ``--metrics``, ``--run-dir``) shared by
    ``tianji train``, ``tianji controller`` and ``tianji serve``; with ``resume``,
    ``--resume RUN_DIR`` (and the config may be left out: the run directory's is used)."""
    if resume:
        p.add_argument(
            "config",
            nargs="?",
            help="run config (TOML), e.g. examples/cartpole_ppo.toml "
            "(with --resume: default RUN_DIR/config.json)",
        )
        p.add_argument(
            "--resume",
            metavar="RUN_DIR",
            help="continue this run directory's run from its newest checkpoint",
        )
    else:
        p.add_argument("config", help="run config (TOML), e.g. examples/cartpole_ppo.toml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set actors.count=4 (repeatable)",
    )
    p.add_argument("--env", help="env id (env.id)")
    p.add_argument("--actors", type=int, help="actor processes (actors.count)")
    p.add_argument("--envs-per-actor", type=int, help="envs per actor")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--mode",
        choices=[str(m) for m in Mode],
        help="controller.mode: relaxed (default), sync (baseline) or unbalanced (no limits)",
    )
    p.add_argument("--learners", type=int, help="data-parallel learners (learner.count)")
    if not run:
        return
    p.add_argument("--max-env-steps", type=int)
    p.add_argument("--max-seconds", type=float)
    p.add_argument(
        "--target-return",
        type=float,
        help="stop when the mean return of the last [stop] window episodes (20) reaches this",
    )
    _add_record_options(p)


def _add_record_options(p: Any) -> None:
    """Where a run's records go: ``--summary``, ``--metrics``, ``--run-dir``."""
    p.add_argument("--summary", metavar="PATH", help="also write the summary JSON here")
    p.add_argument(
        "--metrics", metavar="PATH", help="also write one JSON line of metrics every 2 s here"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir",
        metavar="PATH",
        help="put the run directory (config, metrics, TensorBoard, summary) under PATH "
        "(run_dir, default runs)",
    )
    where.add_argument(
        "--no-run-dir", action="store_true", help='write no run directory (run_dir = "")'
    )
    add_dashboard_options(p)


def config_from_args(args: Any) -> RunConfig:
    """The run config from ``add_run_options`` arguments (shortcuts become ``--set``)."""
    from tianji.run.config import load_config

    overrides = list(args.set)
    for attr, key in SHORTCUTS.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if getattr(args, "no_run_dir", False):
        overrides.append('run_dir=""')
    path = args.config
    resume = getattr(args, "resume", None)
    if path is None:
        if resume is None:
            raise ConfigError("config", None, "a run config (TOML), or --resume RUN_DIR")
        path = str(RunDirectory.existing(resume).config)
    return load_config(path, overrides)


def _cmd_train(args: Any) -> int:
    config = config_from_args(args)
    if args.token_file:
        from tianji.transports._auth import load_token

        os.environ["TIANJI_TOKEN"] = load_token(args.token_file)
    print(
        f"tianji train: {config.algorithm} on {config.env.id}, {config.actors.count} actors x "
        f"{config.actors.envs_per_actor} envs, {config.learner.count} learner(s), "
        f"transport {config.transport}, seed {config.seed}, "
        f"controller {config.controller.mode}, backend {args.backend}",
        flush=True,
    )
    summary = train(
        config,
        summary_path=args.summary,
        metrics_path=args.metrics,
        backend=args.backend,
        dashboard=args.dashboard,
        resume=args.resume,
    )
    print(json.dumps(summary, indent=2))
    return 0
