"""The ``tianji controller`` and ``tianji serve`` command lines."""

from __future__ import annotations

import json
from typing import Any

from tianji.cli.train import add_run_options, config_from_args
from tianji.rl.config_ops import RESTART_PERIOD_S
from tianji.run.deploy import (
    apply_security_options,
    config_digest,
    listen_where,
    run_controller,
    serve,
    serve_spec,
)

__all__ = ["add_deploy_parsers"]


def _add_security_options(p: Any) -> None:
    p.add_argument("--token-file", metavar="PATH", help="the run's token (else TIANJI_TOKEN)")
    p.add_argument("--tls-cert", metavar="PEM", help="this host's certificate (mutual TLS)")
    p.add_argument("--tls-key", metavar="PEM", help="its private key")
    p.add_argument("--tls-ca", metavar="PEM", help="the run's CA certificate")


def add_deploy_parsers(sub: Any) -> None:
    """Add ``tianji controller`` and ``tianji serve`` to the CLI's subparsers."""
    p = sub.add_parser("controller", help="run the controller of a run deployed by hand")
    add_run_options(p, resume=True)
    p.add_argument("--bind", default="tcp://127.0.0.1:7000", help="tcp://HOST:PORT to listen on")
    p.add_argument("--advertise", metavar="HOST", help="the host services use to reach us")
    p.add_argument("--join-timeout", type=float, help="fail if not all joined by then (s)")
    p.add_argument("--rejoin-timeout", type=float, default=30.0, help="(s, default 30)")
    _add_security_options(p)
    p.set_defaults(func=_cmd_controller)
    _add_serve_parser(sub)


def _add_serve_parser(sub: Any) -> None:
    """``tianji serve ROLE``: one service of a run deployed by hand."""
    p = sub.add_parser("serve", help="run one service of a run deployed by hand")
    p.add_argument(
        "role",
        help="one of the run's roles: actor, buffer, learner, params, inference or eval (with "
        "[eval] workers); or relay (optional, one per host "
        "of actors: the params service sends each version once to the host's relay, which "
        "hands it to the host's actors through shared memory); or aggregator (optional, one "
        "per host: the host's services send it their heartbeats and it sends the controller "
        "one batch of them per --flush-interval)",
    )
    add_run_options(p, run=False)
    p.add_argument("--controller", required=True, help="the controller's tcp://HOST:PORT")
    p.add_argument("--index", type=int, default=0, help="which one of the role (default 0)")
    p.add_argument(
        "--bind",
        help="tcp://HOST:PORT to listen on (default: loopback with a controller on this host, "
        "else the address of the interface that routes to the controller)",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST",
        help="the host other services use to reach us (default: the --bind host)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        metavar="S",
        help="aggregator only: the longest a heartbeat waits before its batch goes to the "
        "controller (default 0.04; longer costs the controller less and delays what it sees)",
    )
    p.add_argument(
        "--local",
        choices=["auto", "shm", "tcp"],
        default="auto",
        help="between services of one host: shared memory where available (auto) or tcp",
    )
    p.add_argument(
        "--restart",
        type=int,
        default=0,
        metavar="N",
        help="start the service again when it dies, up to N times within any "
        "--restart-period seconds (default 0: its death is final); a learner needs "
        '[recovery] learner = "resume"',
    )
    p.add_argument(
        "--restart-period",
        type=float,
        metavar="S",
        help="seconds over which --restart counts restarts (default: the run's [recovery] "
        f"period_s, {RESTART_PERIOD_S:g}; inf: the whole run)",
    )
    _add_security_options(p)
    p.set_defaults(func=_cmd_serve)


def _cmd_controller(args: Any) -> int:
    apply_security_options(args)
    summary = run_controller(
        config_from_args(args),
        bind=args.bind,
        advertise=args.advertise,
        join_timeout=args.join_timeout,
        rejoin_timeout=args.rejoin_timeout,
        summary_path=args.summary,
        metrics_path=args.metrics,
        dashboard=args.dashboard,
        resume=args.resume,
    )
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_serve(args: Any) -> int:
    args.bind, args.advertise = listen_where(args.controller, args.bind, args.advertise)
    apply_security_options(args)
    config = config_from_args(args)
    spec = serve_spec(
        config,
        args.role,
        args.index,
        controller=args.controller,
        bind=args.bind,
        advertise=args.advertise,
        local=args.local,
        flush_interval=args.flush_interval,
    )
    return serve(
        spec,
        config_digest(config),
        restarts=args.restart,
        restart_period=args.restart_period,
        config=config,
    )
