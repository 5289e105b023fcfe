"""Population-based training in a run: :class:`PBTRunner` carries out :func:`tianji.rl.pbt.plan`.

On every progress interval (:meth:`PBTRunner.step`) it reads each member's env steps and
objective from the member's monitor (the mean training return of the last ``[stop]
window`` episodes, or the newest evaluation's with ``objective = "eval"``) and asks the
pure planner which ready members exploit whom. An exploit (:meth:`PBTRunner._exploit`):

1. asks the source member's learner-0 for a checkpoint now (``TakeCheckpoint``) and waits,
   at most ``FRESH_S``, until the source's monitor has it (else it takes the newest the
   monitor holds: at most ``[checkpoint] every_seconds`` old);
2. sends the adopting member's learner an :class:`~tianji.rl.events.AdoptState` with that
   packed state (weights, optimizer state, normalizers) and the explored hyperparameters:
   the learner loads it between two updates and publishes it as its own next version;
3. appends one line to ``population.jsonl``: the step, who copied whom, the objectives and
   the hyperparameters before and after (:meth:`tianji.rl.pbt.Exploit.record`).

An exploit that cannot be carried out (the source has no state yet, the adopter's learner
is down) is written with ``"done": false`` and why; the member keeps training as it was.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

from tianji.rl.events import AdoptState, TakeCheckpoint
from tianji.rl.pbt import Exploit, HyperRange, MemberState, PopulationConfig, plan
from tianji.rl.stats import LearnerStat
from tianji.rl.topics import learner_name
from tianji.runtime.scope import full_name
from tianji.services.monitor import TrainMonitor

__all__ = ["PBTRunner"]

log = logging.getLogger("tianji.pbt")

FRESH_S = 10.0
"""How long an exploit waits for the source's fresh checkpoint."""


class Member(Protocol):
    """What the runner reads of a member's plan (:class:`tianji.run.plan.RunPlan`)."""

    scope: str

    @property
    def monitor(self) -> TrainMonitor | None: ...

    @property
    def config(self) -> Any: ...


class Commands(Protocol):
    """The run's controller, as the runner uses it."""

    @property
    def heartbeats(self) -> Mapping[str, Any]: ...

    async def command(self, name: str, ev: Any) -> bool: ...


class PBTRunner:
    """Exploit and explore among a population's members (see the module docstring).

    Args:
        population: the ``[population]`` settings.
        declared: the algorithm's perturbable hyperparameters.
        members: scope -> member plan.
        hparams: each member's starting values of the explored hyperparameters.
        seed: seeds the planner's generator.
        out: where each exploit is announced.
    """

    def __init__(
        self,
        population: PopulationConfig,
        declared: Mapping[str, HyperRange],
        members: Mapping[str, Member],
        hparams: list[dict[str, float]],
        *,
        seed: int,
        out: TextIO,
    ) -> None:
        self.population = population
        self.rules = population.rules()
        self.declared = dict(declared)
        self.members = dict(members)
        self.states = {
            scope: MemberState(name=scope, hparams=dict(h), ready_at=self.rules.interval)
            for scope, h in zip(self.members, hparams, strict=True)
        }
        self.rng = np.random.default_rng([seed, 2017])
        self.out = out
        self.record: Path | None = None
        self.exploits: list[dict[str, Any]] = []
        """The lines written to ``population.jsonl`` (every exploit, done or not)."""
        self.controller: Commands | None = None
        self._busy: asyncio.Task[None] | None = None

    def attach(self, controller: Commands) -> None:
        """Send commands through the run's controller."""
        self.controller = controller

    def _objective(self, monitor: TrainMonitor) -> float | None:
        if self.population.objective == "eval":
            return monitor.eval_return()
        return monitor.mean_return()

    def step(self) -> None:
        """Plan the exploits now due and carry them out in the background (one batch at a
        time: a step while the last batch runs only waits for it)."""
        if self.controller is None or (self._busy is not None and not self._busy.done()):
            return
        for scope, member in self.members.items():
            monitor = member.monitor
            if monitor is None:
                return
            state = self.states[scope]
            state.env_steps = monitor.env_steps
            state.objective = self._objective(monitor)
        due = plan(list(self.states.values()), self.declared, self.rules, self.rng)
        if due:
            self._busy = asyncio.get_running_loop().create_task(self._carry_out(due))

    async def settle(self) -> None:
        """Wait for the exploits in flight (the run is about to stop)."""
        if self._busy is not None:
            await asyncio.wait({self._busy}, timeout=FRESH_S + 5.0)

    async def _carry_out(self, due: list[Exploit]) -> None:
        for exploit in due:
            try:
                done, why = await self._exploit(exploit)
            except Exception as exc:
                log.exception("exploit of %s failed", exploit.member)
                done, why = False, f"{type(exc).__name__}: {exc}"
            self._write(exploit, done, why)

    async def _exploit(self, ex: Exploit) -> tuple[bool, str]:
        assert self.controller is not None
        controller = self.controller
        source = self.members[ex.source]
        monitor = source.monitor
        if monitor is None:
            return False, f"{ex.source} has no monitor"
        head = full_name(ex.source, learner_name(0))
        beat = controller.heartbeats.get(head)
        version = int(beat.counters.get(LearnerStat.LEARNER_UPDATES, 0)) if beat else 0
        if version > max(monitor.checkpoint_version, 0) and await controller.command(
            head, TakeCheckpoint(reason="pbt")
        ):
            await monitor.wait_checkpoint(version, FRESH_S)
        state = monitor.latest_state
        if state is None:
            return False, f"{ex.source} has no checkpointed state yet"
        adopt = AdoptState(
            source=ex.source,
            source_version=state[0],
            state=np.frombuffer(state[1], np.uint8),
            hyperparameters=dict(ex.after),
        )
        count = self.members[ex.member].config.learner.count
        names = [full_name(ex.member, learner_name(j)) for j in range(count)]
        sent = [await controller.command(name, adopt) for name in names]
        if not all(sent):
            down = [n for n, ok in zip(names, sent, strict=True) if not ok]
            return False, f"not delivered to {', '.join(down)}"
        self.states[ex.member].hparams = dict(ex.after)
        return True, f"{ex.source}'s state at v{state[0]}"

    def _write(self, ex: Exploit, done: bool, why: str) -> None:
        line = {**ex.record(), "done": done, "detail": why, "unix": time.time()}
        self.exploits.append(line)
        verb = "copied" if done else "could not copy"
        after = " ".join(f"{k} {v:.3g}" for k, v in ex.after.items())
        tail = f"; {after}" if done else f": {why}"
        print(
            f"pbt: {ex.member} {verb} {ex.source} at step {ex.step} "
            f"({ex.objective:.1f} < {ex.source_objective:.1f}){tail}",
            file=self.out,
            flush=True,
        )
        if self.record is not None:
            with open(self.record, "a") as f:
                f.write(json.dumps(line) + "\n")
