"""Helpers for tests of tianji services and transports (also for plugin authors)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tianji.runtime.loop import run
from tianji.runtime.plugins import free_tcp_port

__all__ = [
    "LISTEN_ADDRESSES",
    "check_checkpoint_round_trip",
    "free_tcp_port",
    "interruptible",
    "processes_with_arg",
    "run_async",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

LISTEN_ADDRESSES = {"inproc": "inproc://", "tcp": "tcp://127.0.0.1:0", "shm": "shm://"}
"""A listen address per transport scheme for tests (port 0 / auto name)."""


def run_async(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    """Run ``coro`` on the configured loop; a hang fails with ``TimeoutError``."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return run(guarded())


def processes_with_arg(*args: str) -> list[int]:
    """Pids of live processes whose command line contains all ``args`` in sequence."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            words = [w.decode(errors="replace") for w in cmdline]
            if _contains_run(words, list(args)):
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError as exc:  # it ended while we looked
            log.debug("pid %s: %r", entry.name, exc)
    return found


def _contains_run(words: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(words[i : i + n] == needle for i in range(len(words) - n + 1))


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT as a terminal's Ctrl-C does:
    SIGINT back to its default, whatever this process inherited (a test run started in the
    background by a non-interactive shell has SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_checkpoint_round_trip(
    make: Callable[[int], Any], batch: Mapping[str, Any], *, updates: int = 3
) -> None:
    """Check that an algorithm's checkpoint holds everything its next update depends on.

    Builds ``make(0)``, trains it ``updates`` times on ``batch``, checkpoints it the way the
    learner does (``algorithm_state`` -> msgpack -> back), updates it once more; then builds
    ``make(1)`` (another seed: nothing may come from the constructor), restores the
    checkpoint into it (as a resumed learner in a fresh process: networks, optimizer
    state, version and random generators) and updates it once. Both must end with
    bit-identical weights and state.

    Usage (in an algorithm's tests; ``docs/writing-an-algorithm.md``, "Checkpoints")::

        make = lambda seed: MySAC(MySAC.Config(), obs_space, action_space, seed=seed)
        check_checkpoint_round_trip(make, a_replay_batch)

    Raises:
        AssertionError: naming the first weight or state entry that differs, or the
            version, or a missing ``state_dict`` / ``load_state_dict``.
    """
    from tianji.rl.checkpoint import (
        SupportsCheckpoint,
        algorithm_state,
        pack_state,
        restore_algorithm,
        unpack_state,
    )

    original: Any = make(0)
    checkpointable = isinstance(original, SupportsCheckpoint)
    if not checkpointable:
        raise AssertionError(
            f"{type(original).__name__} has no state_dict/load_state_dict: a resumed run "
            "would restart its optimizer (see docs/writing-an-algorithm.md)"
        )
    for _ in range(updates):
        original.update(batch)
    state = unpack_state(pack_state(algorithm_state(original)))
    original.update(batch)
    restored: Any = make(1)
    restore_algorithm(restored, state, updates)
    restored.update(batch)
    if getattr(restored, "version", None) != getattr(original, "version", None):
        raise AssertionError(f"version {restored.version} after resume != {original.version}")
    _same("weights", original.get_weights(), restored.get_weights())
    _same("state", _arrays(original.state_dict()), _arrays(restored.state_dict()))


def _arrays(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a state tree by its dotted path, tensors as numpy arrays."""
    import numpy as np

    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_arrays(value, f"{prefix}{key}."))
        return out
    if isinstance(tree, list | tuple):
        out = {}
        for i, value in enumerate(tree):
            out.update(_arrays(value, f"{prefix}{i}."))
        return out
    if hasattr(tree, "detach"):
        tree = tree.detach().cpu().numpy()
    return {prefix.rstrip("."): np.asarray(tree) if not isinstance(tree, str) else tree}


def _same(what: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    import numpy as np

    if a.keys() != b.keys():
        raise AssertionError(f"{what} keys differ after resume: {sorted(a.keys() ^ b.keys())}")
    for key in a:
        if not np.array_equal(np.asarray(a[key]), np.asarray(b[key])):
            raise AssertionError(
                f"{what} {key!r} differs after resume: the checkpoint misses something the "
                "update depends on (optimizer state, a counter, a random generator?)"
            )
