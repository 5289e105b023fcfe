"""Checkpoints: a learner's full state plus the run's counters, in one file, without pickle.

A checkpoint file ``<run dir>/checkpoints/ckpt-<policy version>.tjc`` is the magic line
``TIANJI-CHECKPOINT 1\\n`` followed by one msgpack map::

    {"meta": {"policy_version", "algorithm", "env_id", "unix", "run": {...}},
     "state": <the algorithm's state tree, itself msgpack>}

A *state tree* is nested dicts / lists of ``None``, bool, int, float, str, bytes, numpy
arrays (msgpack ext type 1: dtype, shape, raw bytes) and torch tensors (ext type 2, loaded
back on the CPU). Nothing in a checkpoint runs code when it is read.

Who writes what (see ``docs/architecture.md``, "Run directory" and "Checkpoints and
resume"): learner-0 packs its algorithm's state (:func:`algorithm_state`,
:func:`pack_state`) every ``checkpoint.every_updates`` updates or
``checkpoint.every_seconds`` seconds and publishes it as a ``CheckpointTaken`` event; the
run's monitor (beside the controller, where the run directory is) adds the run's counters
and writes the file atomically (:func:`write_checkpoint`). So a learner on another host
checkpoints into the run directory too.

Usage::

    state = pack_state(algorithm_state(algo))               # learner side
    path = write_checkpoint(directory, state, meta)         # monitor side (temp + rename)
    ckpt = read_checkpoint(latest_checkpoint(directory))    # resume, eval
    restore_algorithm(algo, unpack_state(ckpt.state))
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgpack
import numpy as np

from tianji.runtime.errors import ConfigError, TianjiError

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "HYPERPARAMETERS_KEY",
    "SupportsCheckpoint",
    "adopt_algorithm",
    "algorithm_state",
    "check_identity",
    "checkpoint_files",
    "latest_checkpoint",
    "pack_state",
    "prune_checkpoints",
    "read_checkpoint",
    "replay_file",
    "restore_algorithm",
    "unpack_state",
    "write_checkpoint",
]

MAGIC = b"TIANJI-CHECKPOINT 1\n"
_ARRAY, _TENSOR = 1, 2
_NAME = re.compile(r"^ckpt-(\d+)\.tjc$")


class CheckpointError(TianjiError):
    """A checkpoint cannot be read, written or used.

    Attributes:
        path: the checkpoint file or directory.
        reason: what is wrong with it.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"checkpoint {path}: {reason}")
        self.path = str(path)
        self.reason = reason


@runtime_checkable
class SupportsCheckpoint(Protocol):
    """An algorithm whose whole learner state (networks, target networks, optimizer,
    update count) can be saved and restored; others are checkpointed by their weights only.

    Usage::

        state = algo.state_dict()          # a state tree (see the module docstring)
        fresh.load_state_dict(state)       # fresh: same config and spaces
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


RNG_KEY = "__rng__"
"""The key of the random generators' states in a state tree (:func:`rng_state`)."""
HYPERPARAMETERS_KEY = "__hyperparameters__"
"""The key of the perturbable hyperparameters' values in a state tree (an algorithm that
declares ``perturbable`` ones; PBT may have changed them since the run's config)."""


def algorithm_state(algo: Any) -> dict[str, Any]:
    """``algo.state_dict()``, or ``{"weights": algo.get_weights()}`` for an algorithm
    without one (its optimizer state is then not saved); with the random generators' states
    under :data:`RNG_KEY` (:func:`rng_state`), so a resumed learner draws what the original
    would have drawn."""
    if isinstance(algo, SupportsCheckpoint):
        state = dict(algo.state_dict())
    else:
        state = {"weights": algo.get_weights()}
    state[RNG_KEY] = rng_state(algo)
    declared = getattr(type(algo), "perturbable", None) or {}
    if declared:
        state[HYPERPARAMETERS_KEY] = {k: float(getattr(algo.config, k)) for k in declared}
    return state


def restore_algorithm(
    algo: Any, state: Mapping[str, Any], version: int, *, hyperparameters: bool = False
) -> None:
    """Load ``state`` (from :func:`algorithm_state`) into ``algo`` at ``version``, and the
    random generators' states where the checkpoint has them. With ``hyperparameters``
    (a population member's learner restarting), also the perturbable hyperparameters'
    values the state was taken with (PBT may have moved them from the config's); without
    it, ``algo`` keeps its config's.

    Raises:
        ConfigError: when the saved hyperparameters do not fit ``algo``.
    """
    state = dict(state)
    rng = state.pop(RNG_KEY, None)
    saved = state.pop(HYPERPARAMETERS_KEY, None)
    if isinstance(algo, SupportsCheckpoint) and "weights" not in state:
        algo.load_state_dict(state)
    else:
        algo.set_weights(state["weights"], version)
    if rng is not None:
        set_rng_state(algo, rng)
    if hyperparameters and saved:
        algo.set_hyperparameters(saved)


def adopt_algorithm(
    algo: Any, state: Mapping[str, Any], version: int, hyperparameters: Mapping[str, float]
) -> None:
    """A PBT exploit: load another member's ``state`` (from :func:`algorithm_state`: its
    weights, optimizer state, normalizers) into ``algo`` as ``version`` (the adopting
    learner's own count goes on), then set ``hyperparameters``
    (``algo.set_hyperparameters``). The random generators are not copied: the adopter
    keeps drawing its own numbers, or two members would explore alike.

    Raises:
        ConfigError: hyperparameters given to an algorithm that cannot set them, or ones
            it refuses.
    """
    own = {k: v for k, v in state.items() if k not in (RNG_KEY, HYPERPARAMETERS_KEY)}
    restore_algorithm(algo, own, version)
    algo.version = version
    if not hyperparameters:
        return
    setter = getattr(algo, "set_hyperparameters", None)
    if setter is None:
        why = "an algorithm with set_hyperparameters() (tianji.algorithms._base)"
        raise ConfigError("hyperparameters", dict(hyperparameters), why)
    setter(hyperparameters)


def rng_state(algo: Any) -> dict[str, Any]:
    """The states of what an update may draw from: torch's global generator (and CUDA's,
    when torch has initialized it), and the algorithm's own generators — numpy
    ``Generator`` and ``torch.Generator`` attributes (e.g. ``rng``), by attribute name."""
    import sys

    state: dict[str, Any] = {"numpy": {}, "torch_generators": {}}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = list(torch.cuda.get_rng_state_all())
    for name, value in sorted(vars(algo).items()):
        if isinstance(value, np.random.Generator):
            # PCG64's 128-bit integers do not fit msgpack: they travel as text
            state["numpy"][name] = _text_ints(value.bit_generator.state)
        elif torch is not None and isinstance(value, torch.Generator):
            state["torch_generators"][name] = value.get_state()
    return state


def set_rng_state(algo: Any, state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` saved (generators the algorithm no longer has are
    skipped)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and "torch" in state:
        torch.set_rng_state(_byte_tensor(torch, state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_byte_tensor(torch, s) for s in state["cuda"]])
    for name, saved in state.get("numpy", {}).items():
        generator = getattr(algo, name, None)
        if isinstance(generator, np.random.Generator):
            generator.bit_generator.state = _int_texts(saved)
    for name, saved in state.get("torch_generators", {}).items():
        generator = getattr(algo, name, None)
        if torch is not None and isinstance(generator, torch.Generator):
            generator.set_state(_byte_tensor(torch, saved))


def _byte_tensor(torch: Any, value: Any) -> Any:
    """A generator state (a uint8 tensor; numpy or a tensor after a round trip)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value, dtype=np.uint8))
    return value.to("cpu", torch.uint8)


def _text_ints(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _text_ints(v) for k, v in tree.items()}
    if isinstance(tree, int) and not isinstance(tree, bool):
        return f"int:{tree}"
    return tree


def _int_texts(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _int_texts(v) for k, v in tree.items()}
    if isinstance(tree, str) and tree.startswith("int:"):
        return int(tree[4:])
    return tree


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"object arrays cannot be checkpointed (dtype {arr.dtype})")
        head = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(_ARRAY, head + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, Mapping):  # e.g. the OrderedDict of a torch state_dict
        return dict(obj)
    if type(obj).__module__ == "torch" and type(obj).__name__ in ("Tensor", "Parameter"):
        arr = obj.detach().cpu().contiguous().numpy()
        head = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(_TENSOR, head + arr.tobytes())
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code not in (_ARRAY, _TENSOR):
        return msgpack.ExtType(code, data)
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    dtype_str, shape = unpacker.unpack()
    offset = unpacker.tell()
    dtype = np.dtype(dtype_str)
    if dtype.hasobject:
        raise ValueError(f"object dtype {dtype_str!r} in a checkpoint")
    count = int(np.prod(shape, dtype=np.int64))
    if count * dtype.itemsize != len(data) - offset:
        raise ValueError(f"array {dtype_str} {shape} does not match its {len(data) - offset} bytes")
    arr = np.frombuffer(data, dtype, count, offset).reshape(shape).copy()
    if code == _ARRAY:
        return arr
    import torch

    return torch.from_numpy(arr)


def pack_state(tree: Any) -> bytes:
    """A state tree as bytes (see the module docstring).

    Raises:
        TypeError: naming the type of a value that cannot be packed.
    """
    return msgpack.packb(tree, default=_default, use_bin_type=True, strict_types=True)


def unpack_state(data: bytes | memoryview) -> Any:
    """The state tree :func:`pack_state` packed (int map keys, e.g. an optimizer's, kept).

    Raises:
        ValueError: for bytes that are not a packed state tree.
    """
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise ValueError(f"not a packed state ({exc})") from None


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint file, read (:func:`read_checkpoint`).

    Attributes:
        path: the file.
        policy_version: learner updates when it was taken.
        meta: ``policy_version``, ``algorithm``, ``env_id``, ``unix`` and ``run`` (the run's
            counters then: ``env_steps``, ``episodes``, ``elapsed_s``, ``returns``).
        state: the packed algorithm state (:func:`unpack_state` opens it).
    """

    path: Path
    policy_version: int
    meta: dict[str, Any]
    state: bytes

    @property
    def run(self) -> dict[str, Any]:
        """The run's counters when the checkpoint was taken."""
        run: dict[str, Any] = self.meta.get("run", {})
        return run


def check_identity(ckpt: Checkpoint, algorithm: str, env_id: str) -> None:
    """Check that ``ckpt`` was taken by ``algorithm`` on ``env_id`` (a checkpoint without
    them in its meta passes).

    Raises:
        CheckpointError: naming the file and both values when one differs.
    """
    for key, expected in (("algorithm", algorithm), ("env_id", env_id)):
        found = ckpt.meta.get(key)
        if found is not None and found != expected:
            why = f"was taken with {key} {found!r}, but the run config has {expected!r}"
            raise CheckpointError(ckpt.path, why)


def write_checkpoint(
    directory: str | Path, state: bytes, meta: Mapping[str, Any], name: str | None = None
) -> Path:
    """Write ``ckpt-<meta["policy_version"]>.tjc`` (or ``name``) into ``directory``
    (created if needed): to a temporary file, flushed to disk, then renamed, so a reader or
    a crash never sees part of a checkpoint."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"ckpt-{int(meta['policy_version']):010d}.tjc")
    tmp = directory / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(msgpack.packb({"meta": dict(meta), "state": state}, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read one checkpoint file.

    Raises:
        CheckpointError: naming the file when it is missing, not a checkpoint, or damaged.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(path, f"cannot be read ({exc.strerror or exc})") from None
    if not data.startswith(MAGIC):
        raise CheckpointError(path, "is not a tianji checkpoint (no TIANJI-CHECKPOINT header)")
    try:
        body = msgpack.unpackb(data[len(MAGIC) :], raw=False)
        meta, state = body["meta"], body["state"]
        version = int(meta["policy_version"])
    except (msgpack.UnpackException, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(path, f"is damaged ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, bytes) or not isinstance(meta, dict):
        raise CheckpointError(path, "is damaged (meta or state of the wrong type)")
    return Checkpoint(path, version, meta, state)


def replay_file(directory: str | Path, buffer: str) -> Path:
    """Where the newest replay snapshot of ``buffer`` (``[checkpoint] replay``) is kept."""
    return Path(directory) / f"replay-{buffer}.tjc"


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The checkpoint files in ``directory``, oldest policy version first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | Path) -> Path:
    """The newest checkpoint in ``directory`` (a run directory or its ``checkpoints/``).

    Raises:
        CheckpointError: when there is none.
    """
    directory = Path(directory)
    if (directory / "checkpoints").is_dir():
        directory = directory / "checkpoints"
    files = checkpoint_files(directory)
    if not files:
        raise CheckpointError(directory, "holds no checkpoint (ckpt-*.tjc)")
    return files[-1]


def prune_checkpoints(directory: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the deleted files."""
    files = checkpoint_files(directory)
    old = files[: max(len(files) - keep, 0)]
    for path in old:
        path.unlink(missing_ok=True)
    return old
