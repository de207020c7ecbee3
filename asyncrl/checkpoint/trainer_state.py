"""Save and restore a FullyAsyncTrainer run: the pieces of one checkpoint and who owns each.

::

    FullyAsyncTrainer.save_checkpoint()   (between steps, under the weights lock)
        rollouter.checkpoint_state()      data position, taken, counters, evals, ledger parts (atomic)
        + trainer ledger                  -> ledger.json: terminal outcomes by seq + seqs in flight
        engine.save_checkpoint(actor/)    HF weights, optimizer, LR schedule, RNG
        trainer_state.json                global_steps, param_version, synced?, counters, lag histogram
        CheckpointManager.save            temp dir -> rename; keep the last K
    resume: Experiment finds the checkpoint -> trainer restores engine + counters,
            rollouter restores position + counters (in-flight seqs become dropped/in_flight_at_checkpoint),
            the trainer pushes the checkpoint weights to the replicas (``resume_version``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from asyncrl.accounting import checkpoint_ledger
from asyncrl.checkpoint.fingerprint import model_fingerprint
from asyncrl.checkpoint.manager import CheckpointError, read_json, write_json

if TYPE_CHECKING:
    from asyncrl.data.sampler import ResumableSampler

logger = logging.getLogger(__name__)

FORMAT = 1
LENGTH_COUNTERS = ("response_length_counts", "gradient_length_counts", "stale_length_counts")
"""The trainer's rows-by-response-length counters (``{tokens: rows}``), saved so a resumed run's summary counts the
whole run (a checkpoint written before session 21 has none: they restart empty)."""


def trainer_state(tr: Any) -> dict:
    """The trainer's counters (JSON-able)."""
    return {"global_steps": tr.global_steps, "param_version": tr.param_version,
            "synced": tr.synced_step == tr.global_steps, "trained": tr.trained, "dropped": dict(tr.dropped),
            "lag_counts": {str(k): v for k, v in tr.lag_counts.items()}, "idle_s": tr.idle_s,
            "updates": getattr(tr.engine, "updates", None), "saved_at": time.time(),
            # update-lag bookkeeping (staleness/update_lag_*): actor updates done, and baked into each version
            "actor_updates": tr.updates, "updates_at_version": {str(v): n for v, n in tr.updates_at_version.items()},
            **{name: {str(k): v for k, v in getattr(tr, name).items()} for name in LENGTH_COUNTERS}}


async def write_checkpoint(tr: Any, final: bool = False) -> Path:
    """Write ``global_step_<tr.global_steps>`` for a trainer between steps (``final``: the run has
    stopped); returns its path."""
    from asyncrl.config import to_yaml

    ro = await tr.rollouter.checkpoint_state.remote()
    ledger = checkpoint_ledger(ro["taken"], ro.pop("ledger_parts") + [tr.ledger.to_dict()], final)
    state = trainer_state(tr)
    cfg = tr.cfg

    def write(tmp: Path) -> dict:
        model = cfg.actor_rollout_ref.model  # the tokenizer files come from where the run reads them
        tr.engine.save_checkpoint(tmp / "actor", source_model_dir=model.tokenizer_path or model.path)
        if getattr(tr, "critic", None) is not None:  # GAE's value model: weights + its own optimizer
            tr.critic.save_checkpoint(tmp / "critic")
        write_json(tmp / "trainer_state.json", state)
        write_json(tmp / "rollouter_state.json", ro)
        write_json(tmp / "ledger.json", ledger)
        (tmp / "config.yaml").write_text(to_yaml(cfg))
        return {"format": FORMAT, "param_version": state["param_version"], "synced": state["synced"],
                "taken": ledger["taken"], "in_flight": len(ledger["in_flight"]), "time": time.time(),
                "model_fingerprint": model_fingerprint(model.path)}  # auto-resume knows the model if it moves

    return await asyncio.to_thread(tr.checkpoints.save, tr.global_steps, write)


def restore_trainer(tr: Any, ckpt: Path) -> None:
    """Counters and engine state: weights, optimizer, LR schedule, RNG (the engine was built from the
    base model, which stays the KL reference)."""
    st = read_json(Path(ckpt) / "trainer_state.json")
    tr.engine.load_checkpoint(Path(ckpt) / "actor", load_weights=True)
    if getattr(tr, "critic", None) is not None:
        if not (Path(ckpt) / "critic").is_dir():
            raise CheckpointError(f"{ckpt} has no critic/ (saved without algorithm.adv_estimator=gae); "
                                  "resume with the estimator it was saved with, or trainer.resume_mode=disable")
        tr.critic.load_checkpoint(Path(ckpt) / "critic", load_weights=True)
    restore_counters(tr, st)


def restore_counters(tr: Any, st: dict) -> None:
    """The trainer's counters from :func:`trainer_state`'s dict (the engine state is restored apart)."""
    tr.global_steps = tr.synced_step = st["global_steps"]
    tr.param_version = st["param_version"]
    if not st["synced"]:  # the weights are newer than the replicas' version: they become a new one
        tr.param_version += 1
    tr.trained = st["trained"]
    tr.dropped = collections.Counter(st["dropped"])
    tr.lag_counts = collections.Counter({int(k): v for k, v in st["lag_counts"].items()})
    for name in LENGTH_COUNTERS:
        setattr(tr, name, collections.Counter({int(k): v for k, v in st.get(name, {}).items()}))
    tr.idle_s = st["idle_s"]
    restore_update_lag(tr, st)


def restore_update_lag(tr: Any, st: dict) -> None:
    """The update-lag counters continue: actor updates done and the updates baked into each version.

    ``tr.param_version`` is the version the restored weights are served as (one more than saved when the
    checkpoint fell between syncs): that version holds every update done so far. A checkpoint written
    before these keys existed restarts the table at that version with the engine's update count.
    """
    if "actor_updates" in st:
        tr.updates = int(st["actor_updates"])
        tr.updates_at_version = {int(v): int(n) for v, n in st["updates_at_version"].items()}
    else:  # format 1 without the table: the engine's optimizer updates are the actor's
        tr.updates, tr.updates_at_version = int(st.get("updates") or 0), {}
    tr.updates_at_version[tr.param_version] = tr.updates


def rollouter_state(ro: Any) -> dict:
    """A rollouter's part of a checkpoint (``rollouter_state.json`` + its ledger parts)."""
    return {"taken": ro.counts["taken"], "enqueued": ro.counts["enqueued"], "position": ro.sampler.state_dict(),
            "param_version": ro.param_version, "dropped": dict(ro.dropped), "failed": dict(ro.failed),
            "eval_history": list(ro.eval_history), "ledger_parts": ro.ledger_parts(), "too_long": too_long_state(ro)}


def prompt_key(row: dict) -> str:
    """What a row's rendered prompt is made of (its messages and tools), hashed: 16 hex digits."""
    import hashlib
    import json

    text = json.dumps([row["prompt"], row.get("tools")], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _length_rule(cfg: Any) -> dict:
    model = cfg.actor_rollout_ref.model
    return {"max_prompt_length": cfg.data.max_prompt_length, "tokenizer": str(model.tokenizer_path or model.path)}


def too_long_state(ro: Any) -> dict:
    """The rollouter's rows dropped as longer than ``data.max_prompt_length`` (``ro.too_long``, row indices), keyed so
    a resume on other data does not take them for other rows: ``{"max_prompt_length": int, "tokenizer": str,
    "rows": {str(index): prompt_key(row)}}`` (JSON-able; see :func:`restore_too_long`)."""
    return {**_length_rule(ro.cfg), "rows": {str(i): prompt_key(ro.train_rows[i]) for i in sorted(ro.too_long)}}


def restore_too_long(ro: Any, saved: dict) -> None:
    """Put back the too-long rows of :func:`too_long_state` that are still too long: those whose row at the same
    index has the same prompt, under the same ``data.max_prompt_length`` and tokenizer (another limit or tokenizer
    renders other lengths: none is kept). Rows not kept are found again when taken (one ``prompt_too_long`` drop
    each); a row index is no row's identity once the data changed, which is why the indices are keyed."""
    if {k: saved.get(k) for k in ("max_prompt_length", "tokenizer")} != _length_rule(ro.cfg):
        return
    rows = ro.train_rows
    ro.too_long.update(i for i, key in ((int(k), v) for k, v in saved.get("rows", {}).items())
                       if i < len(rows) and prompt_key(rows[i]) == key)


def restore_rollouter(ro: Any, state: dict) -> None:
    """Inverse of :func:`rollouter_state` given :func:`rollouter_resume`'s dict: the samples in
    flight at the checkpoint become ``dropped/in_flight_at_checkpoint``; the too-long rows still too long on this
    data come back (:func:`restore_too_long`)."""
    from asyncrl.accounting import Ledger
    from asyncrl.metrics import renamed

    ro.counts["taken"], ro.counts["enqueued"] = state["taken"], state["enqueued"]
    # other data (rows, files) than the checkpoint's: the driver's WARNING (resume_data_order, at preflight)
    ro.sampler.restore(state["position"], warn=False)
    ro.dropped.update(state["dropped"])
    ro.failed.update(state["failed"])
    ro.eval_history = [renamed(row) for row in state["eval_history"]]  # old names read under the new
    ro.param_version = state["param_version"]
    if "too_long" in state:  # a checkpoint from before it was saved: the rows are found again when taken
        restore_too_long(ro, state["too_long"])
    ro.restored = Ledger(state["ledger"]["outcomes"])
    if state["ledger"]["in_flight"]:
        ro.dropped["in_flight_at_checkpoint"] += len(state["ledger"]["in_flight"])
        ro.restored.extend("dropped/in_flight_at_checkpoint", state["ledger"]["in_flight"])


def data_sampler(cfg: Any, rows: int) -> ResumableSampler:
    """The rollouter's data order over ``rows`` training rows (``trainer.seed``, ``data.shuffle``, and the source that
    tells a resume on other data, :func:`asyncrl.data.dataset.train_source`), at the first row."""
    from asyncrl.data.dataset import train_source
    from asyncrl.data.sampler import ResumableSampler

    return ResumableSampler(rows, cfg.trainer.seed, cfg.data.shuffle, source=train_source(cfg.data))


def resume_data_order(ckpt: Path, cfg: Any, rows: int) -> ResumableSampler:
    """Where a resume from ``ckpt`` on ``rows`` training rows takes up the data order, logging the WARNING that the data
    is not the checkpoint's (another row count restarts the epoch; other files, seed or shuffle keep a position that
    may mean other rows; see :meth:`~asyncrl.data.sampler.ResumableSampler.restore`). Called by
    :meth:`asyncrl.experiment.Experiment.preflight`, so a start and ``asyncrl train --dry-run`` say it alike, in the
    driver; the rollouter restores the same position silently.

    Raises:
        asyncrl.checkpoint.CheckpointError: an unreadable ``rollouter_state.json``.
    """
    sampler = data_sampler(cfg, rows)
    sampler.restore(read_json(Path(ckpt) / "rollouter_state.json")["position"])
    return sampler


def rollouter_resume(ckpt: Path) -> dict:
    """The ``resume`` argument of :class:`~asyncrl.rollouter.FullyAsyncRollouter`."""
    state = read_json(Path(ckpt) / "rollouter_state.json")
    state["ledger"] = read_json(Path(ckpt) / "ledger.json")
    state["param_version"] = resume_version(ckpt)
    return state


def resume_version(ckpt: Path) -> int:
    """The parameter version the replicas get the checkpoint's weights as."""
    st = read_json(Path(ckpt) / "trainer_state.json")
    return st["param_version"] + (0 if st["synced"] else 1)


class CheckpointedRollouter:
    """A rollouter's per-sample ledger and its part of a checkpoint (mixed into
    :class:`~asyncrl.rollouter.FullyAsyncRollouter`; uses its ``counts``, ``dropped``, ``failed``,
    ``ledger`` and ``restored``)."""

    cfg: Any
    counts: collections.Counter
    dropped: collections.Counter
    failed: collections.Counter
    ledger: Any
    restored: Any

    def _init_ledger(self, rows: int, resume: Optional[dict]) -> None:
        from asyncrl.accounting import Ledger

        self.ledger = Ledger()  # outcomes of the samples taken by this process, by seq
        self.restored = Ledger()  # outcomes before the checkpoint this run resumed from
        self.sampler = data_sampler(self.cfg, rows)
        self.started_at: dict[int, float] = {}  # seq -> start time of the samples generating now
        if resume is not None:
            restore_rollouter(self, resume)

    def _drop(self, reason: str, seq: int, count: bool = True) -> None:
        if count:
            self.dropped[reason] += 1
        self.ledger.record(f"dropped/{reason}", seq)

    def _fail(self, reason: str, seq: int) -> None:
        self.failed[reason] += 1
        self.ledger.record(f"failed/{reason}", seq)

    def checkpoint_state(self) -> dict:
        """Data position, ``taken``, counters, evaluations and ledger parts, taken atomically (one
        call on the actor's loop); see :func:`rollouter_state`."""
        return rollouter_state(self)

    def taken(self) -> int:
        return self.counts["taken"]

    def ledger_parts(self) -> list[dict]:
        """``[outcomes before the resume, outcomes since]`` as ``{outcome: [seq, ...]}``."""
        return [self.restored.to_dict(), self.ledger.to_dict()]

    async def funnel_state(self) -> dict:
        """What the hang watchdog diagnoses (see :func:`asyncrl.watchdog.rollouter_funnel_state`)."""
        from asyncrl.watchdog import rollouter_funnel_state

        return await rollouter_funnel_state(self)


class CheckpointedRun:
    """The trainer's run directory: metric stream, checkpoints, ledger and the watchdog's view
    (mixed into :class:`~asyncrl.trainer.fully_async_trainer.FullyAsyncTrainer`)."""

    def _open_run_dir(self, run_dir: Path, resume: bool) -> None:
        from asyncrl.checkpoint import CheckpointManager
        from asyncrl.config import to_dict
        from asyncrl.tracking import STEP_COLUMNS, Tracking, run_id

        tr = self.cfg.trainer
        self.checkpoints = CheckpointManager(run_dir / "checkpoints", tr.max_actor_ckpt_to_keep)
        self.tracking = Tracking(run_dir, tr.logger, tr.project_name, run_dir.name, to_dict(self.cfg),
                                 resume_step=self.global_steps if resume else None, wandb_mode=tr.wandb_mode,
                                 run_id=run_id(run_dir.name), columns=STEP_COLUMNS)  # a header from the start
        self.history = self.tracking.history  # one stream: the dashboard reads what metrics.csv gets

    def ledger_dict(self) -> dict:
        """This trainer's ledger part ``{outcome: [seq, ...]}`` (see :mod:`asyncrl.accounting`)."""
        return self.ledger.to_dict()

    async def _funnel_state(self) -> dict:
        ro, mq = await asyncio.gather(self.rollouter.funnel_state.remote(), self.mq.stats_async())
        return {**ro, "queue_size": mq.size, "queue_max": mq.maxsize, "global_steps": self.global_steps,
                "trainer_phase": self.phase, "trainer_phase_s": time.time() - self.phase_since}

    async def save_checkpoint(self, final: bool = False) -> Optional[str]:
        """Write ``<run_dir>/checkpoints/global_step_<global_steps>`` (between steps; ``final`` at stop).

        Returns the path, or ``None`` without a run directory.
        """
        if self.checkpoints is None:
            return None
        t0 = time.time()
        async with self._weights_lock:
            path = await write_checkpoint(self, final)
        self.last_checkpoint = str(path)
        logger.info("checkpoint global_step_%d written in %.2f s", self.global_steps, time.time() - t0)
        return self.last_checkpoint

    def close(self) -> None:
        """Flush and close the metric loggers."""
        if self.tracking is not None:
            self.tracking.close()
