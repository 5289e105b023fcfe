"""A run's directory and records: resolved config, metrics rows, TensorBoard, summary.

Every ``tianji train`` (and ``tianji controller``) run gets its own directory
``<run_dir>/<name>-<YYYYmmdd-HHMMSS>/`` (``run_dir`` defaults to ``runs``)::

    config.json      the resolved run config (``tianji train`` accepts it as CONFIG)
    metrics.jsonl    one JSON row per progress interval (tianji.progress.metrics_row)
    tb/              TensorBoard event files: scalars per interval, step = env steps
    summary.json     the run's summary, written when it ends
    checkpoints/     reserved for checkpoints (not written yet)

:class:`RunRecorder` ties the records of one run together with its progress display; it is
opened before any service starts and closed on every exit path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from tianji.config import RunConfig, to_dict
from tianji.errors import ConfigError
from tianji.progress import (
    LiveDisplay,
    PlainDisplay,
    Snapshot,
    make_display,
    metrics_row,
    scalars,
)

__all__ = ["RunDirectory", "RunRecorder", "TensorBoard", "run_name", "write_json_atomic"]


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
                with contextlib.suppress(FileExistsError):
                    path.mkdir()  # atomic: exactly one run gets each name
                    return cls(path)
        except OSError as exc:
            why = f"a directory tianji can write ({exc})"
            raise ConfigError("run_dir", str(root), why) from None
        raise AssertionError("unreachable")  # pragma: no cover

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


class TensorBoard:
    """Scalars into TensorBoard event files, through ``torch.utils.tensorboard``."""

    def __init__(self, logdir: Path, flush_secs: int = 10) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer: SummaryWriter | None = SummaryWriter(str(logdir), flush_secs=flush_secs)

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
    """

    def __init__(
        self,
        display: PlainDisplay | LiveDisplay,
        directory: RunDirectory | None = None,
        metrics_path: str | None = None,
    ) -> None:
        self.display = display
        self.directory = directory
        self._metrics: list[TextIO] = []
        self._tensorboard: TensorBoard | None = None
        try:
            paths = [directory.metrics] if directory is not None else []
            paths += [Path(metrics_path)] if metrics_path else []
            for path in paths:
                self._metrics.append(open(path, "w"))  # noqa: SIM115 (closed in close())
            if directory is not None:
                self._tensorboard = TensorBoard(directory.tensorboard)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, config: RunConfig, out: TextIO, metrics_path: str | None = None) -> RunRecorder:
        """The records of a run of ``config``: its run directory (with the resolved config,
        its path printed to ``out``) unless ``config.run_dir`` is empty.

        Raises:
            ConfigError: when the run directory cannot be created.
        """
        directory = None
        if config.run_dir:
            directory = RunDirectory.create(config.run_dir, run_name(config))
            directory.write_config(config)
            print(f"run directory: {directory.path}", file=out, flush=True)
        title = f"tianji: {config.algorithm} on {config.env.id}"
        return cls(make_display(out, title), directory, metrics_path)

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
