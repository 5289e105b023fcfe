"""Self-play on connect four: train for S seconds, then measure the final policy.

    python benchmarks/selfplay.py --seconds 1800 --out docs/results

Runs ``tianji train examples/connect_four_selfplay.toml --max-seconds S`` (timed from its
launch), then plays the newest checkpoint's greedy policy ``--games`` games against the
uniform random player and as many against the scripted one
(``tianji.rl.selfplay.ConnectFourScripted``), half first and half second, scores its
one-move tactics in as many games against the scripted player
(``benchmarks/connect_four_tactics.py``), and reads the
run's league: the rating of each snapshot when it was taken (the newest snapshot's rating
over the run) and the evaluations made during the run. Writes
``<out>/selfplay-connect-four.json`` and ``.md``. Run it alone on the machine.

``--set KEY=VALUE`` passes overrides to training (e.g. ``--set
'selfplay.train_opponents={}'`` for pure self-play: the example mixes the scripted and
random players into training, and the report says so whenever the policy was trained
against a fixed opponent) and ``--tag NAME`` writes
``selfplay-connect-four-NAME.{json,md}`` instead.

The goal it reports (issue 35): after 30 minutes the policy wins >= 95 % of its games
against random and >= 70 % against the scripted player, from both seats alike, and the
newest snapshot's rating rises monotonically over the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "connect_four_selfplay.toml"
GAME = "pettingzoo.classic.connect_four_v3"


def train(seconds: float, seed: int, work: Path, overrides: list[str]) -> dict[str, Any]:
    summary = work / "summary.json"
    command = [
        sys.executable, "-m", "tianji.cli", "train", str(EXAMPLE), "--max-seconds",
        str(seconds), "--seed", str(seed), "--no-dashboard", "--summary", str(summary),
        "--run-dir", str(work / "runs"), *(x for o in overrides for x in ("--set", o)),
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 600)
    if proc.returncode != 0:
        raise SystemExit(f"training failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(summary.read_text())
    out["wall_s"] = round(time.time() - started, 1)
    out["command"] = " ".join(command[1:])
    return out


def measure(run_dir: str, games: int, seed: int) -> dict[str, Any]:
    """The newest checkpoint's greedy policy against each fixed opponent, by seat, and
    its one-move tactics in as many games against the scripted player
    (``connect_four_tactics.py``)."""
    from connect_four_tactics import tactics

    from tianji.rl.selfplay import (
        ConnectFourScripted,
        RandomOpponent,
        play_games,
        two_player_factory,
    )
    from tianji.run.policy import load_policy

    policy = load_policy(run_dir)
    make = two_player_factory(GAME, {}, "alternate")
    results: dict[str, Any] = {"policy_version": policy.policy_version}
    for name, opponent in (("random", RandomOpponent), ("scripted", ConnectFourScripted)):
        by_seat = {
            seat: play_games(make, policy, opponent(seed=seed), games // 2, seed, seat=seat)
            for seat in ("first", "second")
        }
        both = {
            k: (by_seat["first"][k] + by_seat["second"][k]) / 2 for k in ("win", "draw", "loss")
        }
        results[name] = {**both, "games": games, "by_seat": by_seat}
    results["tactics"] = tactics(policy, games, seed)
    return results


def drops(curve: list[Any]) -> list[tuple[int, float, float]]:
    """Where a ``(version, rating, ...)`` curve falls: (version, rating before, rating)."""
    return [
        (curve[i][0], curve[i - 1][1], curve[i][1])
        for i in range(1, len(curve))
        if curve[i][1] < curve[i - 1][1]
    ]


def rating_curve(summary: dict[str, Any]) -> dict[str, Any]:
    """The newest snapshot's rating when each was taken, and every snapshot's rating at
    the end (rated on by the games against it; runs from before it have none)."""
    curve = summary["selfplay"]["rating_at_snapshot"]
    falls = drops(curve)
    out = {"curve": curve, "monotonic": not falls, "drops": falls}
    settled = summary["selfplay"].get("snapshot_ratings")
    if settled is not None:
        out["settled"] = {"curve": settled, "drops": drops(settled)}
    return out


def curve_line(curve: dict[str, Any]) -> str:
    """The rating curves, in a sentence."""
    points = curve["curve"]
    line = (
        f"Newest snapshot's rating at its creation, {len(points)} snapshots: "
        f"monotonic: {curve['monotonic']} (drops: {len(curve['drops'])}); first "
        f"{points[0] if points else '-'}, last {points[-1] if points else '-'}."
    )
    if "settled" in curve:
        s = curve["settled"]
        line += (
            f" Each snapshot's rating at the end, after the games against it: "
            f"{len(s['drops'])} drops over {len(s['curve'])}; first "
            f"{s['curve'][0][:2] if s['curve'] else '-'}, last "
            f"{s['curve'][-1][:2] if s['curve'] else '-'}."
        )
    return line


def _trained_against(report: dict[str, Any]) -> str:
    mix = report.get("trained_against_fixed") or {}
    tactics = report.get("train", {}).get("selfplay", {}).get("opponent_tactics") or []
    if not mix and tactics:
        return (
            "Trained by self-play with the snapshots (and live games) playing the one-move "
            f"rules {', '.join(tactics)} on top of their policy (`[selfplay] opponent_tactics`): "
            "the fixed opponents were never played in training."
        )
    if not mix:
        return "Trained by pure self-play: the fixed opponents were never played in training."
    each = ", ".join(
        f"{o} in {v['probability']:.0%} of the games ({v['games']} games)" for o, v in mix.items()
    )
    return (
        f"**Trained with fixed opponents mixed in** ({each}; `[selfplay] train_opponents`): "
        "the figures against an opponent trained against measure play against a known "
        "opponent, not generalization."
    )


def tactics_line(t: dict[str, Any]) -> str:
    """What ``connect_four_tactics.tactics`` found, in a sentence."""
    kinds = "; ".join(
        f"{k} {t[k]['right']:.3f} of {t[k]['positions']}" for k in ("win", "block", "safe")
        if t[k]["positions"]
    )  # fmt: skip
    return (
        f"One-move tactics in {t['games']} more games against the scripted player "
        f"(`benchmarks/connect_four_tactics.py`), share right of the positions: {kinds}; "
        f"{t['losses_after_a_miss']} of its {t['losses']} losses followed a missed win or block."
    )


def markdown(report: dict[str, Any]) -> str:
    m, curve = report["final"], report["rating"]
    lines = [
        f"# Self-play on connect four, {report['seconds']:.0f} s (seed {report['seed']})",
        "",
        f"Command: `{report['train']['command']}`, then {m['random']['games']} games of the "
        "newest checkpoint's greedy policy against each fixed opponent, half first, half second.",
        "",
        _trained_against(report),
        "",
        "| opponent | win | draw | loss | win first | win second |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("random", "scripted"):
        r = m[name]
        lines.append(
            f"| {name} | {r['win']:.3f} | {r['draw']:.3f} | {r['loss']:.3f} | "
            f"{r['by_seat']['first']['win']:.3f} | {r['by_seat']['second']['win']:.3f} |"
        )
    if "tactics" in m:  # (reports from before connect_four_tactics.py have none)
        lines += ["", tactics_line(m["tactics"])]
    lines += [
        "",
        curve_line(curve),
        "",
        "Evaluations during the run (policy version, opponent, win share):",
        "",
    ]
    for ev in report["evaluations"]:
        lines.append(
            f"- t {ev['t']:.0f} s, v{ev['policy_version']}: {ev['opponent']} {ev['win']:.2f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/selfplay.py", description=__doc__)
    p.add_argument("--seconds", type=float, default=1800.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--games", type=int, default=400, help="per fixed opponent (even)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--set", action="append", default=[], help="a config override for training")
    p.add_argument("--tag", default="", help="results go to selfplay-connect-four-<tag>.{json,md}")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"training {args.seconds:.0f} s from {time.strftime('%H:%M:%S')}", flush=True)
        summary = train(args.seconds, args.seed, Path(tmp), args.set)
        final = measure(summary["run_dir"], args.games, args.seed + 1)
    evaluations = [
        {k: ev[k] for k in ("t", "policy_version", "opponent", "win", "draw", "loss")}
        for ev in summary["evaluations"]
        if ev.get("opponent")
    ]
    curve = rating_curve(summary)
    report = {
        "seconds": args.seconds,
        "seed": args.seed,
        "overrides": args.set,
        "trained_against_fixed": summary["selfplay"].get("train_opponents", {}),
        "train": {
            k: summary[k] for k in ("command", "wall_s", "env_steps", "learner_updates", "selfplay")
        },
        "final": final,
        "rating": curve,
        "evaluations": evaluations,
        "goal": {
            "win_vs_random_ge_0.95": final["random"]["win"] >= 0.95,
            "win_vs_scripted_ge_0.70": final["scripted"]["win"] >= 0.70,
            "rating_monotonic": curve["monotonic"],
        },
        "unix": time.time(),
    }
    text = markdown(report)
    print(text)
    print(json.dumps(report["goal"]))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "selfplay-connect-four" + (f"-{args.tag}" if args.tag else "")
        (args.out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{name}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
