"""What a simulated run reports: :class:`SimResult` (:func:`asyncrl.sim.runner.simulate` makes it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.config import ExperimentConfig
from asyncrl.sim.cost_models import ClusterCostModel
from asyncrl.sim.engines import Timeline


@dataclass
class SimResult:
    """What a simulated run reports (virtual seconds).

    Attributes:
        name: label of the run.
        config: the simulated config.
        cost: the cost model used.
        history: the trainer's per-step rows (``timing/*``, ``trainer/idle_ratio``, ``staleness/*``...).
        wall_s: from the trainer's start to its last step.
        trained: prompt groups trained.
        samples_per_s: ``trained / wall_s`` (prompt groups per second; x ``rollout.n`` for responses).
        trainer_idle_ratio / rollouter_idle_ratio: as the real run reports them (the trainer's: waiting
            for samples at fetch; its time in syncs is :attr:`trainer_sync_ratio`).
        lag_counts: trained tokens by version lag.
        response_length_counts: trained rows by response length, ``{tokens: rows}`` in simulated tokens
            (real tokens / ``token_scale``).
        stale_length_counts: the same for the rows of groups the trainer dropped as stale (:class:`asyncrl.summary.Summary`).
        accounting: the rollouter's prompt accounting, with the trainer's drops under ``dropped`` (by reason, as a
            real run's: ``stale_at_trainer``, ``dapo_no_signal``).
        timeline: busy spans ``(lane, start, end, label)`` of replicas, trainer and syncs.
        snapshots: ``(t, status)`` every ``snapshot_every_s``, ``status`` shaped like
            ``Experiment.status_async()`` (what the widgets read).
        replicas / train_ranks: the resources simulated.
        rollout_gpus / train_gpus: GPUs (CPU units for a CPU preset) of each side; colocated (``hybrid_engine``):
            both are the one shared pool (:attr:`gpus`: the run's total).
        stop_reason: why the trainer stopped, its own words as in a real run's summary (e.g.
            ``"trainer.total_training_steps=6 reached"``, ``"time budget trainer.total_time_s=600 reached at step
            24/300"``: ``total_time_s`` counts simulated seconds).
        steps_asked: ``trainer.total_training_steps`` (``len(history)`` is the steps run).
        max_num_seqs_asked: the config's ``rollout.max_num_seqs`` (``config`` holds the seats used, at most
            the cost model's).
    """

    name: str
    config: ExperimentConfig
    cost: ClusterCostModel
    history: list
    wall_s: float
    trained: int
    samples_per_s: float
    trainer_idle_ratio: float
    rollouter_idle_ratio: float
    lag_counts: dict
    accounting: dict
    timeline: Timeline
    replicas: int
    train_ranks: int
    rollout_gpus: int = 0
    train_gpus: int = 0
    snapshots: list = field(default_factory=list)
    response_length_counts: dict = field(default_factory=dict)
    stale_length_counts: dict = field(default_factory=dict)
    stop_reason: str = ""
    steps_asked: int = 0
    max_num_seqs_asked: int = 0

    @property
    def gpus(self) -> int:
        """GPUs (CPU units) the run occupies: the shared pool when colocated, else rollout + trainer."""
        if self.config.actor_rollout_ref.hybrid_engine:
            return max(self.rollout_gpus, self.train_gpus)
        return self.rollout_gpus + self.train_gpus

    @property
    def stopped_by(self) -> str:
        """``"steps"`` (every step asked ran), ``"total_time_s=<s> (simulated s)"`` (the time budget ended the run
        first), else the trainer's :attr:`stop_reason`."""
        if len(self.history) >= self.steps_asked:
            return "steps"
        if "total_time_s" in self.stop_reason:
            return f"total_time_s={self.config.trainer.total_time_s:g} (simulated s)"
        return self.stop_reason or "-"

    @property
    def responses_per_s(self) -> float:
        return self.samples_per_s * self.config.actor_rollout_ref.rollout.n

    @property
    def trainer_sync_ratio(self) -> float:
        """Share of ``wall_s`` the trainer spent in weight syncs (``sync/total_s`` summed over its steps).

        The idle ratio counts only the wait for samples at fetch; a sync's pause (with
        ``partial_rollout=False``: the drain of every in-flight sample) is counted here, so the trainer's
        whole wait on the rollouter is ``trainer_idle_ratio`` plus the pause part of this.
        """
        return sum(r.get("sync/total_s", 0.0) for r in self.history) / self.wall_s if self.wall_s else 0.0

    def step_time(self, skip: int = 1) -> float:
        """Mean seconds per trainer step after the first ``skip`` (pipeline fill)."""
        rows = self.history
        if len(rows) <= skip + 1:
            return self.wall_s / max(1, len(rows))
        return (rows[-1]["time_s"] - rows[skip]["time_s"]) / (len(rows) - 1 - skip)

    def summary(self) -> dict:
        """One row for a comparison table (:func:`asyncrl.sim.sweep.sweep` makes one per point): the config's async
        keys, GPUs (``gpus``: the total, :attr:`gpus`), steps run and asked and ``stop_reason`` (:attr:`stopped_by`),
        samples/s, step time, idle ratios, version lag, decode seats (``max_num_seqs`` used, ``max_num_seqs_asked``),
        and ``dropped_stale``: prompt groups the staleness bound dropped (at the trainer or in generation).

        ``partial_rollout`` and ``partial_rollout_mode`` read ``"-"`` where they do not apply: colocated rows
        (each step generates its whole batch: nothing is in flight at a sync) and the mode without partial rollout.
        """
        at = self.config.async_training
        hybrid = self.config.actor_rollout_ref.hybrid_engine
        lags = self.lag_counts
        total = max(1, sum(lags.values()))
        return {
            "run": self.name,
            "hybrid_engine": hybrid,
            "staleness_threshold": at.staleness_threshold,
            "trigger_parameter_sync_step": at.trigger_parameter_sync_step,
            "partial_rollout": "-" if hybrid else at.partial_rollout,
            "partial_rollout_mode": "-" if hybrid or not at.partial_rollout else at.partial_rollout_mode,
            "rollout_gpus": self.rollout_gpus,
            "train_gpus": self.train_gpus,
            "gpus": self.gpus,
            "replicas": self.replicas,
            "train_ranks": self.train_ranks,
            "steps": len(self.history),
            "steps_asked": self.steps_asked,
            "stop_reason": self.stopped_by,
            "wall_s": self.wall_s,
            "step_s": self.step_time(),
            "samples_per_s": self.samples_per_s,
            "trainer_idle_ratio": self.trainer_idle_ratio,
            "trainer_sync_ratio": self.trainer_sync_ratio,
            "rollouter_idle_ratio": self.rollouter_idle_ratio,
            "lag_mean": sum(int(k) * v for k, v in lags.items()) / total,
            "lag_max": max((int(k) for k in lags), default=0),
            "max_num_seqs": self.config.actor_rollout_ref.rollout.max_num_seqs,  # seats per replica, as simulated
            "max_num_seqs_asked": self.max_num_seqs_asked or self.config.actor_rollout_ref.rollout.max_num_seqs,
            "scheduling_policy": self.config.actor_rollout_ref.rollout.scheduling_policy,
            # prompt groups the staleness bound cost: dropped at the trainer or ended in generation
            "dropped_stale": sum(self.accounting.get("dropped", {}).get(r, 0)
                                 for r in ("stale_at_trainer", "stale_in_generation")),
        }
