"""A Sample Factory run's learning curve (``sf_runner.py --curve``): frames and the mean
return of the recent episodes every few seconds, as tianji's metrics rows count them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Curve:
    """A learning curve: every ``every`` seconds of the run (from the script's launch, as
    tianji's metrics rows count), frames and the mean true return of the last ``window``
    episodes (``RecordEpisodeStatistics``' whole games where the env records them, else
    SF's episode reward)."""

    every: float
    window: int = 20
    returns: list[float] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)
    next_t: float = 0.0

    def on_episodes(self, stats: dict[str, Any]) -> None:
        found = _find(stats, "RecordEpisodeStatistics_reward")
        if found is None:
            found = _find(stats, "reward")
        if found is not None:
            values = found.tolist() if hasattr(found, "tolist") else found
            self.returns.extend(
                float(v) for v in (values if isinstance(values, list) else [values])
            )

    def on_steps(self, t: float, sf_frames: int, frameskip: int, force: bool = False) -> None:
        if t < self.next_t and not force:
            return
        recent = self.returns[-self.window :]
        self.points.append(
            {
                "t": round(t, 3),
                "frames": sf_frames,
                "env_steps": sf_frames // frameskip,
                "mean_return": sum(recent) / len(recent) if recent else None,
                "episodes": len(self.returns),
            }
        )
        while self.next_t <= t:
            self.next_t += self.every


def _find(tree: Any, key: str) -> Any:
    """The value under ``key`` anywhere in nested dicts (SF nests episodic stats)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None
