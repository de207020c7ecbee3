"""Streamed metrics (issue 12 item 6): metrics.csv appended and flushed each step, new columns,
resume truncation, and the tensorboard / wandb (offline) loggers through their own libraries."""

from __future__ import annotations

import csv
import logging

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.tracking import MetricsCSV, Tracking, read_metrics_csv, run_id


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_is_on_disk_after_every_row_and_grows_columns(tmp_path):
    m = MetricsCSV(tmp_path / "metrics.csv")
    m.append({"step": 1, "reward/mean": 0.5})
    assert rows_of(tmp_path / "metrics.csv") == [{"step": "1", "reward/mean": "0.5"}]  # no close needed
    m.append({"step": 2, "reward/mean": 0.25, "sync/total_s": 0.1})  # a new column: header rewritten
    got = rows_of(tmp_path / "metrics.csv")
    assert got == [{"step": "1", "reward/mean": "0.5", "sync/total_s": ""},
                   {"step": "2", "reward/mean": "0.25", "sync/total_s": "0.1"}]
    m.append({"step": 3, "reward/mean": 1.0})
    assert [r["step"] for r in read_metrics_csv(tmp_path / "metrics.csv")] == [1, 2, 3]
    assert not list(tmp_path.glob("*.tmp"))


def test_csv_resume_keeps_rows_up_to_the_checkpoint_step(tmp_path):
    m = MetricsCSV(tmp_path / "metrics.csv")
    for s in range(1, 6):
        m.append({"step": s, "x": s * 1.5})
    m2 = MetricsCSV(tmp_path / "metrics.csv", resume_step=3)  # steps 4, 5 were lost with the crash
    m2.append({"step": 4, "x": 0.0})
    assert [(r["step"], r["x"]) for r in read_metrics_csv(tmp_path / "metrics.csv")] == \
        [(1, 1.5), (2, 3.0), (3, 4.5), (4, 0.0)]
    MetricsCSV(tmp_path / "metrics.csv")  # a fresh run truncates
    assert read_metrics_csv(tmp_path / "metrics.csv") == []


def test_a_run_without_a_step_has_the_header_of_the_step_columns(tmp_path):
    """A run that completed no step left an empty metrics.csv (``pandas.read_csv`` raises on it): the columns every
    step row has are its header from the start; a resumed file keeps its own, with the missing ones added."""
    import pandas as pd

    from asyncrl.metrics import write_run_artifacts
    from asyncrl.tracking import STEP_COLUMNS

    Tracking(tmp_path / "a", ["console"], columns=STEP_COLUMNS).close()
    assert list(pd.read_csv(tmp_path / "a" / "metrics.csv").columns) == list(STEP_COLUMNS)
    m = MetricsCSV(tmp_path / "b.csv")
    m.append({"step": 1, "x": 2.0})
    MetricsCSV(tmp_path / "b.csv", resume_step=1, columns=("step", "y")).append({"step": 2, "y": 1.0})
    assert list(pd.read_csv(tmp_path / "b.csv").columns) == ["step", "x", "y"]
    assert read_metrics_csv(tmp_path / "b.csv") == [{"step": 1, "x": 2.0}, {"step": 2, "y": 1.0}]
    write_run_artifacts(tmp_path / "c", [], [], "{}", {})  # the artifact writer's table too (not streamed)
    assert list(pd.read_csv(tmp_path / "c" / "metrics.csv").columns) == list(STEP_COLUMNS)
    from asyncrl.metrics import EVAL_COLUMNS  # no evaluation (data.train_files without val_files): eval.csv's header

    assert list(pd.read_csv(tmp_path / "c" / "eval.csv").columns) == list(EVAL_COLUMNS)


def test_tracking_console_tensorboard_and_wandb_offline(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = Tracking(tmp_path, ["console", "tensorboard", "wandb"], "asyncrl-test", "run_a", {"a": 1},
                 wandb_mode="offline", run_id=run_id("run_a"))
    with caplog.at_level(logging.INFO, logger="asyncrl.console"):
        for s in range(1, 4):
            t.log({"step": s, "param_version": s, "reward/mean": 0.1 * s, "note": "text is skipped"})
    t.close()
    assert "step 3 | param_version 3 | reward/mean 0.3" in caplog.text
    assert t.history[-1]["step"] == 3 and len(read_metrics_csv(tmp_path / "metrics.csv")) == 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(tmp_path / "tensorboard"))
    ev.Reload()
    assert [(e.step, round(e.value, 4)) for e in ev.Scalars("reward/mean")] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "W&B offline run written without network"


def test_logger_config_takes_verl_values():
    assert load_config(overrides=["trainer.logger=[console,tensorboard,wandb]"]).trainer.logger == \
        ["console", "tensorboard", "wandb"]
    assert load_config(overrides=["trainer.logger=console"]).trainer.logger == ["console"]
    with pytest.raises(ConfigError, match="unknown logger.*mlflow.*valid"):
        load_config(overrides=["trainer.logger=[mlflow]"])
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(overrides=["trainer.wandb_mode=sometimes"])
