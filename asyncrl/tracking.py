"""Streamed metrics: each trainer step's row is written as it is logged, so a crash keeps the curve.

::

    FullyAsyncTrainer._log_step(row) ──> Tracking.log(row)
        ├─> history               in memory; Experiment.status()["trainer"]["history"] -> dashboard
        ├─> MetricsCSV            <run_dir>/metrics.csv, appended + flushed every step
        └─> trainer.logger        console  : one INFO line per step (logger ``asyncrl.console``)
                                  tensorboard: SummaryWriter(<run_dir>/tensorboard), flushed every step
                                  wandb    : wandb.init(dir=<run_dir>, mode=trainer.wandb_mode).log(row)

The dashboard, ``metrics.csv`` and the loggers read the same rows (one stream). ``trainer.logger``
takes verl's list values. On resume the CSV keeps the rows up to the checkpoint's step and appends
after them; W&B resumes the same run id. Rows are dicts ``{"step": int, "param_version": int,
<metric name>: float, ...}`` with names from :mod:`asyncrl.metrics`.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)
console_logger = logging.getLogger("asyncrl.console")

LOGGERS = ("console", "tensorboard", "wandb")
"""Values accepted in ``trainer.logger`` (verl's names)."""

STEP_COLUMNS = ("step", "param_version", "time_s", "reward/mean", "response_length/mean", "staleness/lag_mean",
                "staleness/lag_max", "trainer/idle_ratio", "rollouter/partial_count", "rollouter/partial_max_span",
                "rollouter/processing_p50_s", "rollouter/processing_p90_s", "rollouter/processing_p99_s",
                "trainer/dropped_stale", "trainer/dropped_dapo_no_signal")
"""The columns every trainer step's row has, in this order (``TrainerBookkeeping._log_step`` builds its row from
them): the header of a run's ``metrics.csv`` from its start, so a run that completes no step still has one (a reader
such as ``pandas.read_csv`` fails on an empty file). The others (``actor/*``, ``sync/*``, ``timing/*`` ...) depend on
the algorithm and are added as rows bring them."""


class MetricsCSV:
    """``metrics.csv`` written row by row: appended and flushed each step.

    A row with a column not seen before (e.g. the first ``sync/*`` timings) rewrites the file once
    with the wider header, through a temp file and an atomic rename; earlier rows get empty cells.

    Args:
        path: the CSV file.
        resume_step: keep the existing rows with ``step <= resume_step`` (resume from a checkpoint
            at that step); ``None`` starts a new file.
        columns: the header a file starts with (before any row; e.g. :data:`STEP_COLUMNS`); a resumed file keeps
            its own header, with any of these it lacks added after it.
    """

    def __init__(self, path: Path, resume_step: Optional[int] = None, columns: tuple[str, ...] = ()):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] = []
        rows: list[dict] = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or [])
                rows = [r for r in reader if r.get("step") and int(float(r["step"])) <= resume_step]
        self.columns += [c for c in columns if c not in self.columns]
        self._rewrite(rows)

    def previous_rows(self) -> list[dict]:
        """The rows already in the file (see :func:`read_metrics_csv`)."""
        return read_metrics_csv(self.path)

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, self.columns, restval="")
            if self.columns:
                w.writeheader()
            w.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, row: dict[str, Any]) -> None:
        """Write one row now (flushed, so a crash right after keeps it)."""
        new = [k for k in row if k not in self.columns]
        if new:
            with self.path.open(newline="") as f:
                old = list(csv.DictReader(f)) if self.columns else []  # raw cells, rewritten verbatim
            self.columns += new
            self._rewrite(old)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns, restval="").writerow(row)
            f.flush()


def _number(v: str) -> Any:
    try:
        x = float(v)
    except ValueError:
        return v
    return int(x) if x.is_integer() and "." not in v and "e" not in v.lower() else x


class Tracking:
    """All the sinks of the metric stream (verl's ``Tracking``, with a CSV that is always on).

    Args:
        run_dir: run artifact directory (``metrics.csv``, ``tensorboard/``, ``wandb/`` go there).
        backends: ``trainer.logger`` values (subset of :data:`LOGGERS`).
        project_name, experiment_name: W&B project / run name (``trainer.project_name`` /
            the run's name).
        config: the resolved config as a plain dict (W&B run config).
        resume_step: continue a run from a checkpoint at this step (see :class:`MetricsCSV`).
        wandb_mode: ``online`` | ``offline`` | ``disabled``; ``None`` = ``$WANDB_MODE`` or online.
        run_id: stable id of the run (W&B ``id``, so a resumed run continues the same W&B run).
        columns: ``metrics.csv``'s header before any row (see :class:`MetricsCSV`; a run passes :data:`STEP_COLUMNS`).

    Raises:
        ValueError: an unknown backend name (the message lists the valid ones).
        ImportError: ``tensorboard`` / ``wandb`` requested but not installed (names the extra).
    """

    def __init__(self, run_dir: str | Path, backends: list[str] | tuple[str, ...] = ("console",),
                 project_name: str = "asyncrl", experiment_name: str = "run", config: Optional[dict] = None,
                 resume_step: Optional[int] = None, wandb_mode: Optional[str] = None,
                 run_id: Optional[str] = None, columns: tuple[str, ...] = ()):
        unknown = [b for b in backends if b not in LOGGERS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {unknown}; valid: {list(LOGGERS)}")
        self.run_dir = Path(run_dir)
        self.backends = list(dict.fromkeys(backends))
        self.csv = MetricsCSV(self.run_dir / "metrics.csv", resume_step, columns)
        self.history: list[dict] = self.csv.previous_rows() if resume_step is not None else []
        self._tb = self._wandb = None
        if "tensorboard" in self.backends:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError("trainer.logger=tensorboard needs the tensorboard package: "
                                  "pip install 'asyncrl[loggers]'") from e
            # purge_step drops events after the checkpoint, as the CSV drops its rows
            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"),
                                     purge_step=None if resume_step is None else resume_step + 1)
        if "wandb" in self.backends:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("trainer.logger=wandb needs the wandb package: pip install 'asyncrl[loggers]'") from e
            mode = wandb_mode or os.environ.get("WANDB_MODE") or "online"
            self._wandb = wandb.init(project=project_name, name=experiment_name, id=run_id, config=config or {},
                                     dir=str(self.run_dir), mode=mode, resume="allow" if resume_step is not None else None,
                                     reinit="create_new")

    def log(self, row: dict[str, Any]) -> None:
        """Append one step's row to every sink (``row["step"]`` is the x axis)."""
        self.history.append(row)
        self.csv.append(row)
        step = int(row["step"])
        scalars = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k != "step" and math.isfinite(float(v))}
        if "console" in self.backends:
            console_logger.info("step %d | %s", step, " | ".join(f"{k} {_fmt(v)}" for k, v in scalars.items()))
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        """Flush and close the loggers (idempotent)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def run_id(name: str) -> str:
    """A stable W&B run id for a run directory name (the same id when the run resumes)."""
    import hashlib

    return hashlib.sha1(name.encode()).hexdigest()[:16]


def read_metrics_csv(path: str | Path) -> list[dict]:
    """Rows of a ``metrics.csv`` with numbers parsed and empty cells left out (e.g. to plot a run
    that crashed, or to reload the history on resume)."""
    with Path(path).open(newline="") as f:
        return [{k: _number(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
