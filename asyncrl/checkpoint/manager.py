"""Checkpoint directories: atomic writes, the last K kept, and finding what to resume from.

Layout (verl's names where verl has one)::

    <run_dir>/checkpoints/
        latest_checkpointed_iteration.txt      the step of the newest complete checkpoint
        global_step_<N>/
            actor/huggingface/                 model weights + config + tokenizer (transformers / vLLM load it)
            actor/optim.pt, actor/rng.pt       optimizer, LR schedule, RNG states (engine-specific)
            trainer_state.json                 global_steps, param_version, counters, lag histogram
            rollouter_state.json               data position (epoch, offset), taken, counters, evals
            ledger.json                        outcome of every sample taken so far, by seq
            meta.json                          written last: its presence marks a complete checkpoint

A checkpoint is written into ``.tmp_global_step_<N>_<id>/`` and renamed into place, so a crash
mid-write leaves no half checkpoint under the final name; temp dirs of crashed writes are removed
at the next save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

from asyncrl.checkpoint.fingerprint import fingerprint_like, model_fingerprint
from asyncrl.run_names import run_name_pattern

logger = logging.getLogger(__name__)

LATEST = "latest_checkpointed_iteration.txt"
META = "meta.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or unreadable (the message names the path and the fix)."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    """Write JSON through a temp file and an atomic rename (fsynced)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None


class CheckpointManager:
    """Saves ``global_step_<N>`` directories under ``root`` and keeps the last ``max_to_keep``.

    Args:
        root: the checkpoints directory (``<run_dir>/checkpoints``).
        max_to_keep: how many complete checkpoints to keep (``None`` = all).
    """

    def __init__(self, root: str | Path, max_to_keep: Optional[int] = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    def save(self, step: int, write: Callable[[Path], dict]) -> Path:
        """Write a checkpoint of ``step`` atomically.

        Args:
            step: the trainer's ``global_steps``.
            write: ``write(tmp_dir) -> meta`` fills ``tmp_dir``; ``meta`` (a JSON-able dict) is
                written last as ``meta.json``.

        Returns:
            The final directory ``global_step_<step>``.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp_global_step_*"):  # leftovers of a crashed write
            shutil.rmtree(stale, ignore_errors=True)
        tmp = self.root / f".tmp_global_step_{step}_{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            meta = dict(write(tmp) or {})
            meta["global_steps"] = step
            write_json(tmp / META, meta)
            _fsync_dir(tmp)
            final = self.step_dir(step)
            if final.exists():  # re-saving a step (e.g. at stop right after a periodic save)
                old = self.root / f".tmp_replaced_{step}_{uuid.uuid4().hex[:8]}"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        (self.root / f".{LATEST}.tmp").write_text(str(step))
        os.replace(self.root / f".{LATEST}.tmp", self.root / LATEST)
        self._prune()
        logger.info("checkpoint saved: %s", final)
        return final

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints (``meta.json`` present), ascending."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / META).exists():
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> Optional[Path]:
        """The newest complete checkpoint, or ``None``."""
        steps = self.steps()
        return self.step_dir(steps[-1]) if steps else None

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        for step in self.steps()[:-self.max_to_keep]:
            shutil.rmtree(self.step_dir(step), ignore_errors=True)
            logger.info("checkpoint removed (max_actor_ckpt_to_keep=%d): global_step_%d", self.max_to_keep, step)


def check_checkpoint(path: str | Path) -> Path:
    """Validate a ``global_step_<N>`` directory; returns it as a Path.

    Raises:
        CheckpointError: it does not exist or is incomplete (no ``meta.json``).
    """
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {p} does not exist (expected <run dir>/checkpoints/global_step_N)")
    if not (p / META).exists():
        raise CheckpointError(f"checkpoint {p} is incomplete (no {META}); resume from an earlier global_step_N")
    return p


def find_resume_checkpoint(default_local_dir: str | Path, experiment_name: str, seed: int, resume_mode: str,
                           resume_from_path: Optional[str] = None, source: Optional[list] = None,
                           model: Optional[str] = None, task: Optional[str] = None) -> Optional[Path]:
    """The checkpoint a run resumes from (verl's ``trainer.resume_mode`` semantics).

    Args:
        default_local_dir: where run directories live (``trainer.default_local_dir``).
        experiment_name, seed: ``auto`` looks at the run directories of exactly this name and seed,
            ``<experiment_name>__<seed>__<YYYYmmdd-HHMMSS>`` (:func:`asyncrl.run_names.run_name_pattern`): not those
            of another experiment whose name begins ``<experiment_name>__<seed>__``.
        resume_mode: ``disable`` (``None``), ``resume_path`` (``resume_from_path``), or ``auto``
            (the newest complete checkpoint among those run directories, if any, of this run: see below).
        resume_from_path: a ``global_step_<N>`` directory.
        source: the training data (:func:`asyncrl.data.dataset.train_source`): ``auto`` passes over a checkpoint whose
            data position names other data (a WARNING names it), since two runs on other data can share a name (the
            recipe's, a given ``trainer.experiment_name``, or two files of one name): they resumed each other's
            weights. ``None``, or a checkpoint that saved no source: not checked. ``resume_path`` is never checked
            (its data-order WARNING says what differs).
        model, task: ``actor_rollout_ref.model.path`` and ``data.task``: ``auto`` passes over a checkpoint whose run
            used another model or task (a WARNING names both), as recorded in the checkpoint's ``config.yaml`` (or, for
            one without, its run directory's): two recipes on one data file shared a run name until session 33, and
            the second resumed the first's weights, another model. ``None``, or nothing recorded: not checked. The
            model is compared by its fingerprint (:mod:`asyncrl.checkpoint.fingerprint`, in ``meta.json``) where the
            checkpoint recorded one and ``model`` is a readable folder, so a moved or renamed model folder is the same
            model (a WARNING says it moved); else by its path.

    Raises:
        CheckpointError: ``resume_path`` names a missing or incomplete checkpoint.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        return check_checkpoint(resume_from_path or "")
    best: tuple[float, Path] | None = None
    base = Path(default_local_dir)
    if not base.is_dir():
        return None
    pattern = run_name_pattern(experiment_name, seed)
    fingerprint = model_fingerprint(model) if model is not None else None
    for run in base.iterdir():
        if not pattern.fullmatch(run.name) or not run.is_dir():
            continue
        latest = CheckpointManager(run / "checkpoints").latest()
        if latest is None:
            continue
        other = other_run(latest, source, model, task, fingerprint)
        if other:
            logger.warning("trainer.resume_mode=auto: not resuming %s: %s (to continue it anyway: "
                           "trainer.resume_mode=resume_path trainer.resume_from_path=%s)", latest, other, latest)
            continue
        key = (latest / META).stat().st_mtime
        if best is None or key > best[0]:
            best = (key, latest)
    return best[1] if best else None


def other_run(ckpt: Path, source: Optional[list] = None, model: Optional[str] = None,
              task: Optional[str] = None, fingerprint: Optional[str] = None) -> str:
    """Why ``ckpt`` is not a checkpoint of a run on ``source`` with ``model`` and ``task`` (``"it trained on X, this
    run on Y"``, joined by ``"; "``), or ``""`` when nothing recorded differs (what was not recorded, or is ``None``
    here, is not checked). ``fingerprint`` (of ``model``'s folder, :func:`model_fingerprint`) decides the model where
    the checkpoint recorded one too: a folder moved since is the same model (logged), another model at the same path
    is not."""
    why = []
    trained_on = _trained_on(ckpt) if source is not None else None
    if trained_on is not None and trained_on != source:
        why.append(f"it trained on {trained_on}, this run on {source}")
    recorded = _run_config(ckpt) if (model, task) != (None, None) else {}

    def was(key: str) -> Optional[str]:  # the recorded value of a dotted key, if a string
        value: Any = recorded
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value if isinstance(value, str) else None

    was_model, was_task = was("actor_rollout_ref.model.path"), was("data.task")
    was_print = _recorded_fingerprint(ckpt) if model is not None else None
    if model is not None and was_print is not None:  # by the recipe it was made with (a v1 of an older checkpoint)
        fingerprint = fingerprint_like(was_print, model, fingerprint)
    if model is not None and was_print is not None and fingerprint is not None:
        if was_print != fingerprint:
            why.append(f"its run trained another model (actor_rollout_ref.model.path={was_model or '?'}; this run's "
                       f"{model} has another config.json or weights)")
        elif was_model is not None and not _same_path(was_model, model):
            logger.warning("trainer.resume_mode=auto: %s: its model folder %s is now %s (the same config.json and "
                           "weights): the same model", ckpt, was_model, model)
    elif model is not None and was_model is not None and not _same_path(was_model, model):
        why.append(f"its run used actor_rollout_ref.model.path={was_model}, this run {model}" + (
            "" if was_print is not None else " (the checkpoint records no fingerprint of its model, written before "
            "they were: a moved model folder looks like another model)"))
    if task is not None and was_task is not None and was_task != task:
        why.append(f"its run used data.task={was_task}, this run {task}")
    return "; ".join(why)


def _recorded_fingerprint(ckpt: Path) -> Optional[str]:
    """The model fingerprint the checkpoint's ``meta.json`` records, or ``None`` (written before they were)."""
    try:
        value = read_json(ckpt / META).get("model_fingerprint")
    except (CheckpointError, AttributeError):  # unreadable, or not a mapping: the resume itself reports that
        return None
    return value if isinstance(value, str) else None


def _same_path(a: str, b: str) -> bool:
    """The same model path: as written, or the same absolute path from here (``~`` expanded)."""
    if a == b:
        return True
    try:
        return Path(a).expanduser().absolute() == Path(b).expanduser().absolute()
    except (OSError, ValueError, RuntimeError):
        return False


def _run_config(ckpt: Path) -> dict:
    """The config a checkpoint's run used: its own ``config.yaml`` (every checkpoint the trainer writes holds one), else
    its run directory's (``<run>/checkpoints/global_step_N``); ``{}`` when neither can be read."""
    import yaml

    for path in (ckpt / "config.yaml", ckpt.parent.parent / "config.yaml"):
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if isinstance(loaded, dict):
            return loaded
    return {}


def _trained_on(ckpt: Path) -> Optional[list]:
    """The training data a checkpoint's data position is in (``rollouter_state.json``'s ``position.source``), or
    ``None`` when it saved none (older checkpoints) or cannot be read (the resume itself reports that)."""
    try:
        return json.loads((ckpt / "rollouter_state.json").read_text())["position"].get("source")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
