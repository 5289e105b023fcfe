"""``tianji controller`` and ``tianji serve``: one run's services started by hand on hosts.

On one host::

    export TIANJI_TOKEN=...            # the same secret on every host (or --token-file)
    tianji controller examples/cartpole_dqn.toml --bind tcp://0.0.0.0:7000 --advertise 10.0.0.1

and for every service of the run (``learner-0``, ``buffer-0``, ``params-0``, ``actor-I``),
on any host::

    tianji serve actor examples/cartpole_dqn.toml --controller tcp://10.0.0.1:7000 --index 1

Each service listens on the local address of the interface that routes to the controller
and advertises it (``--bind``/``--advertise`` override that, e.g. ``--bind tcp://0.0.0.0:0
--advertise 10.0.0.3`` behind NAT; a loopback ``--bind`` with a controller or an advertised
address elsewhere is refused, since nobody could connect). A service whose handshake the
controller refuses (another token, TLS that does not match) stops after
:data:`~tianji.runtime.heartbeats.HANDSHAKE_REFUSALS` attempts and ``tianji serve`` exits 2.

Every service registers its TCP address and, where the shared-memory transport exists, a
second shared-memory listener; the controller hands each subscriber the shared-memory
address of publishers on its own host (same host and network namespace) and the TCP
address of the others. The controller refuses a service whose config differs from its
own (a digest of the run config, stop conditions, run directory and the host-local
settings of :data:`HOST_LOCAL` aside: devices, torch threads and Ray placement may differ
from host to host).

``tianji serve ... --restart N`` keeps the service alive on its host: it runs in a child
process that is started again when it dies, up to N times within any ``--restart-period``
seconds (default: the run's ``[recovery] period_s``; :mod:`tianji.launch.supervisor`);
the controller counts each new process as a restart of the service, with the same
accounting as a restart by the local launcher. A restarted learner (``[recovery] learner =
"resume"``, one learner) gets the run's newest checkpoint from the controller's monitor.
A host cut off by the network keeps its processes: its services reconnect when the link
is back, and the controller waits ``--rejoin-timeout`` seconds for them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

from tianji import transports
from tianji.dashboard import launch_plan
from tianji.launch.hosts import HostLauncher
from tianji.launch.spec import ServiceSpec, build_service
from tianji.launch.supervisor import supervise
from tianji.rl.config import RunConfig, to_dict
from tianji.rl.config_ops import RecoveryConfig
from tianji.run.plan import RunPlan
from tianji.run.recovery import restart_policy
from tianji.runtime.controller import AGGREGATOR_ROLE, REFUSED, RELAY_ROLE
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.loop import dump_tasks, run
from tianji.runtime.service import Service

__all__ = [
    "HOST_LOCAL",
    "config_digest",
    "listen_where",
    "route_source",
    "run_controller",
    "serve",
    "serve_spec",
]

log = logging.getLogger(__name__)


HOST_LOCAL: Final = (
    "actors.torch_threads",
    "learner.device",
    "learner.rendezvous_port",
    "learner.torch_threads",
    "inference.device",
    "inference.torch_threads",
    "ray",
)
"""Settings that do not change the math of a run (where it computes, with how many threads,
how Ray places it): each host of a hand deployment may set its own (``tianji serve ...
--set learner.device=cuda:1``); they are outside :func:`config_digest`."""


def config_digest(config: RunConfig) -> str:
    """What must be equal between the controller's and every service's config: all of it
    but the stop conditions and the run directory (the controller's business) and the
    host-local settings (:data:`HOST_LOCAL`)."""
    data = to_dict(config)
    data.pop("stop", None)  # only the controller decides when to stop
    data.pop("run_dir", None)  # and writes the run directory
    for key in HOST_LOCAL:
        section, _, field = key.partition(".")
        if not field:
            data.pop(section, None)
        elif isinstance(data.get(section), dict):
            data[section].pop(field, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _host_of(address: str, option: str = "--bind") -> str:
    from tianji.transports.tcp import parse_tcp_address

    try:
        return parse_tcp_address(address)[0]
    except ValueError:
        raise ConfigError(option, address, "a tcp://HOST:PORT address") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError as exc:  # a host name other than localhost
        log.debug("%s: %s", host, exc)
        return False


def route_source(host: str) -> str:
    """The local address this host uses to reach ``host`` (the interface its route leaves
    by; no packet is sent).

    Raises:
        ConfigError: naming ``host`` when it does not resolve or no route leads there.
    """
    import socket

    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise ConfigError(
            "--controller", host, f"a host this machine can reach ({exc.strerror or exc})"
        ) from None


def listen_where(
    controller: str, bind: str | None, advertise: str | None
) -> tuple[str, str | None]:
    """``tianji serve``'s listening address and the host it advertises.

    Without ``--bind``: loopback when the controller is on this host, else the local
    address of the interface that routes to the controller (port 0), advertised as itself;
    ``--bind`` on every interface without ``--advertise`` advertises that address too.
    A pair that cannot work is refused: a loopback listener advertised under another
    address, or one whose controller (and so its peers) is on another host.

    Raises:
        ConfigError: naming both addresses of a pair that cannot work.
    """
    ctl_host = _host_of(controller, "--controller")
    if bind is None:
        if _is_loopback(ctl_host):
            return "tcp://127.0.0.1:0", advertise
        if advertise is not None:
            return "tcp://0.0.0.0:0", advertise
        local = route_source(ctl_host)
        return f"tcp://{'[' + local + ']' if ':' in local else local}:0", local
    host = _host_of(bind)
    if host in ("0.0.0.0", "::") and advertise is None and not _is_loopback(ctl_host):
        return bind, route_source(ctl_host)  # every interface: advertise the routed one
    if _is_loopback(host):
        if advertise is not None and not _is_loopback(advertise):
            raise ConfigError(
                "--bind",
                bind,
                f"a listener peers can reach at the advertised {advertise}: a loopback "
                "listener accepts connections from this host only (leave --bind out, or "
                f"--bind tcp://0.0.0.0:0 --advertise {advertise})",
            )
        if not _is_loopback(ctl_host):
            raise ConfigError(
                "--bind",
                bind,
                f"a listener reachable from the controller's host ({controller}): a "
                "loopback listener accepts connections from this host only (leave --bind "
                "out to listen on the interface that routes to the controller)",
            )
    return bind, advertise


def apply_security_options(args: Any) -> None:
    """Token and TLS files from the command line into the environment the transports
    read (``TIANJI_TOKEN``, ``TIANJI_TLS_*``), checked now.

    Raises:
        ConfigError: for an unreadable token file, a partial TLS setting or a missing file.
    """
    from tianji.transports._tls import ENV, tls_from_env

    for key, var in ENV.items():
        value = getattr(args, f"tls_{key}", None)
        if value:
            os.environ[var] = value
    tls_from_env()
    require_token(args.bind, args.token_file)


def require_token(bind: str, token_file: str | None) -> None:
    """Load ``--token-file`` into ``TIANJI_TOKEN``; refuse to listen beyond loopback
    without a token.

    Raises:
        ConfigError: naming the bind address when no token is set for it.
    """
    if token_file:
        from tianji.transports._auth import load_token

        os.environ["TIANJI_TOKEN"] = load_token(token_file)
    if not os.environ.get("TIANJI_TOKEN") and not _is_loopback(_host_of(bind)):
        raise ConfigError(
            "--bind",
            bind,
            "a run token for a listener beyond this host: set TIANJI_TOKEN "
            "or pass --token-file (the same secret on every host)",
        )


def run_controller(
    config: RunConfig,
    *,
    bind: str,
    advertise: str | None = None,
    join_timeout: float | None = None,
    rejoin_timeout: float = 30.0,
    summary_path: str | None = None,
    metrics_path: str | None = None,
    out: TextIO = sys.stdout,
    dashboard: str | None = None,
    resume: str | None = None,
) -> dict[str, Any]:
    """Run the controller and monitor of a run whose services join from anywhere
    (and the live dashboard at ``dashboard``, ``HOST:PORT``, when given). With ``resume``
    (a run directory) the run continues from its newest checkpoint: every service is told
    so when it registers, and the learners wait for the checkpoint's state, which the
    monitor sends them (replay buffers start empty).

    Raises:
        ConfigError: for a bad config or bind address, before anything listens.
        CheckpointError: when ``resume`` holds no usable checkpoint.
        ServiceFailed: when a service never joined, or left and did not come back.
    """
    host = _host_of(bind)
    plan = RunPlan.build(config, out, metrics_path, resume)
    plan.dashboard = dashboard
    monitor_bind = f"tcp://{'[' + host + ']' if ':' in host else host}:0"
    launcher = HostLauncher(
        [s.name for s in plan.specs],
        join_timeout=join_timeout,
        rejoin_timeout=rejoin_timeout,
        on_joined=lambda: plan.monitor.restart_clock() if plan.monitor else None,
        until=plan.until,
        timeout=None,
        controller_bind=bind,
        local_services=plan.local_services(monitor_bind, advertise or ""),
        progress=plan.progress,
        progress_interval=2.0,
        before_stop=plan.before_stop,
        plugins=plan.controller_plugins(),
    )
    launcher.controller.advertise = advertise
    launcher.controller.run_digest = config_digest(config)
    launcher.controller.reincarnated = _resume_reincarnated(plan, launcher, out)
    launcher.controller.resuming = plan.resume is not None
    print(
        f"tianji controller: run of {config.algorithm} on {config.env.id}; waiting for "
        f"{', '.join(s.name for s in plan.specs)}; controller bind {bind}"
        + (f", advertised as {advertise}" if advertise else "")
        + (f"; resuming {resume}" if resume else ""),
        file=out,
        flush=True,
    )
    with plan.recording():
        started = time.monotonic()
        reason = launch_plan(plan, launcher).reason
        return plan.finish(launcher.controller, reason, time.monotonic() - started, summary_path)


def _resume_reincarnated(
    plan: RunPlan, launcher: HostLauncher, out: TextIO
) -> Callable[[str, str, int], None]:
    """What the controller does when a service restarted on its host registers again: a
    learner's new process gets the newest checkpoint (the run fails naming it if there is
    none); every other role needs nothing from here."""
    policy = restart_policy(plan, launcher.controller, out)
    specs = {s.name: s for s in plan.specs}

    def reincarnated(name: str, role: str, k: int) -> None:
        if role != "learner" or policy.prepare is None or name not in specs:
            return
        if plan.config.recovery.learner != "resume":
            launcher.fail(
                f"failed {name} was restarted on its host, but [recovery] learner = "
                '"stop" (a new learner cannot continue the run)'
            )
        elif policy.prepare(specs[name], k) is None:
            launcher.fail(f"failed {name} was restarted on its host and cannot resume")

    return reincarnated


PER_HOST = {
    RELAY_ROLE: "tianji.services.params:ParamsRelay",
    AGGREGATOR_ROLE: "tianji.runtime.aggregator:HeartbeatAggregator",
}
"""The optional services of one host (``tianji serve relay|aggregator``) and their factories."""


def _flush_options(role: str, flush_interval: float | None) -> dict[str, float]:
    if flush_interval is None:
        return {}
    if role != AGGREGATOR_ROLE:
        raise ConfigError("--flush-interval", flush_interval, f"only with {AGGREGATOR_ROLE!r}")
    if not 0 < flush_interval < float("inf"):
        raise ConfigError("--flush-interval", flush_interval, "a number of seconds > 0")
    return {"flush_interval": flush_interval}


def serve_spec(
    config: RunConfig,
    role: str,
    index: int,
    *,
    controller: str,
    bind: str,
    advertise: str | None = None,
    local: str = "auto",
    flush_interval: float | None = None,
) -> Any:
    """The :class:`~tianji.launch.spec.ServiceSpec` of service ``ROLE-INDEX`` of the run
    (an aggregator's ``flush_interval``: ``--flush-interval``).

    Raises:
        ConfigError: naming the role or index when the config has no such service, or a
            flush interval that is not a positive number or not an aggregator's.
    """
    specs = RunPlan.build(config).specs
    options = _flush_options(role, flush_interval)
    if role in PER_HOST:  # optional, one per host: not one of the run's services
        extra = ServiceSpec(
            name=f"{role}-{index}", role=role, factory=PER_HOST[role], bind=bind, options=options
        )
        specs = [*specs, extra]
    roles = sorted({s.role for s in specs})
    if role not in roles:
        raise ConfigError("ROLE", role, f"one of the run's roles {roles} or {sorted(PER_HOST)}")
    same = [s for s in specs if s.role == role]
    name = f"{role}-{index}"
    found = [s for s in same if s.name == name]
    if not found:
        raise ConfigError("--index", index, f"0..{len(same) - 1} (the run has {len(same)} {role})")
    transports.split_address(controller)
    if _host_of(bind) in ("0.0.0.0", "::") and not advertise:
        raise ConfigError(
            "--bind", bind, "--advertise HOST with it: peers cannot connect to 0.0.0.0"
        )
    local_bind = ""
    if local == "shm" or (local == "auto" and "shm" in transports.names() and _has_shm()):
        local_bind = "shm://"
    return dataclasses.replace(
        found[0],
        bind=bind,
        controller=controller,
        advertise=advertise or "",
        local_bind=local_bind,
    )


def _has_shm() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir("/dev/shm")


async def _serve(service: Service) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop, f"signal {signal.Signals(sig).name}")
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks, service.name)
    await service.run()


def serve(
    spec: Any,
    digest: str,
    out: TextIO = sys.stdout,
    *,
    restarts: int = 0,
    restart_period: float | None = None,
    config: RunConfig | None = None,
) -> int:
    """Run one service of a run until the controller ends it; the process exit code.

    With ``restarts`` > 0 the service runs in a child process that is started again when
    it dies, up to ``restarts`` times within any ``restart_period`` seconds (default: the
    config's ``[recovery] period_s``; :mod:`tianji.launch.supervisor`); a learner then
    needs ``config`` with
    ``[recovery] learner = "resume"`` (each new one waits for the run's newest checkpoint,
    which the controller's monitor sends it).

    Raises:
        ConfigError: for ``restarts`` < 0, a ``restart_period`` not > 0, or a learner whose
            run cannot resume it.
    """
    if restarts < 0:
        raise ConfigError("--restart", restarts, "an int >= 0")
    recovery = config.recovery if config is not None else RecoveryConfig()
    period = recovery.period_s if restart_period is None else restart_period
    if not period > 0:  # also refuses NaN
        raise ConfigError("--restart-period", period, "seconds > 0 (inf: the whole run)")
    if restarts:
        prepare = _restart_prepare(spec, restarts, config)
        print(
            f"tianji serve: {spec.name} joining the run at {spec.controller} "
            f"(restarted up to {restarts} times within {period:g} s)",
            file=out,
            flush=True,
        )
        return run(
            supervise(
                spec,
                digest,
                restarts,
                period=period,
                out=out,
                backoff=recovery.backoff,
                prepare=prepare,
            )
        )
    service = build_service(spec)
    service.run_digest = digest
    print(f"tianji serve: {spec.name} joining the run at {spec.controller}", file=out, flush=True)
    try:
        run(_serve(service))
    except ServiceFailed as exc:
        print(f"tianji serve: {spec.name} failed: {exc}", file=sys.stderr, flush=True)
        return 1
    if service.stop_reason.startswith(REFUSED):
        print(f"tianji serve: {spec.name} {service.stop_reason}", file=sys.stderr, flush=True)
        return 2
    print(f"tianji serve: {spec.name} stopped: {service.stop_reason}", file=out, flush=True)
    return 0


def _restart_prepare(
    spec: ServiceSpec, restarts: int, config: RunConfig | None
) -> Callable[[ServiceSpec, int], ServiceSpec] | None:
    """How restart ``k`` of ``spec`` is started: a learner waits for its checkpoint.

    Raises:
        ConfigError: for a learner whose run cannot resume it.
    """
    if spec.role != "learner":
        return None
    if config is None or config.recovery.learner != "resume":
        raise ConfigError(
            "--restart",
            restarts,
            '0 for a learner unless [recovery] learner = "resume" (a new learner resumes from '
            "the run's newest checkpoint; without it a dead learner ends the run)",
        )
    if config.learner.count > 1:
        raise ConfigError(
            "--restart",
            restarts,
            f"0 for a learner with learner.count = {config.learner.count}: data-parallel "
            "learners restart together, which one launcher does for all of them "
            "(tianji train, local or Ray), not one supervisor per host",
        )
    return lambda s, k: dataclasses.replace(s, options={**s.options, "restore": True})
