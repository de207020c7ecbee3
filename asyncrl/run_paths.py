"""A run's paths made absolute before its ``config.yaml`` is written (:func:`resolve_run_paths`).

Above :mod:`asyncrl.config_data` (the data files) and :mod:`asyncrl.reward.custom` (the reward file), which it uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from asyncrl.config_data import resolve_data_paths
from asyncrl.reward.custom import resolve_path

MODEL_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "critic.model.path")
"""Keys naming a model (or tokenizer) directory: made absolute where they name one here (:func:`local_model_path`)."""

LOCAL_KEYS = ("trainer.default_local_dir", "trainer.resume_from_path",
              "actor_rollout_ref.rollout.agent.sandbox.trials_dir",
              "actor_rollout_ref.rollout.agent.sandbox.harbor_python")
"""Keys that name a path on this machine whatever they hold: always made absolute (``~`` expanded)."""


def local_model_path(path: Optional[str]) -> Optional[str]:
    """``path`` made absolute (``~`` expanded) where it names a file or directory from here (``models/m1``), else as
    it is: a hub-style name (``Qwen/Qwen2.5-0.5B`` that is no local directory) is kept for what reads it (transformers
    and vLLM take a path that exists as a local model, any other text as a hub name; asyncrl's preflight,
    :func:`asyncrl.config_ranges.check_local_resources`, refuses a missing one), and so is ``None`` or an empty one."""
    if not path or not str(path).strip():
        return path
    local = Path(path).expanduser()
    return str(local.absolute()) if local.exists() else path


def _absolute(path: Optional[str]) -> Optional[str]:
    return str(Path(path).expanduser().absolute()) if path and str(path).strip() else path


def _section(config: Any, key: str) -> tuple[Any, str]:
    *parents, name = key.split(".")
    for part in parents:
        config = getattr(config, part)
    return config, name


def resolve_run_paths(config: Any) -> None:
    """Make every relative path of a run's config absolute against this process's working directory, in place:
    ``data.train_files`` / ``data.val_files`` (:func:`asyncrl.config_data.resolve_data_paths`), ``custom_reward_function.path``
    (:func:`asyncrl.reward.custom.resolve_path`), the model directories of :data:`MODEL_KEYS` where they are local ones
    (:func:`local_model_path`: a hub-style name is kept) and the paths of :data:`LOCAL_KEYS`
    (``trainer.default_local_dir``, ``~`` expanded, as :class:`asyncrl.experiment.Experiment` reads it). Called by
    :meth:`asyncrl.experiment.Experiment.start` before ``config.yaml`` is written and the config reaches the actors,
    so the saved ``config.yaml`` re-runs from any directory: it reads the same files and model, and writes (and
    ``trainer.resume_mode=auto`` looks for checkpoints) in the same run directories."""
    resolve_data_paths(config.data)
    resolve_path(config)
    for keys, absolute in ((MODEL_KEYS, local_model_path), (LOCAL_KEYS, _absolute)):
        for key in keys:
            section, name = _section(config, key)
            setattr(section, name, absolute(getattr(section, name)))
