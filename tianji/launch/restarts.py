"""Whether and when a dead service starts again: the restart policy a launcher (and ``tianji
serve --restart``'s supervisor) applies, the restart intensity window and the backoff."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

from tianji.launch.spec import ServiceSpec

__all__ = ["RestartPolicy", "RestartWindow", "restart_delay"]


@dataclasses.dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Which dead services the launcher starts again, and when.

    A service may restart at most ``limit(spec)`` times within any ``period`` seconds (a
    restart intensity, as an OTP supervisor's): a death that would be its ``limit + 1``-th
    restart in the last ``period`` seconds ends the run (:class:`RestartWindow`). A service
    killed now and then restarts for as long as the run lasts; one that dies right after
    every start is stopped after ``limit`` restarts (within ``period``, given the backoff).

    Attributes:
        limit: restarts a service (by its spec) may have within ``period``; 0: its death
            ends the run.
        period: seconds over which restarts are counted (``inf``: the whole run).
        backoff: seconds before a service's first restart, doubled for each further one
            in a row of quick deaths.
        backoff_max: the longest wait before a restart.
        stable_after: an incarnation that lived this long before it died starts the
            doubling again from ``backoff`` (a crash loop backs off; a service that dies
            now and then, e.g. with its host, comes back within seconds every time).
        heartbeat_timeout: a registered service silent this long is declared dead and
            killed (``None``: only an exited process is dead).
        prepare: the spec of restart ``k`` of a service (e.g. resume from a checkpoint);
            ``None`` from it ends the run instead (with the reason it logged).
        group: services restarted together: when one dies, the launcher kills the live
            others with the same (non-empty) group and each restarts through the policy
            like a death of its own (e.g. K data-parallel learners, which must all resume
            from the same checkpoint); ``None`` or ``""``: on its own.
    """

    limit: Callable[[ServiceSpec], int]
    period: float
    backoff: float = 1.0
    backoff_max: float = 30.0
    stable_after: float = 30.0
    heartbeat_timeout: float | None = None
    prepare: Callable[[ServiceSpec, int], ServiceSpec | None] | None = None
    group: Callable[[ServiceSpec], str] | None = None


class RestartWindow:
    """The restarts of one service within the last ``period`` seconds (pure: the caller
    passes the clock).

    Usage::

        window = RestartWindow(period=60.0)
        if not window.admit(time.monotonic(), limit=5):
            ...  # a 6th restart within 60 s: give up, naming window.refusal(5)
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self.times: collections.deque[float] = collections.deque()

    def recent(self, now: float) -> int:
        """Restarts admitted in ``(now - period, now]``."""
        while self.times and self.times[0] <= now - self.period:
            self.times.popleft()
        return len(self.times)

    def admit(self, now: float, limit: int) -> bool:
        """Record a restart at ``now`` if fewer than ``limit`` were admitted within the
        period before it; ``False`` (nothing recorded) when the limit is reached."""
        if self.recent(now) >= limit:
            return False
        self.times.append(now)
        return True

    def refusal(self, limit: int) -> str:
        """Why a restart was refused, naming the limit and the period."""
        if limit == 0:
            return "no restart: restarts are off for it"
        within = "in the run" if self.period == float("inf") else f"within {self.period:g} s"
        return f"no restart: {limit} restart{'s' if limit != 1 else ''} {within} is its limit"


def restart_delay(policy: RestartPolicy, lived: float, quick_deaths: int) -> tuple[float, int]:
    """The wait before restarting a service whose incarnation ``lived`` seconds, after
    ``quick_deaths`` deaths in a row each less than ``policy.stable_after`` after a start.

    Returns:
        ``(seconds, quick deaths in a row counting this one)``: ``backoff * 2**k`` (at most
        ``backoff_max``), ``k`` back to 0 when the incarnation was stable.
    """
    quick = 0 if lived >= policy.stable_after else quick_deaths
    # the exponent is bounded: a crash loop that runs for hours must not overflow a float
    return min(policy.backoff * 2.0 ** min(quick, 64), policy.backoff_max), quick + 1
