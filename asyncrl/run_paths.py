"""A run's paths made absolute before its ``config.yaml`` is written (:func:`resolve_run_paths`).

Above :mod:`asyncrl.config_data` (the data files) and :mod:`asyncrl.reward.custom` (the reward file), which it uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.config_data import resolve_data_paths
from asyncrl.reward.custom import resolve_path


def resolve_run_paths(config: Any) -> None:
    """Make every relative path of a run's config absolute against this process's working directory, in place:
    ``data.train_files`` / ``data.val_files`` (:func:`asyncrl.config_data.resolve_data_paths`), ``custom_reward_function.path``
    (:func:`asyncrl.reward.custom.resolve_path`) and ``trainer.default_local_dir`` (``~`` expanded, as
    :class:`asyncrl.experiment.Experiment` reads it). Called by :meth:`asyncrl.experiment.Experiment.start` before
    ``config.yaml`` is written and the config reaches the actors, so the saved ``config.yaml`` re-runs from any
    directory: it reads the same files, and writes (and ``trainer.resume_mode=auto`` looks for checkpoints) in the
    same run directories."""
    resolve_data_paths(config.data)
    resolve_path(config)
    trainer = config.trainer
    if str(trainer.default_local_dir).strip():
        trainer.default_local_dir = str(Path(trainer.default_local_dir).expanduser().absolute())
