"""The kill loop of ``tianji bench chaos``: watch a run through its dashboard's status,
kill a random service of a killable role every few seconds, cut the actors' host off now
and then (hosts only), and note what came back and how the survivors' RSS went."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tianji.bench.chaos_run import ChaosRun

__all__ = ["KillLoop"]

log = logging.getLogger(__name__)


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read().decode())
        return body


def _rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:  # it is gone: no RSS
        log.debug("pid %d: %r", pid, exc)
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


class KillLoop:
    """Kill a random service of ``roles`` every ``every`` seconds (and cut the actors' host
    off every ``cut_every`` seconds, for ``cut_seconds``) during ``run``; :meth:`watch`."""

    def __init__(
        self,
        run: ChaosRun,
        rng: random.Random,
        roles: tuple[str, ...],
        every: float,
        cut_every: float,
        cut_seconds: float,
    ) -> None:
        self.run, self.rng, self.roles, self.every = run, rng, roles, every
        self.cut_every, self.cut_seconds = cut_every, cut_seconds
        self.pids_seen: set[int] = {s.pid for s in run.supervisors}
        self.kills: list[dict[str, Any]] = []
        self.cuts: list[dict[str, float]] = []
        self.pending: dict[str, dict[str, Any]] = {}  # service -> its kill, until it is back
        self.first: dict[str, int] = {}
        self.rss_mid: dict[str, float | None] = {}
        self.rss_series: dict[str, list[tuple[float, float]]] = {}  # survivors' RSS each minute
        self.status: dict[str, Any] = {}
        self.began = self.next_kill = self.next_sample = 0.0
        self.next_cut = float("inf")
        self.cut_until: float | None = None

    def watch(self, minutes: float, warmup: float) -> dict[str, Any]:
        """Wait for the first episode and ``warmup`` seconds, then kill for ``minutes``;
        what was seen (kills, cuts, pids, returns, RSS)."""
        url, proc = self.run.url, self.run.proc
        _wait(url, lambda s: s["counters"]["episodes"] > 0, 180)
        time.sleep(warmup)
        self.status = _status(url)
        return_before = self.status["counters"]["mean_return"]
        self.first = {s["name"]: s["pid"] for s in self.status["services"] if s["pid"]}
        self.pids_seen.update(self.first.values())
        rss_first = {name: _rss_mb(pid) for name, pid in self.first.items()}
        print(f"chaos: first kill at {warmup:.0f} s, return {return_before}", file=sys.stderr)
        self.began = self.next_sample = self.next_kill = time.monotonic()
        if self.cut_every > 0:
            self.next_cut = self.began + self.cut_every
        deadline, halfway = self.began + minutes * 60, self.began + minutes * 30
        while time.monotonic() < deadline:
            try:
                self.status = _status(url)
            except OSError as exc:  # the run ended or its dashboard is busy: see the report
                log.debug("no status: %r", exc)
                if proc.poll() is not None:
                    break
                time.sleep(0.5)
                continue
            self._step(halfway)
            if proc.poll() is not None:
                break
            time.sleep(0.25)
        if self.cut_until is not None and self.run.cut is not None:
            self.run.cut(True)
        self._let_the_last_come_back()
        for kill in self.kills:
            kill.pop("at", None)  # a monotonic time: meaningless in the report
        return {
            "kills": self.kills,
            "cuts": self.cuts,
            "pids_seen": self.pids_seen,
            "return_before": return_before,
            "return_end": self.status["counters"]["mean_return"],
            "rss_first": rss_first,
            "rss_mid": self.rss_mid,
            "rss_end": self._survivors_rss(),
            "rss_series": self.rss_series,
        }

    def _step(self, halfway: float) -> None:
        """One look at the status: RSS, restarts, a cut and a kill when they are due."""
        rows = {s["name"]: s for s in self.status["services"]}
        self.pids_seen.update(s["pid"] for s in rows.values() if s["pid"])
        now = time.monotonic()
        if not self.rss_mid and now >= halfway:
            self.rss_mid = {n: _rss_mb(p) for n, p in self.first.items()}
        if now >= self.next_sample:
            _sample_rss(self.rss_series, self.first, rows, round((now - self.began) / 60, 1))
            self.next_sample = now + 60
        _settle(self.pending, rows, now)
        self._cut(now)
        if now >= self.next_kill:
            self._kill(rows, now)
            self.next_kill = now + self.every

    def _cut(self, now: float) -> None:
        """Bring the actors' host's link back, or take it down, when that is due."""
        if self.cut_until is not None and now >= self.cut_until:
            assert self.run.cut is not None
            self.run.cut(True)
            self.cut_until = None
            print(f"chaos: [{now - self.began:6.1f} s] link back", file=sys.stderr)
        elif self.cut_until is None and now >= self.next_cut:
            assert self.run.cut is not None
            self.run.cut(False)
            self.cut_until, self.next_cut = now + self.cut_seconds, now + self.cut_every
            self.cuts.append({"t": round(now - self.began, 1), "seconds": self.cut_seconds})
            print(f"chaos: [{now - self.began:6.1f} s] cut the actors' host off", file=sys.stderr)

    def _kill(self, rows: dict[str, Any], now: float) -> None:
        """SIGKILL a random running service of a killable role not already down."""
        candidates = [
            s for s in rows.values()
            if s["role"] in self.roles and s["state"] == "running" and s["pid"]
            and s["name"] not in self.pending
        ]  # fmt: skip
        if not candidates:
            return
        victim = self.rng.choice(sorted(candidates, key=lambda s: s["name"]))
        try:
            os.kill(victim["pid"], signal.SIGKILL)
        except ProcessLookupError as exc:  # it died on its own meanwhile
            log.debug("%s already gone: %r", victim["name"], exc)
        kill = {
            "t": round(now - self.began, 1),
            "service": victim["name"],
            "role": victim["role"],
            "pid": victim["pid"],
            "at": now,
            "restart_s": None,
        }
        self.kills.append(kill)
        self.pending[victim["name"]] = kill
        print(f"chaos: [{kill['t']:6.1f} s] killed {victim['name']}", file=sys.stderr)

    def _let_the_last_come_back(self) -> None:
        settle = time.monotonic() + 60  # let the last kills come back (backoff <= 30 s)
        while self.pending and time.monotonic() < settle and self.run.proc.poll() is None:
            try:
                self.status = _status(self.run.url)
            except OSError as exc:  # busy or gone: settle with the last status
                log.debug("no status: %r", exc)
            rows = {s["name"]: s for s in self.status["services"]}
            _settle(self.pending, rows, time.monotonic())
            time.sleep(0.25)

    def _survivors_rss(self) -> dict[str, float | None]:
        killed = {k["service"] for k in self.kills}
        return {
            s["name"]: _rss_mb(s["pid"])
            for s in self.status["services"]
            if s["pid"] and s["name"] not in killed
        }


def _sample_rss(
    series: dict[str, list[tuple[float, float]]],
    first: dict[str, int],
    rows: dict[str, Any],
    minute: float,
) -> None:
    """Append the RSS of every first-seen service still running as the same process."""
    for name, pid in first.items():
        row = rows.get(name)
        mb = _rss_mb(pid) if row is not None and row["pid"] == pid else None
        if mb is None:
            series.pop(name, None)  # killed (or gone): not a survivor
            continue
        series.setdefault(name, []).append((minute, round(mb, 1)))


def _settle(pending: dict[str, dict[str, Any]], rows: dict[str, Any], now: float) -> None:
    """Mark the kills whose service runs again (a new pid) as restarted."""
    for name, kill in list(pending.items()):
        row = rows.get(name)
        if row and row["state"] == "running" and row["pid"] not in (None, kill["pid"]):
            kill["restart_s"] = round(now - kill["at"], 2)
            del pending[name]


def _wait(url: str, ok: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            body = _status(url)
        except OSError as exc:  # not up yet
            log.debug("no status yet: %r", exc)
        else:
            if ok(body):
                return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not start within {timeout:.0f} s")
        time.sleep(0.5)
