"""Population runs (``[population] size = N``): N policies trained side by side in one run.

Each member ``m0 .. m{N-1}`` is a whole single-policy run of its own — parameter service,
buffer shards, learners, inference services, its share of the actors (``actors.count``
split as evenly as it goes), evaluation workers and a monitor — in a scope of its own
(:mod:`tianji.runtime.scope`): its services are registered as ``m1.learner-0`` and its
topics are its own, so no sample of one member can reach another member's learner. One
controller serves them all; its :class:`~tianji.services.population.PopulationBalancer`
balances each member as its own run. :class:`PopulationPlan` composes the members'
:class:`~tianji.run.plan.RunPlan` objects, each of which sees the controller through a
:class:`~tianji.run.members.MemberController`, and runs population-based training
(:class:`~tianji.run.pbt_runner.PBTRunner`) among them.

The run directory holds ``config.json``, ``metrics.jsonl`` (one row per progress interval
with every member), ``population.jsonl`` (one line per exploit/explore step) and
``summary.json`` (with a ``population`` section); each member's own records (metrics rows,
TensorBoard, checkpoints, summary) are under ``members/<member>/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO, cast

from tianji.dashboard.model import Members
from tianji.launch.base import LaunchPlan
from tianji.launch.restarts import RestartPolicy
from tianji.launch.spec import ServiceSpec
from tianji.rl.config import RunConfig, to_dict
from tianji.rl.pbt import (
    PopulationConfig,
    check_hyperparameters,
    initial_hyperparameters,
    member_name,
)
from tianji.run.members import MemberController, PopulationMonitor
from tianji.run.pbt_runner import PBTRunner
from tianji.run.plan import RunPlan
from tianji.run.progress import PlainDisplay, Snapshot
from tianji.run.recovery import restart_policy
from tianji.run.rundir import RunDirectory, RunRecorder, run_name, write_json_atomic
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError, ServiceFailed
from tianji.runtime.scope import ScopedViews, full_name, scope_of, split_name
from tianji.runtime.service import Service
from tianji.services.balancer import Balancer
from tianji.services.common import make_algorithm
from tianji.services.population import PopulationBalancer

__all__ = ["PopulationPlan", "member_configs"]

MEMBER_SEED_STRIDE = 1_000_003
"""Member ``m`` runs with seed ``seed + m * MEMBER_SEED_STRIDE`` (its actors' seeds follow)."""


def member_configs(config: RunConfig) -> tuple[list[RunConfig], list[dict[str, float]]]:
    """Each member's run config and its explored hyperparameters' starting values.

    A member gets ``actors.count // N`` actors (the first ``actors.count % N`` one more),
    its seed, and ``[population] init``'s values in its ``[algo]``.

    Raises:
        ConfigError: hyperparameters the algorithm does not declare perturbable, or a
            member whose share of the actors cannot carry the other settings.
    """
    pop = config.population
    probe = make_algorithm(config, seed=config.seed, device="cpu")
    declared = dict(getattr(type(probe), "perturbable", {}))
    if pop.pbt:
        explored = check_hyperparameters(pop.hyperparameters, declared, config.algorithm)
    else:
        explored = tuple(pop.init)
    starts = initial_hyperparameters(pop, declared, config.algorithm, config.seed)
    configs, hparams = [], []
    n, total = pop.size, config.actors.count
    for m in range(n):
        share = total // n + (1 if m < total % n else 0)
        algo = {**config.algo, **starts[m]}
        try:
            member = dataclasses.replace(
                config,
                seed=config.seed + m * MEMBER_SEED_STRIDE,
                actors=dataclasses.replace(config.actors, count=share),
                population=PopulationConfig(),
                algo=algo,
            )
        except ConfigError as exc:
            why = f"a size whose members' {share} actors can carry the run ({exc})"
            raise ConfigError("population.size", n, why) from None
        values = make_algorithm(member, seed=member.seed, device="cpu").config
        configs.append(member)
        hparams.append({name: float(getattr(values, name)) for name in explored})
    return configs, hparams


def _check_population(config: RunConfig, resume: str | None) -> None:
    pop = config.population
    if resume is not None:
        why = "a single-policy run (population runs do not resume yet)"
        raise ConfigError("--resume", resume, why)
    if not pop.pbt:
        return
    if config.learner.count > 1:
        why = "1 with [population] pbt (K data-parallel learners cannot adopt a state together yet)"
        raise ConfigError("learner.count", config.learner.count, why)
    if not config.checkpoint.enabled or not config.run_dir:
        why = "false without checkpoints and a run directory (exploits copy checkpointed state)"
        raise ConfigError("population.pbt", True, why)


class _Quiet:
    """A member's display: its rows go to its metrics file; the population prints."""

    def show(self, snapshot: Snapshot) -> None:
        """Nothing: :meth:`PopulationPlan.progress` prints one line for every member."""

    def close(self) -> None:
        """Nothing to release."""


@dataclasses.dataclass(slots=True)
class PopulationPlan:
    """A validated population run (see the module docstring); launched like a
    :class:`~tianji.run.plan.RunPlan` by :func:`tianji.run.train.train`."""

    config: RunConfig
    members: list[RunPlan]
    balancers: dict[str, Balancer]
    out: TextIO
    metrics_path: str | None = None
    dashboard: str | None = None
    pbt: PBTRunner | None = None
    hyperparameters: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """Each member's starting values of the explored hyperparameters."""
    directory: RunDirectory | None = None
    _rows: list[TextIO] = dataclasses.field(default_factory=list)
    _views: dict[str, MemberController] = dataclasses.field(default_factory=dict)
    _scoped: tuple[ScopedViews[Any], ScopedViews[Any]] = dataclasses.field(
        default_factory=lambda: (ScopedViews(), ScopedViews())
    )  # the members' views of the heartbeats and the registry, filed once for all

    @classmethod
    def build(
        cls,
        config: RunConfig,
        out: TextIO = sys.stdout,
        metrics_path: str | None = None,
        resume: str | None = None,
    ) -> PopulationPlan:
        """Validate the population and plan every member.

        Raises:
            ConfigError: for any bad setting, before any process starts.
        """
        _check_population(config, resume)
        configs, hparams = member_configs(config)
        members = []
        for m, member_config in enumerate(configs):
            member = RunPlan.build(member_config, out)
            member.scope = member_name(m)
            members.append(member)
        balancers = {p.scope: Balancer(p.balance) for p in members}
        plan = cls(config, members, balancers, out, metrics_path)
        if config.population.pbt:
            probe = make_algorithm(configs[0], seed=config.seed, device="cpu")
            plan.pbt = PBTRunner(
                config.population,
                dict(type(probe).perturbable),
                {p.scope: p for p in members},
                hparams,
                seed=config.seed,
                out=out,
            )
        plan.hyperparameters = {p.scope: h for p, h in zip(members, hparams, strict=True)}
        return plan

    # ------------------------------------------------------------------ what launchers read
    @property
    def specs(self) -> list[ServiceSpec]:
        """Every member's services, under their full names and with their scope."""
        return [
            dataclasses.replace(
                s,
                name=full_name(p.scope, s.name),
                options={**s.options, "scope": p.scope},
            )
            for p in self.members
            for s in p.specs
        ]

    @property
    def on_policy(self) -> bool:
        return self.members[0].on_policy

    @property
    def monitor(self) -> PopulationMonitor | None:
        """The members' monitors as one (``None`` until they exist)."""
        if any(p.monitor is None for p in self.members):
            return None
        return PopulationMonitor(lambda: [p.monitor for p in self.members])

    def dashboard_members(self, controller: Controller) -> Members:
        """Each member's view of the controller and its monitor (the dashboard's curves and
        per-member books)."""
        return {p.scope: (self.view(controller, p), p.monitor) for p in self.members}

    def view(self, controller: Controller, plan: RunPlan) -> Controller:
        """``plan``'s member view of the run's controller (made once)."""
        view = self._views.get(plan.scope)
        if view is None or view.controller is not controller:
            balancer = self.balancers[plan.scope]
            view = MemberController(controller, plan.scope, [balancer], *self._scoped)
            self._views[plan.scope] = view
        return cast(Controller, view)

    def launch_plan(self, controller_bind: str) -> LaunchPlan:
        """What a launcher needs to run every member."""
        return LaunchPlan(
            specs=self.specs,
            until=self.until,
            controller_bind=controller_bind,
            local_services=self.local_services(controller_bind),
            progress=self.progress,
            progress_interval=2.0,
            before_stop=self.before_stop,
            plugins=[PopulationBalancer(self.balancers, *self._scoped)],
            restarts=self.restarts,
        )

    def local_services(self, bind: str) -> Callable[[str], list[Service]]:
        """Every member's monitor, in its scope."""
        makers = [p.local_services(bind) for p in self.members]
        return lambda address: [s for make in makers for s in make(address)]

    def until(self, controller: Controller) -> bool:
        """The run ends when one member is done (its target, step or time budget): the
        members' budgets run alike, so they end with about the same env steps."""
        return any([p.until(self.view(controller, p)) for p in self.members])

    def restarts(self, controller: Controller) -> RestartPolicy:
        """Each member's restart policy, chosen by the dead service's scope."""
        policies = {
            p.scope: restart_policy(p, self.view(controller, p), self.out) for p in self.members
        }
        first = policies[self.members[0].scope]

        def local(spec: ServiceSpec) -> tuple[RestartPolicy, ServiceSpec]:
            scope = scope_of(spec.name)
            return policies[scope], dataclasses.replace(spec, name=split_name(spec.name, scope))

        def prepare(spec: ServiceSpec, k: int) -> ServiceSpec | None:
            policy, own = local(spec)
            ready = policy.prepare(own, k) if policy.prepare is not None else own
            return dataclasses.replace(ready, name=spec.name) if ready is not None else None

        def group(spec: ServiceSpec) -> str:
            policy, own = local(spec)
            name = policy.group(own) if policy.group is not None else ""
            return full_name(scope_of(spec.name), name) if name else ""

        return dataclasses.replace(first, prepare=prepare, group=group)

    async def before_stop(self, controller: Controller, reason: str) -> None:
        """Every member drains and takes its last checkpoint, all at once."""
        if self.pbt is not None:
            await self.pbt.settle()
        await asyncio.gather(
            *(p.before_stop(self.view(controller, p), reason) for p in self.members)
        )

    # ------------------------------------------------------------------ records
    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """The run directory (``members/<member>/`` for each member's own records) and the
        population's metrics rows, for the length of the run."""
        config = self.config
        if config.run_dir:
            self.directory = RunDirectory.create(config.run_dir, run_name(config))
            self.directory.write_config(config)
            print(f"run directory: {self.directory.path}", file=self.out, flush=True)
            self._rows.append(open(self.directory.metrics, "w"))  # noqa: SIM115 (closed below)
            if self.pbt is not None:
                self.pbt.record = self.directory.path / "population.jsonl"
        if self.metrics_path:
            self._rows.append(open(self.metrics_path, "w"))  # noqa: SIM115 (closed below)
        try:
            for p in self.members:
                sub = None
                if self.directory is not None:
                    sub = RunDirectory(self.directory.path / "members" / p.scope)
                    sub.path.mkdir(parents=True)
                    sub.write_config(p.config)
                p.recorder = RunRecorder(cast(PlainDisplay, _Quiet()), sub)
            yield
        finally:
            for p in self.members:
                if p.recorder is not None:
                    p.recorder.close()
            rows, self._rows = self._rows, []
            for f in rows:
                f.close()

    def progress(self, controller: Controller, elapsed: float) -> None:
        """Every member's snapshot (its metrics row and TensorBoard), one line and one
        metrics row for the population; then the PBT step, when it is due."""
        for p in self.members:
            if p.monitor is not None:
                p.progress(self.view(controller, p), elapsed)
        snaps = {p.scope: p._last for p in self.members if p._last is not None}
        if not snaps:
            return
        print(self._line(elapsed, snaps), file=self.out, flush=True)
        row = {
            "elapsed_s": round(elapsed, 3),
            "unix": time.time(),
            "env_steps": sum(s.env_steps for s in snaps.values()),
            "members": {scope: self._member_row(scope, s) for scope, s in snaps.items()},
        }
        line = json.dumps(row) + "\n"
        for f in self._rows:
            f.write(line)
            f.flush()
        if self.pbt is not None:
            self.pbt.attach(controller)
            self.pbt.step()

    def _hparams(self, scope: str) -> dict[str, float]:
        if self.pbt is not None:
            return dict(self.pbt.states[scope].hparams)
        return dict(self.hyperparameters.get(scope, {}))

    def _member_row(self, scope: str, s: Snapshot) -> dict[str, Any]:
        return {
            "env_steps": s.env_steps,
            "episodes": s.episodes,
            "mean_return": s.mean_return,
            "eval_return": (s.evaluation or {}).get("mean_return"),
            "updates": s.updates,
            "hyperparameters": self._hparams(scope),
        }

    def _line(self, elapsed: float, snaps: dict[str, Snapshot]) -> str:
        steps = sum(s.env_steps for s in snaps.values())
        parts = [f"[{elapsed:7.1f}s] env steps {steps:8d}"]
        for scope, s in snaps.items():
            ret = f"{s.mean_return:7.1f}" if s.mean_return is not None else "      -"
            hp = " ".join(f"{k} {v:.3g}" for k, v in self._hparams(scope).items())
            parts.append(f"{scope} {ret}" + (f" ({hp})" if hp else ""))
        if self.pbt is not None:
            parts.append(f"exploits {len(self.pbt.exploits)}")
        return " | ".join(parts)

    def finish(
        self,
        controller: Controller,
        reason: str,
        wall: float,
        summary_path: str | None,
        backend: str | None = None,
        placement: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Every member's summary (in its directory), and the population's (with the
        node of each service, by full name, on Ray: ``placement``)."""
        summaries: dict[str, dict[str, Any]] = {}
        failures = []
        for p in self.members:
            try:
                summaries[p.scope] = p.finish(self.view(controller, p), reason, wall, None, backend)
            except ServiceFailed as exc:
                failures.append(exc)
                summaries[p.scope] = _read_summary(p)
        summary = population_summary(self, summaries, reason, wall)
        if backend is not None:
            summary["backend"] = backend
        if placement:
            summary["placement"] = dict(placement)
        if self.directory is not None:
            write_json_atomic(self.directory.summary, summary)
        if summary_path:
            write_json_atomic(summary_path, summary)
        if failures:
            raise failures[0]
        return summary


def _read_summary(plan: RunPlan) -> dict[str, Any]:
    """A failed member's summary, as its ``finish`` wrote it (empty when it wrote none)."""
    directory = plan.recorder.directory if plan.recorder is not None else None
    if directory is None or not directory.summary.exists():
        return {}
    data: dict[str, Any] = json.loads(directory.summary.read_text())
    return data


def population_summary(
    plan: PopulationPlan, members: dict[str, dict[str, Any]], reason: str, wall: float
) -> dict[str, Any]:
    """The run's summary: totals, the best member's return, and the ``population``
    section (per member: final return, hyperparameters, exploits, books closed)."""
    config = plan.config
    finals = {m: s.get("final_return") for m, s in members.items()}
    known = {m: r for m, r in finals.items() if r is not None}
    best = max(known, key=lambda m: known[m]) if known else None
    exploits = plan.pbt.exploits if plan.pbt is not None else []
    section = {
        "size": len(plan.members),
        "pbt": plan.pbt is not None,
        "objective": config.population.objective,
        "best_member": best,
        "best_return": known.get(best) if best is not None else None,
        "median_return": statistics.median(known.values()) if known else None,
        "exploits": len(exploits),
        "members": {
            m: {
                "final_return": finals[m],
                "eval_return": s.get("eval_return"),
                "env_steps": s.get("env_steps"),
                "learner_updates": s.get("learner_updates"),
                "hyperparameters": plan._hparams(m),
                "initial_hyperparameters": plan.hyperparameters.get(m, {}),
                "exploited": sum(1 for e in exploits if e["member"] == m),
                "copied_from_it": sum(1 for e in exploits if e["copied_from"] == m),
                "books_closed": (s.get("accounting") or {}).get("balanced"),
                "stop_reason": s.get("stop_reason"),
            }
            for m, s in members.items()
        },
    }
    return {
        "algorithm": config.algorithm,
        "env_id": config.env.id,
        "stop_reason": next(
            (s["stop_reason"] for s in members.values() if s.get("stop_reason")), reason
        ),
        "wall_s": round(wall, 3),
        "env_steps": sum(int(s.get("env_steps") or 0) for s in members.values()),
        "final_return": section["best_return"],
        "run_dir": str(plan.directory.path) if plan.directory is not None else None,
        "config": to_dict(config),
        "population": section,
    }
