"""The learner's state beyond its updates: checkpoints, resuming, and PBT's exploits.

:class:`LearnerState` is the base of :class:`~tianji.services.learner.LearnerService`:
learner-0 packs its algorithm's whole state between two updates and publishes it to the
run's monitor (:class:`CheckpointTaken`); a resumed learner waits for the state to continue
from (:class:`RestoreCheckpoint`); a population member's learner loads another member's
state when the run's PBT tells it to (:class:`AdoptState`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np

from tianji.rl.checkpoint import (
    SupportsCheckpoint,
    adopt_algorithm,
    algorithm_state,
    pack_state,
    restore_algorithm,
    unpack_state,
)
from tianji.rl.config import RunConfig
from tianji.rl.events import AdoptState, CheckpointTaken, RestoreCheckpoint
from tianji.rl.stats import LearnerStat
from tianji.rl.topics import CHECKPOINTS
from tianji.runtime.errors import TianjiError
from tianji.runtime.service import Service

__all__ = ["LearnerState"]

log = logging.getLogger("tianji.services.learner")


class LearnerState(Service):
    """Checkpoints, resume and adoption of a learner (see the module docstring)."""

    RESTORE_TIMEOUT_S = 120.0

    config: RunConfig
    algo: Any
    index: int
    version: int
    _restored: asyncio.Event
    _restore_wanted: bool
    _checkpointed: tuple[int, float]
    _updating: bool
    _checkpoint_wanted: bool
    _warned_weights_only: bool
    _adopt_wanted: AdoptState | None = None

    async def _publish_weights(self) -> None:
        raise NotImplementedError

    async def on_restore(self, ev: RestoreCheckpoint) -> None:
        """Continue from a checkpoint's state (once; a repeat, or a state this learner does
        not wait for, is counted and ignored)."""
        if self._restored.is_set() or not self._waits_for_restore():
            self.counters["restores_ignored"] += 1
            return
        try:
            state = unpack_state(ev.state.tobytes())
            # a population member keeps what PBT made of its hyperparameters
            restore_algorithm(self.algo, state, ev.policy_version, hyperparameters=bool(self.scope))
        except (ValueError, KeyError, RuntimeError, TypeError, TianjiError) as exc:
            self.fail(f"cannot restore the checkpoint at version {ev.policy_version}: {exc}")
            return
        self.version = ev.policy_version
        self.counters[LearnerStat.LEARNER_UPDATES] = self.version
        self.counters["restored_version"] = self.version
        self._hyperparameter_gauges()
        self._restored.set()

    def _waits_for_restore(self) -> bool:
        """Started to continue a run (a restart, or a run resumed by its controller)."""
        return self._restore_wanted or self.resuming

    async def _wait_restored(self) -> bool:
        try:
            await asyncio.wait_for(self._restored.wait(), self.RESTORE_TIMEOUT_S)
        except TimeoutError:
            self.fail(f"resume: no checkpoint state arrived in {self.RESTORE_TIMEOUT_S:.0f} s")
            return False
        return True

    async def _maybe_checkpoint(self) -> None:
        """Learner-0: pack and publish the state when a ``[checkpoint]`` trigger fired or
        one was requested (between two updates, so the state is one update's, never half
        of one)."""
        c = self.config.checkpoint
        if self.index != 0 or not c.enabled:
            return
        now = asyncio.get_running_loop().time()
        version, at = self._checkpointed
        due = c.every_updates > 0 and self.version - version >= c.every_updates
        due |= c.every_seconds > 0 and now - at >= c.every_seconds
        if (due or self._checkpoint_wanted) and self.version != version:
            await self._checkpoint()
        self._checkpoint_wanted = False

    async def _checkpoint(self) -> None:
        self._checkpointed = (self.version, asyncio.get_running_loop().time())
        if not self.subscriber_count(CHECKPOINTS):
            self.counters["checkpoints_unsent"] += 1  # no monitor writing them (no run dir)
            return
        if await self.publish(self._checkpoint_event(), CHECKPOINTS):
            self.counters[LearnerStat.CHECKPOINTS_TAKEN] += 1

    def _checkpoint_event(self) -> CheckpointTaken:
        """The algorithm's whole state, packed, at the current policy version."""
        if not isinstance(self.algo, SupportsCheckpoint) and not self._warned_weights_only:
            self._warned_weights_only = True
            log.warning(
                "%s: algorithm %r has no state_dict()/load_state_dict(): its checkpoints keep "
                "the weights only, and a resumed run restarts its optimizer from zero "
                "(docs/writing-an-algorithm.md)",
                self.name,
                self.config.algorithm,
            )
        state = np.frombuffer(pack_state(algorithm_state(self.algo)), np.uint8)
        return CheckpointTaken(policy_version=self.version, state=state)

    def _checkpoint_at_stop(self) -> None:
        """Stopped by a signal of its own (SIGTERM / SIGINT to this process) with updates
        since the last checkpoint: hand the state to the monitor without waiting (the drain
        delivers it), unless an update was cut off mid-way (its state is not one update's)
        or the learner failed. A run that stops cleanly asked for its last checkpoint before
        sending Shutdown (``RunPlan.before_stop``)."""
        c = self.config.checkpoint
        if self.index != 0 or not c.enabled or self._updating or self.failure is not None:
            return
        if not self.stop_reason.startswith("signal "):  # a Shutdown: the run took its own
            return
        if self.version == self._checkpointed[0] or not self.subscriber_count(CHECKPOINTS):
            return
        self._checkpointed = (self.version, 0.0)
        try:
            self.publish_nowait(self._checkpoint_event(), CHECKPOINTS)
            self.counters[LearnerStat.CHECKPOINTS_TAKEN] += 1
        except TianjiError as exc:  # the monitor's link is full or gone
            self.counters["checkpoints_unsent"] += 1
            log.warning("%s: no checkpoint at stop: %s", self.name, exc)

    def _hyperparameter_gauges(self) -> None:
        """Gauges ``hp/<name>``: the perturbable hyperparameters' values now (PBT)."""
        prefix = LearnerStat.HYPERPARAMETER_PREFIX
        for k in getattr(type(self.algo), "perturbable", None) or {}:
            self.gauges[f"{prefix}{k}"] = float(getattr(self.algo.config, k))

    async def on_adopt(self, ev: AdoptState) -> None:
        """A PBT exploit: adopt ``ev``'s state now, or right after the update in flight."""
        self._adopt_wanted = ev
        if not self._updating:
            await self._adopt()

    async def _adopt(self) -> None:
        """Load the wanted state (:func:`~tianji.rl.checkpoint.adopt_algorithm`) as the next
        version and publish it; a state that does not load is counted and logged, and the
        learner goes on with its own."""
        ev, self._adopt_wanted = self._adopt_wanted, None
        if ev is None:
            return
        try:
            state = unpack_state(ev.state.tobytes())
            adopt_algorithm(self.algo, state, self.version + 1, ev.hyperparameters)
        except (ValueError, KeyError, RuntimeError, TypeError, TianjiError) as exc:
            self.counters[LearnerStat.PBT_ADOPT_FAILED] += 1
            log.error("%s: cannot adopt %s's state: %s", self.full_name, ev.source, exc)
            return
        self.version += 1
        self.counters[LearnerStat.LEARNER_UPDATES] = self.version
        self.counters[LearnerStat.PBT_ADOPTED] += 1
        self._hyperparameter_gauges()
        log.info(
            "%s: adopted %s's state (its v%d) as v%d with %s",
            self.full_name, ev.source, ev.source_version, self.version, ev.hyperparameters,
        )  # fmt: skip
        if self.index == 0:
            await self._publish_weights()
            if self.config.checkpoint.enabled:  # a restart resumes from what it adopted
                await self._checkpoint()
        self.report_soon()
