"""The CSV record of every logged metric (`run.loggers.metrics_logger`), whole across resumes."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only


class MetricsCSVLogger(Logger):
    """Writes every logged metric to one CSV file, from rank 0, one row per logging call (blank
    where a metric was not logged), `step` being Lightning's logger step (optimizer step - 1).

    A run that resumes from optimizer step N (`resume_step`) keeps the file's rows of steps
    1..N and appends; any other run starts the file anew. Lightning's CSVLogger would empty it.
    """

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.resume_step = resume_step
        self.rows: list[dict[str, Any]] = []
        self.columns: list[str] = []
        self.started = False

    @property
    def name(self) -> str:
        return self.path.parent.name

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return str(self.path.parent.parent)

    @property
    def log_dir(self) -> str:
        return str(self.path.parent)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass  # the run's config is in its run directory (.hydra/config.yaml) already

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        row = {k: float(v) for k, v in metrics.items()}
        row["step"] = len(self.rows) if step is None else int(step)
        self.rows.append(row)

    @rank_zero_only
    def save(self) -> None:
        if not self.rows:
            return
        if not self.started:  # the first write of this process
            self.started = True
            self._write([*self._kept_rows(), *self.rows])
        elif any(k not in self.columns for row in self.rows for k in row):
            self._write([*read_rows(self.path), *self.rows])
        else:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.columns).writerows(self.rows)
        self.rows = []

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        """The whole file anew, its columns every key of `rows` (sorted, as CSVLogger writes)."""
        self.columns = sorted({k for row in rows for k in row})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(rows)

    def _kept_rows(self) -> list[dict[str, Any]]:
        """A resumed run's earlier rows: those of logger steps below `resume_step`."""
        if not self.resume_step or not self.path.is_file():
            return []
        return [row for row in read_rows(self.path) if int(row["step"]) < self.resume_step]


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a metrics CSV, without its blank cells."""
    with Path(path).open(newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
