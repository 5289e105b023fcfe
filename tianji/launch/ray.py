"""Run a graph of services as Ray actors (``tianji train CONFIG --backend ray``).

Each :class:`ServiceSpec` becomes one Ray actor (:class:`ServiceActor`) reserving the CPUs
and GPUs of its role (:class:`~tianji.rl.config_ops.RayConfig`); Ray only places and starts the
services. The controller and the ``local_services`` (the training monitor) stay in this
process, and every byte of data still moves over tianji's own TCP links, never through
Ray's object store. The spec travels to the actor as a JSON dict.

Ray is optional (``pip install "tianji[ray]"``) and imported only here, only when used.

Placement and addresses:

- With a local Ray instance (none running: one is started for the run and shut down
  after it) or a cluster whose nodes are all this host, everything binds ``127.0.0.1``.
- With a cluster spanning hosts, the controller binds this host's node IP and each
  service binds ``0.0.0.0`` and advertises its node's IP, so the addresses they register
  are reachable from every node. Services need ``tcp://`` (shm reaches one host, inproc
  one process).

Once every actor runs, the launcher prints (and the summary keeps, ``placement``) the node
each service runs on; on a cluster of several nodes it then starts one params relay on
each node of actors that lacks the params service (:mod:`tianji.launch.ray_nodes`,
``ray.relays``), and, in a run of ``ray.aggregate_from`` services or more, one heartbeat
aggregator on each node that hosts any. ``ray.custom_resources`` pins roles to the nodes
that offer them.

A dead actor (``ray.kill``, a crashed or killed worker process, a lost node) is a dead
service, exactly as a dead child process is locally: within the run's restart limit
(:class:`~tianji.launch.restarts.RestartPolicy`, ``[recovery]``: N restarts within any T
seconds) tianji starts a new actor for
it, named ``tianji-<run>-<service>-r<k>`` for its k-th restart, with the same accounting
(``restarts``, ``dropped/lost_in_restart``) and the same preparation (a learner resumes from
the newest checkpoint, a buffer from its replay snapshot); beyond the limit it ends the run:
the others are stopped and :class:`~tianji.runtime.errors.ServiceFailed` names it. Ray's own
actor restarts stay off (``max_restarts=0``): a Ray-restarted actor would rerun the service
without the launcher's preparation or counts. Every actor of the run is killed when the run
ends; Ray is shut down only if this launcher started it.

Usage::

    launcher = RayLauncher(specs, until=lambda c: "consumer-0" in c.reports, timeout=120)
    result = run_launcher(launcher)
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tianji.launch.base import Handle, Launcher, LaunchPlan
from tianji.launch.ray_nodes import Node, aggregator_specs, relay_specs
from tianji.launch.spec import ServiceSpec, build_service
from tianji.rl.config_ops import RayConfig
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.loop import run
from tianji.runtime.service import Service
from tianji.transports.tcp import parse_tcp_address

__all__ = ["RayLauncher", "ServiceActor", "import_ray", "role_of"]

log = logging.getLogger("tianji.launch.ray")
_PASSED_ENV = ("TIANJI_TOKEN", "TIANJI_LOG_LEVEL", "TIANJI_LOOP")
"""Environment variables the actors get from this process (the run token above all)."""


def import_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        ConfigError: naming the extra to install when Ray is missing.
    """
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "backend", "ray", f'Ray installed: pip install "tianji[ray]" ({exc})'
        ) from None
    if not hasattr(ray, "is_initialized"):  # e.g. a directory named ray in the working dir
        where = ", ".join(getattr(ray, "__path__", [])) or str(getattr(ray, "__file__", "?"))
        raise ConfigError(
            "backend",
            "ray",
            f'Ray installed (pip install "tianji[ray]"): the "ray" imported is {where}, '
            "not Ray (a directory named ray in the working directory?)",
        )
    return ray


def role_of(spec: ServiceSpec) -> str:
    """The role a service's resources are looked up by (:attr:`ServiceSpec.role`)."""
    return spec.role


def _with_host(address: str, host: str) -> str:
    """``tcp://HOST:PORT`` with another host; refuses anything but TCP.

    Raises:
        ConfigError: if ``address`` is not a ``tcp://`` address.
    """
    scheme, sep, rest = address.partition("://")
    if scheme != "tcp" or not sep or ":" not in rest:
        raise ConfigError(
            "bind", address, "a tcp://HOST:PORT address (shm reaches one host, inproc one process)"
        )
    return f"tcp://{host}:{rest.rsplit(':', 1)[1]}"


class ServiceActor:
    """The Ray actor that runs one service.

    It is threaded (created with ``max_concurrency=2``): :meth:`run` holds one thread for
    the whole run, so :meth:`stop` is served by the other while it runs. It must have no
    ``async def`` method: Ray would make it an async actor, whose methods all share one
    event loop thread that :meth:`run` would block.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._service: Service | None = None
        self._stop_reason: str | None = None

    def where(self) -> tuple[int, str, str]:
        """This actor's process id, node id and node IP (answering also proves it was
        placed and started)."""
        ray = import_ray()
        return os.getpid(), ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def run(self, spec_json: dict[str, Any]) -> int:
        """Build the service from its JSON spec and run it; 0 on a clean stop, 1 on failure."""
        spec = ServiceSpec.from_json(spec_json)
        logging.basicConfig(
            level=os.environ.get("TIANJI_LOG_LEVEL", "WARNING"),
            format=f"%(asctime)s {spec.name} %(levelname)s %(name)s: %(message)s",
        )
        try:
            run(_serve(self, build_service(_advertise_node(spec))))
        except Exception:
            log.exception("service %s failed", spec.name)
            return 1
        return 0

    def attach(self, loop: asyncio.AbstractEventLoop, service: Service) -> str | None:
        """Record where :meth:`stop` must reach the service; return a stop reason that came
        before (or ``None``)."""
        with self._lock:
            self._loop, self._service = loop, service
            return self._stop_reason

    def stop(self, reason: str) -> None:
        """Ask the service to drain and stop (thread-safe; idempotent)."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason
            loop, service = self._loop, self._service
        if loop is not None and service is not None:
            try:
                loop.call_soon_threadsafe(service.stop, reason)
            except RuntimeError as exc:  # the loop is closed: it has stopped
                log.debug("stop (%s): %r", reason, exc)


async def _serve(actor: ServiceActor, service: Service) -> None:
    early = actor.attach(asyncio.get_running_loop(), service)
    if early is not None:
        service.stop(early)
    await service.run()


def _advertise_node(spec: ServiceSpec) -> ServiceSpec:
    """A spec binding ``0.0.0.0`` advertises this node's IP, so the address the service
    registers is the one other nodes reach it at."""
    if not spec.bind.startswith("tcp://0.0.0.0:") or spec.advertise:
        return spec
    return dataclasses.replace(spec, advertise=import_ray().util.get_node_ip_address())


class _RayActor:
    """The launcher's handle on one service actor (see :class:`~tianji.launch.base.Handle`)."""

    def __init__(
        self, spec: ServiceSpec, actor: Any, ray: ModuleType, placement_timeout: float
    ) -> None:
        self.spec = spec
        self.actor = actor
        self.exit_note = ""
        self.pid: int | None = None
        self.node: Node | None = None  # once it answered where it runs
        self._ray = ray
        self.placed = asyncio.ensure_future(self._where())
        ref = actor.run.remote(spec.to_json())
        self._task = asyncio.create_task(self._result(ref, placement_timeout))

    async def _where(self) -> None:
        """Learn where the actor runs (a dead one never answers: that is reported by
        :meth:`wait`)."""
        try:
            pid, node_id, ip = await asyncio.wrap_future(self.actor.where.remote().future())
        except self._ray.exceptions.RayError as exc:
            log.debug("%s: not placed: %s", self.spec.name, _first_line(exc))
            return
        self.pid, self.node = int(pid), Node(str(node_id), str(ip))

    async def _result(self, ref: Any, placement_timeout: float) -> int:
        """The service's exit code; an actor that Ray could not place in time (a restart
        after its node was lost, with no other node that has what it reserves) is killed
        and counts as dead (``-1``), so the restart limit ends what cannot run."""
        run = asyncio.ensure_future(asyncio.wrap_future(ref.future()))
        done, _ = await asyncio.wait(
            {run, self.placed}, timeout=placement_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            self.exit_note = f"not placed by Ray within {placement_timeout:g}s"
            self.kill()
            run.cancel()
            return -1
        try:
            return int(await run)
        except self._ray.exceptions.RayActorError as exc:
            self.exit_note = "Ray actor died: " + _first_line(exc)
            return -9
        except self._ray.exceptions.RayError as exc:
            self.exit_note = "Ray task failed: " + _first_line(exc)
            return 1

    @property
    def returncode(self) -> int | None:
        return self._task.result() if self._task.done() else None

    async def wait(self) -> int | None:
        return await asyncio.shield(self._task)

    def signal(self, sig: signal.Signals) -> None:
        if sig is signal.SIGKILL:
            self.kill()
        else:
            self.actor.stop.remote(f"signal {sig.name}")

    def kill(self) -> None:
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception as exc:  # already gone, or Ray is shutting down
            log.debug("%s: ray.kill: %r", self.spec.name, exc)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A ``HOST:PORT`` Ray address must accept a TCP connection: Ray itself would retry an
    unreachable one for many minutes before it gives up (``auto`` and ``ray://`` addresses
    are left to Ray).

    Raises:
        ConfigError: naming the address, when nothing answers there within ``timeout``.
    """
    if "://" in address or ":" not in address:  # "auto", "ray://...": left to Ray
        return
    try:
        host, port = parse_tcp_address(f"tcp://{address}")
    except ValueError as exc:
        raise ConfigError("ray.address", address, f"HOST:PORT ({exc})") from None
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = f"a Ray cluster reachable here (nothing answers at {address}: {exc})"
        raise ConfigError("ray.address", address, why) from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


class RayLauncher(Launcher):
    """See the module docstring; the watch and stop logic is :class:`Launcher`'s.

    Args:
        plan: the services to start (one Ray actor each; their binds must be ``tcp://``)
            and how: a :class:`~tianji.launch.base.LaunchPlan`, or the specs and its
            fields as keyword arguments.
        address: the Ray cluster to join; ``None``: the Ray already initialized in this
            process, else ``RAY_ADDRESS``, else a local Ray started for the run.
        resources: CPUs and GPUs per role (:func:`role_of`); defaults to ``RayConfig()``.
        placement_timeout: seconds every actor gets to be placed and started.

    Raises:
        ConfigError: if Ray is not installed, or a spec does not bind ``tcp://``.
    """

    def __init__(
        self,
        plan: LaunchPlan | Sequence[ServiceSpec],
        *,
        address: str | None = None,
        resources: RayConfig | None = None,
        placement_timeout: float = 120.0,
        **fields: Any,
    ) -> None:
        self._ray = import_ray()
        specs = plan.specs if isinstance(plan, LaunchPlan) else plan
        for spec in specs:
            if not spec.bind.startswith("tcp://"):
                raise ConfigError(
                    f"{spec.name}.bind",
                    spec.bind,
                    "a tcp:// address (Ray runs each service in its own process, maybe on "
                    "another host: shm and inproc cannot reach it)",
                )
        super().__init__(plan, **fields)
        self.address = address
        self.resources = resources or RayConfig()
        self.placement_timeout = placement_timeout
        self.multi_host = False
        self._started_ray = False
        self._actor_class: Any = None
        self._pinned: dict[str, str] = {}  # relay -> the node id it belongs on

    @property
    def placement(self) -> dict[str, str]:
        """The node IP each service runs on (those that answered where they run)."""
        return {
            name: h.node.ip
            for name, h in sorted(self.children.items())
            if isinstance(h, _RayActor) and h.node is not None
        }

    async def _open(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS") or None
            if address is not None:
                _check_reachable(address)
            try:
                ray.init(address=address or "local", include_dashboard=False)
            except (ConnectionError, ValueError) as exc:
                raise ConfigError(
                    "ray.address", address, f"a Ray cluster reachable here ({_first_line(exc)})"
                ) from None
            self._started_ray = address is None
        elif self.address:
            log.warning("Ray is already initialized here; ray address %s not used", self.address)
        node_ip = ray.util.get_node_ip_address()
        hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        self.multi_host = hosts != {node_ip}
        if self.multi_host:  # reachable from the other hosts; see the module docstring
            self.controller.bind = _with_host(self.controller.bind, node_ip)
        self._check_capacity()
        self._actor_class = ray.remote(ServiceActor)

    def _check_capacity(self) -> None:
        """Refuse a run whose reservations exceed the whole cluster (it could never start),
        naming the resource (CPUs, GPUs or a custom resource of ``ray.custom_resources``)."""
        total = self._ray.cluster_resources()
        wanted: collections.defaultdict[str, float] = collections.defaultdict(float)
        for spec in self.specs:
            cpus, gpus = self.resources.resources(role_of(spec))
            wanted["CPU"] += cpus
            wanted["GPU"] += gpus
            for name, amount in self.resources.custom(role_of(spec)).items():
                wanted[name] += amount
        for name, amount in wanted.items():
            has = float(total.get(name, 0.0))
            if amount <= has + 1e-9:
                continue
            if name in ("CPU", "GPU"):
                key = f"ray.num_{name.lower()}s"
                raise ConfigError(key, amount, f"at most the cluster's {has:g} {name}s in all")
            raise ConfigError(
                "ray.custom_resources",
                f"{name} = {amount:g} in all",
                f"at most the {has:g} the cluster's nodes offer (ray start --resources)",
            )

    async def _spawn(self, spec: ServiceSpec) -> Handle:
        cpus, gpus = self.resources.resources(role_of(spec))
        if self.multi_host:
            spec = dataclasses.replace(spec, bind=_with_host(spec.bind, "0.0.0.0"))
        env = {k: os.environ[k] for k in _PASSED_ENV if os.environ.get(k)}
        incarnation = self.controller.restarts[spec.name]  # counted before a restart
        suffix = f"-r{incarnation}" if incarnation else ""
        options: dict[str, Any] = {
            "name": f"tianji-{self.controller.run_id}-{spec.name}{suffix}",
            "num_cpus": cpus,
            "num_gpus": gpus,
            "max_concurrency": 2,  # run() holds one thread; stop() needs the other
            "max_restarts": 0,
            "runtime_env": {"env_vars": env},
        }
        custom = self.resources.custom(role_of(spec))
        if custom:
            options["resources"] = custom
        node = self._pinned.get(spec.name)
        if node is not None:  # a relay: on its node while that lives, else anywhere
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        actor = self._actor_class.options(**options).remote()
        log.info("started %s as a Ray actor (%g CPUs, %g GPUs)", spec.name, cpus, gpus)
        return _RayActor(spec, actor, self._ray, self.placement_timeout)

    async def _started(self) -> None:
        """Wait until Ray placed and started every actor, then start the params relays
        the placement calls for (:mod:`tianji.launch.ray_nodes`).

        Raises:
            ServiceFailed: naming a service not placed within ``placement_timeout``.
        """
        handles = [h for h in self.children.values() if isinstance(h, _RayActor)]
        await self._await_placed(handles)
        nodes = {h.spec.name: h.node for h in handles if h.node is not None}
        if self.resources.relays and len(set(nodes.values())) > 1:
            await self._start_on_nodes(relay_specs(self.specs, nodes))
        wanted = self.resources.aggregate_from
        if wanted and len(self.specs) >= wanted:
            flush = self.resources.aggregate_flush_s
            await self._start_on_nodes(aggregator_specs(self.specs, nodes, flush))
        by_node: dict[str, list[str]] = collections.defaultdict(list)
        for name, ip in self.placement.items():
            by_node[ip].append(name)
        where = "; ".join(f"{ip}: {', '.join(names)}" for ip, names in sorted(by_node.items()))
        print(f"placed on Ray nodes: {where}", flush=True)

    async def _start_on_nodes(self, planned: list[tuple[ServiceSpec, Node]]) -> None:
        """Start each planned service on its node (params relays, heartbeat aggregators:
        see :mod:`tianji.launch.ray_nodes`).

        Raises:
            ServiceFailed: naming one not placed within ``placement_timeout``.
        """
        started = []
        for spec, node in planned:
            spec = dataclasses.replace(spec, controller=self.controller.address)
            self._pinned[spec.name] = node.node_id
            self.specs.append(spec)
            handle = await self._spawn(spec)
            self.children[spec.name] = handle
            self._born[spec.name] = time.monotonic()
            started.append(handle)
            log.info("%s on node %s", spec.name, node.ip)
        await self._await_placed([h for h in started if isinstance(h, _RayActor)])

    async def _await_placed(self, handles: Sequence[_RayActor]) -> None:
        """Wait until each handle's actor answered where it runs (one that died is
        reported by the watch loop).

        Raises:
            ServiceFailed: naming the first not placed within ``placement_timeout``.
        """
        if not handles:
            return
        _, pending = await asyncio.wait([h.placed for h in handles], timeout=self.placement_timeout)
        for handle in handles:
            if handle.placed not in pending:
                continue
            for fut in pending:
                fut.cancel()
            cpus, gpus = self.resources.resources(role_of(handle.spec))
            custom = self.resources.custom(role_of(handle.spec))
            extra = "".join(f", {v:g} {k}" for k, v in custom.items())
            raise ServiceFailed(
                handle.spec.name,
                f"not placed by Ray within {self.placement_timeout:g}s: it needs "
                f"{cpus:g} CPUs and {gpus:g} GPUs{extra}, Ray has "
                f"{self._ray.available_resources()}",
            )

    async def _close(self) -> None:
        for handle in self.children.values():
            if isinstance(handle, _RayActor):
                handle.placed.cancel()
                handle.kill()  # frees its worker process and its reservation
        if self._started_ray:
            self._ray.shutdown()
