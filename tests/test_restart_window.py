"""Restart intensity: at most N restarts of a service within T seconds (a sliding window),
checked as pure logic with a fake clock, against the defaults' two promises (a kill every
10 s rides through, a crash loop stops), and through a launcher whose services are fakes."""

from __future__ import annotations

import asyncio
import itertools
import signal

import pytest

from tianji.launch.base import Launcher
from tianji.launch.restarts import RestartPolicy, RestartWindow, restart_delay
from tianji.launch.spec import ServiceSpec
from tianji.rl.config_ops import RESTART_PERIOD_S, RESTARTS
from tianji.runtime.errors import ServiceFailed


def test_the_window_admits_n_restarts_within_t_then_refuses_until_the_oldest_leaves() -> None:
    window = RestartWindow(period=60.0)
    assert [window.admit(t, limit=3) for t in (0.0, 10.0, 20.0)] == [True, True, True]
    assert not window.admit(59.9, limit=3)  # a 4th within 60 s of the first
    assert list(window.times) == [0.0, 10.0, 20.0]  # a refusal records nothing
    assert window.admit(60.0, limit=3)  # the restart at 0 left the window (t - 60, t]
    assert window.recent(60.0) == 3 and window.recent(200.0) == 0
    assert not RestartWindow(5.0).admit(0.0, limit=0)  # restarts off
    whole_run = RestartWindow(float("inf"))
    assert [whole_run.admit(t * 1e6, limit=2) for t in range(3)] == [True, True, False]
    assert window.refusal(3) == "no restart: 3 restarts within 60 s is its limit"
    assert window.refusal(0) == "no restart: restarts are off for it"
    assert whole_run.refusal(1) == "no restart: 1 restart in the run is its limit"


def _defaults(limit: int = RESTARTS) -> RestartPolicy:
    return RestartPolicy(limit=lambda spec: limit, period=RESTART_PERIOD_S)


def _crash_loop_stopped_after(policy: RestartPolicy, life: float) -> float | None:
    """Seconds from a crash loop's first death (each incarnation dies ``life`` s after its
    spawn) until the window refuses a restart; ``None`` if not within 100 deaths."""
    window = RestartWindow(policy.period)
    now, quick = 0.0, 0
    for _ in range(100):
        if not window.admit(now, policy.limit(ServiceSpec(name="a-0", factory="m:f"))):
            return now
        delay, quick = restart_delay(policy, life, quick)
        now += delay + life
    return None


def test_the_defaults_stop_a_crash_loop_within_a_minute() -> None:
    """A service that dies right after every start: the 6th death comes 1+2+4+8+16 s of
    backoff plus 5 lives after the first, inside the 50-s window."""
    assert (RESTARTS, RESTART_PERIOD_S) == (5, 50.0)
    assert _crash_loop_stopped_after(_defaults(), life=0.5) == 31 + 5 * 0.5
    assert _crash_loop_stopped_after(_defaults(), life=2.0) == 41.0
    # one that lives 4 s each time is no longer told from a service killed now and then: it
    # goes on, restarted every 34 s at the backoff's cap (docs/architecture.md, "Faults")
    assert _crash_loop_stopped_after(_defaults(), life=4.0) is None


def _refused(policy: RestartPolicy, kills: tuple[bool, ...], every: float, startup: float) -> bool:
    """Does one service, killed at tick ``i`` (``every`` s apart) if ``kills[i]`` and it is
    running then (``startup`` s after its spawn), ever meet a refusal?"""
    window = RestartWindow(policy.period)
    spawned, quick = -1e9, 0
    for i, kill in enumerate(kills):
        now = i * every
        if not kill or now - spawned < startup:
            continue
        if not window.admit(now, policy.limit(ServiceSpec(name="a-0", factory="m:f"))):
            return True
        delay, quick = restart_delay(policy, now - spawned, quick)
        spawned = now + delay
    return False


@pytest.mark.parametrize("every", [10.0, 7.0])
def test_no_order_of_kills_every_10_s_exceeds_the_defaults(every: float) -> None:
    """Every subset of 15 kill ticks (2.5 min at 10 s: the window and the backoff's reset
    fit twice) against one service: none reaches a 6th restart within 50 s, so a kill of a
    random service every 10 s (or 7 s) cannot stop the run, however long it lasts. The same
    search finds refusals for a limit of 4, so it can fail."""
    patterns = list(itertools.product((False, True), repeat=15))
    assert not any(_refused(_defaults(), p, every, startup=0.1) for p in patterns)
    assert any(_refused(_defaults(limit=4), p, every, startup=0.1) for p in patterns)


# ----------------------------------------------------------------------------- launcher
class _Fake:
    """A service that lives ``life`` seconds, then exits with ``code``."""

    def __init__(self, spec: ServiceSpec, life: float, code: int) -> None:
        self.spec = spec
        self.exit_note = ""
        self._task = asyncio.ensure_future(self._live(life, code))

    @staticmethod
    async def _live(life: float, code: int) -> int:
        await asyncio.sleep(life)
        return code

    @property
    def returncode(self) -> int | None:
        return self._task.result() if self._task.done() else None

    async def wait(self) -> int | None:
        return await asyncio.shield(self._task)

    def signal(self, sig: signal.Signals) -> None:
        if not self._task.done():
            self._task.cancel()
            self._task = asyncio.ensure_future(self._live(0, -sig.value))


class _FakeLauncher(Launcher):
    def __init__(self, life: float, policy: RestartPolicy, timeout: float) -> None:
        spec = ServiceSpec(name="flaky-0", factory="m:f")
        super().__init__([spec], until=lambda c: False, timeout=timeout, restarts=policy)
        self.life = life
        self.spawned = 0

    async def _spawn(self, spec: ServiceSpec) -> _Fake:
        self.spawned += 1
        return _Fake(spec, self.life, code=1)


def test_a_launcher_ends_a_crash_loop_naming_the_service_the_limit_and_the_period() -> None:
    policy = RestartPolicy(limit=lambda spec: 3, period=60.0, backoff=0.01)
    launcher = _FakeLauncher(life=0.01, policy=policy, timeout=30)
    with pytest.raises(ServiceFailed) as info:
        asyncio.run(launcher.run())
    assert info.value.service == "flaky-0"
    assert "exited with code 1; no restart: 3 restarts within 60 s is its limit" in str(info.value)
    assert launcher.spawned == 4 and launcher.controller.restarts["flaky-0"] == 3


def test_a_launcher_restarts_a_service_dying_now_and_then_past_the_old_whole_run_count() -> None:
    """Deaths 0.3 s apart with at most 2 restarts per 0.5 s: never refused; the run ends
    at its timeout with many more restarts than 2."""
    policy = RestartPolicy(limit=lambda spec: 2, period=0.5, backoff=0.0)
    launcher = _FakeLauncher(life=0.3, policy=policy, timeout=3.0)
    with pytest.raises(TimeoutError):
        asyncio.run(launcher.run())
    assert launcher.controller.restarts["flaky-0"] >= 6
