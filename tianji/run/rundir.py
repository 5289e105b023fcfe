"""A run's directory and records: resolved config, metrics rows, TensorBoard, summary.

Every ``tianji train`` (and ``tianji controller``) run gets its own directory
``<run_dir>/<name>-<YYYYmmdd-HHMMSS>/`` (``run_dir`` defaults to ``runs``)::

    config.json      the resolved run config (``tianji train`` accepts it as CONFIG)
    metrics.jsonl    one JSON row per progress interval (tianji.run.progress.metrics_row)
    tb/              TensorBoard event files: scalars per interval, step = env steps
    summary.json     the run's summary, written when it ends
    checkpoints/     ckpt-<policy version>.tjc, the newest ``checkpoint.keep`` of them
                     (``tianji.rl.checkpoint``)

``tianji train --resume RUN_DIR`` continues a run in its own directory: the metrics rows
are appended, TensorBoard drops what was logged after the checkpoint's env step, and the
counters go on from the checkpoint (:func:`resume_point`).

:class:`RunRecorder` ties the records of one run together with its progress display; it is
opened before any service starts and closed on every exit path.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from tianji.rl.checkpoint import Checkpoint, check_identity, latest_checkpoint, read_checkpoint
from tianji.rl.config import RunConfig, to_dict
from tianji.run.config import load_config
from tianji.run.progress import (
    LiveDisplay,
    PlainDisplay,
    Snapshot,
    make_display,
    metrics_row,
    scalars,
)
from tianji.runtime.errors import ConfigError

__all__ = [
    "RESUME_MUST_MATCH",
    "RunDirectory",
    "RunRecorder",
    "TensorBoard",
    "resume_point",
    "run_name",
    "write_json_atomic",
]

log = logging.getLogger(__name__)


def run_name(config: RunConfig) -> str:
    """``config.name``, else ``<algorithm>-<env>``, as a safe file name (a ``module:Class``
    or ``path.py:Class`` counts by its class name)."""
    name = config.name or "-".join(
        part.rpartition(":")[2] for part in (config.algorithm, config.env.id)
    )
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-") or "run"


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON: to a temporary file beside ``path``, then renamed
    over it, so a reader sees the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True, slots=True)
class RunDirectory:
    """One run's directory; see the module docstring for its layout."""

    path: Path

    @classmethod
    def create(
        cls, root: str | Path, name: str, now: datetime.datetime | None = None
    ) -> RunDirectory:
        """Create ``<root>/<name>-<YYYYmmdd-HHMMSS>/`` (local time), with ``-2``, ``-3``, ...
        appended when another run took that name in the same second.

        Raises:
            ConfigError: naming ``run_dir`` when the directory cannot be created.
        """
        stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            for n in itertools.count(1):
                path = Path(root) / (f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}")
                try:
                    path.mkdir()  # atomic: exactly one run gets each name
                except FileExistsError as exc:  # taken: the next name
                    log.debug("%r", exc)
                    continue
                return cls(path)
        except OSError as exc:
            why = f"a directory tianji can write ({exc})"
            raise ConfigError("run_dir", str(root), why) from None
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def existing(cls, path: str | Path) -> RunDirectory:
        """A run directory written before (it must hold ``config.json``).

        Raises:
            ConfigError: naming ``--resume`` and the path when it is not a run directory.
        """
        directory = cls(Path(path))
        if not directory.config.is_file():
            why = "a run directory of an earlier run (with config.json)"
            raise ConfigError("--resume", str(path), why)
        return directory

    @property
    def config(self) -> Path:
        return self.path / "config.json"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tb"

    @property
    def checkpoints(self) -> Path:
        """Where checkpoints go (created by whoever writes the first one)."""
        return self.path / "checkpoints"

    def write_config(self, config: RunConfig) -> None:
        """Save the resolved run config (atomically)."""
        write_json_atomic(self.config, to_dict(config))


RESUME_MUST_MATCH = ("algorithm", "env", "algo")
"""Config keys a resumed run must keep (the checkpoint's networks and spaces depend on them);
everything else (actors, stop conditions, balance, ...) may change on resume."""


def resume_point(path: str | Path, config: RunConfig) -> tuple[RunDirectory, Checkpoint]:
    """The run directory at ``path`` and its newest checkpoint, for a run of ``config``
    to continue from.

    Raises:
        ConfigError: when ``path`` is not a run directory, or ``config`` changes a key of
            :data:`RESUME_MUST_MATCH` (naming the key and both values).
        CheckpointError: when it holds no readable checkpoint, or the checkpoint is of
            another algorithm or env.
    """
    directory = RunDirectory.existing(path)
    before = to_dict(load_config(directory.config))
    now = to_dict(config)
    for key in RESUME_MUST_MATCH:
        if before.get(key) != now.get(key):
            why = f"{before.get(key)!r} as in {directory.config} (a resumed run keeps {key})"
            raise ConfigError(key, now.get(key), why)
    ckpt = read_checkpoint(latest_checkpoint(directory.path))
    check_identity(ckpt, config.algorithm, config.env.id)
    return directory, ckpt


class TensorBoard:
    """Scalars into TensorBoard event files, through ``torch.utils.tensorboard``.

    ``purge_step``: a resumed run's first step; events logged at or after it by the run
    before (past its checkpoint) are hidden by TensorBoard."""

    def __init__(self, logdir: Path, flush_secs: int = 10, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer: SummaryWriter | None = SummaryWriter(
            str(logdir), flush_secs=flush_secs, purge_step=purge_step
        )

    def add(self, values: Mapping[str, float], step: int) -> None:
        """One value per tag at ``step`` (ignored after :meth:`close`)."""
        if self._writer is None:
            return
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        """Flush and close the event file; idempotent."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()


class RunRecorder:
    """Where one run's progress goes: the display, the metrics rows (run directory and
    ``--metrics``), TensorBoard, and at the end the summary.

    Args:
        display: shows each snapshot.
        directory: the run directory, or ``None`` (``run_dir = ""``).
        metrics_path: another file for the metrics rows (``--metrics``).
        resume_step: the env step a resumed run continues from (``None``: a new run): the
            run directory's metrics rows are appended to, and TensorBoard purged from it.
    """

    def __init__(
        self,
        display: PlainDisplay | LiveDisplay,
        directory: RunDirectory | None = None,
        metrics_path: str | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.display = display
        self.directory = directory
        self._metrics: list[TextIO] = []
        self._tensorboard: TensorBoard | None = None
        try:
            resumed = resume_step is not None
            paths = [(directory.metrics, resumed)] if directory is not None else []
            paths += [(Path(metrics_path), False)] if metrics_path else []
            for path, append in paths:
                f = open(path, "a" if append else "w")  # noqa: SIM115 (closed in close())
                self._metrics.append(f)
            if directory is not None:
                self._tensorboard = TensorBoard(directory.tensorboard, purge_step=resume_step)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(
        cls,
        config: RunConfig,
        out: TextIO,
        metrics_path: str | None = None,
        resume: tuple[RunDirectory, int] | None = None,
    ) -> RunRecorder:
        """The records of a run of ``config``: its run directory (with the resolved config,
        its path printed to ``out``) unless ``config.run_dir`` is empty; with ``resume``
        (a run directory and the env step its checkpoint was taken at), that directory.

        Raises:
            ConfigError: when the run directory cannot be created.
        """
        directory = None
        step = None
        if resume is not None:
            directory, step = resume
            directory.write_config(config)
            print(f"run directory: {directory.path} (resumed)", file=out, flush=True)
        elif config.run_dir:
            directory = RunDirectory.create(config.run_dir, run_name(config))
            directory.write_config(config)
            print(f"run directory: {directory.path}", file=out, flush=True)
        title = f"tianji: {config.algorithm} on {config.env.id}"
        return cls(make_display(out, title), directory, metrics_path, step)

    def record(self, snapshot: Snapshot) -> None:
        """Show a snapshot and write its metrics row and TensorBoard scalars."""
        self.display.show(snapshot)
        line = json.dumps(metrics_row(snapshot)) + "\n"
        for f in self._metrics:
            f.write(line)
            f.flush()
        if self._tensorboard is not None:
            self._tensorboard.add(scalars(snapshot), snapshot.env_steps)

    def write_summary(self, summary: Mapping[str, Any], path: str | None = None) -> None:
        """The summary into the run directory and to ``path`` when given (atomically)."""
        if self.directory is not None:
            write_json_atomic(self.directory.summary, summary)
        if path:
            write_json_atomic(path, summary)

    def close(self) -> None:
        """Stop the display, close the metrics files, flush TensorBoard; idempotent."""
        self.display.close()
        files, self._metrics = self._metrics, []
        for f in files:
            f.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
