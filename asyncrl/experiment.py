"""Experiment: the notebook / CLI entry that builds the actors, runs, exposes live state, shuts down.

::

    Experiment.start()  ray.init (local unless ray.address) -> GPU check + placement groups (GPU runs)
                        -> replicas -> load balancer -> MessageQueue -> FullyAsyncRollouter
                        -> FullyAsyncTrainer (fsdp2: + one worker per trainer GPU) .fit()   (returns)
    Experiment.status() / await status_async()   snapshots of every actor (widgets poll this)
    Experiment.wait()   progress bar until the trainer is done -> finish() -> Summary
    Experiment.stop()   abort generation, shut the queue, kill actors, free engines and ports

``run()`` = start + wait + stop. Nothing here blocks a notebook's event loop except ``wait`` /
``run``; use ``start`` + ``status_async`` from notebooks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import ray

from asyncrl.config import ExperimentConfig, to_yaml
from asyncrl.metrics import run_name, write_run_artifacts
from asyncrl.staleness import sample_budget

logger = logging.getLogger(__name__)


@dataclass
class Summary:
    """What a finished run reports (also written to ``summary.json``).

    Attributes:
        run_dir: artifact directory.
        steps: trainer fit steps done; ``param_version``: weight syncs done.
        accuracy_before: held-out greedy accuracy at version 0 (0..1).
        accuracy_after: mean of the last ``trainer.eval_average_last`` evaluations (0..1).
        accounting: prompts taken vs trained / dropped / failed, with reasons (invariant 1).
        wall_s: seconds from start to the end of the final evaluation.
    """

    run_dir: str
    steps: int
    param_version: int
    accuracy_before: Optional[float]
    accuracy_after: Optional[float]
    accounting: dict
    wall_s: float
    evals: list = field(default_factory=list)
    lag_counts: dict = field(default_factory=dict)
    staleness_bound: int = 0
    stop_reason: str = ""

    def __str__(self) -> str:
        def pct(x: Optional[float]) -> str:
            return "n/a" if x is None else f"{100 * x:.1f}%"
        a = self.accounting
        drops = ", ".join(f"{k} {v}" for k, v in sorted(a.get("dropped", {}).items())) or "none"
        return (f"run {self.run_dir}: {self.steps} steps, {self.param_version} syncs, {self.wall_s:.0f} s"
                f" (stopped: {self.stop_reason or 'n/a'})\n"
                f"  held-out greedy accuracy: before {pct(self.accuracy_before)} -> after {pct(self.accuracy_after)}"
                f" (mean of last evals)\n"
                f"  prompts: taken {a.get('taken')} = trained {a.get('trained')} + dropped {a.get('dropped_total')}"
                f" + failed {a.get('failed_total')}  (balanced: {a.get('balanced')})\n"
                f"  dropped by reason: {drops}\n"
                f"  token version lag counts: {dict(sorted(self.lag_counts.items()))} (bound {self.staleness_bound})"
                + self._tool_lines())

    def _tool_lines(self) -> str:
        """Before/after of the evaluations' tool metrics (``eval/tool_*``, tool-using tasks) and the
        well-formed answer rate (``eval/format``, rules that report it)."""
        if not self.evals:
            return ""
        first, last = self.evals[0], self.evals[-1]
        keys = sorted(k for k in last if k.startswith(("eval/tool", "eval/format")))
        return "".join(f"\n  {k[5:]}: before {first.get(k, float('nan')):.3f} -> after {last[k]:.3f}" for k in keys)


def _init_ray(address: Optional[str], num_cpus: Optional[int], attempts: int = 3, log_to_driver: bool = True) -> None:
    """``ray.init`` that survives a slow start: a local raylet has a hard-coded 30 s deadline to
    register, which an overloaded laptop can miss; each failed attempt is shut down and retried.
    ``log_to_driver=False`` keeps actors' output out of the caller (notebooks: ``asyncrl.notebook``).

    Raises:
        Exception: Ray's own start error after ``attempts`` tries.
    """
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                     log_to_driver=log_to_driver, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
            return
        except Exception as exc:  # Ray raises a bare Exception for the start timeout
            ray.shutdown()
            if attempt == attempts or address is not None:
                raise
            logger.warning("Ray did not start (attempt %d/%d): %s; retrying", attempt, attempts, exc)
            time.sleep(2.0)


class Experiment:
    """One fully-async RL run.

    Args:
        config: an :class:`~asyncrl.config.ExperimentConfig` (e.g. from a recipe or ``load_config``).
        replicas: already-running :class:`~asyncrl.rollout.replica.RolloutReplica` objects to reuse
            (engine start costs ~35 s on CPU); they get the trainer's starting weights as version 0
            and are left running by :meth:`stop`. ``None`` builds ``rollout.num_replicas`` new ones.

    Raises:
        asyncrl.config.ConfigError: on an invalid config (at construction).
    """

    def __init__(self, config: Optional[ExperimentConfig] = None, replicas: Optional[list] = None):
        from asyncrl.config import validate

        self.config = config or ExperimentConfig()
        validate(self.config)
        self.budget = sample_budget(self.config)
        self.name = run_name(self.config.trainer.experiment_name, self.config.trainer.seed)
        self.run_dir = Path(self.config.trainer.default_local_dir) / self.name
        self._started_ray = False
        self.replicas: dict[str, Any] = {}
        self._external_replicas = list(replicas) if replicas else None
        if self._external_replicas:
            self.config.actor_rollout_ref.rollout.num_replicas = len(self._external_replicas)
            self.budget = sample_budget(self.config)
        self.lb = self.mq = self.rollouter = self.trainer = None
        self.placement = None
        self._fit_ref = None
        self.summary: Optional[Summary] = None
        self.t_start = 0.0

    # ------------------------------------------------------------------ build
    def start(self) -> "Experiment":
        """Create the actors and start rollout + training; returns once the actors are up (about a
        minute on CPU, mostly the vLLM engine start) while training continues in the background.

        Raises:
            KeyError / asyncrl.data.DatasetError: unknown ``data.task`` or a bad dataset file.
            asyncrl.config.ConfigError: the run asks for more GPUs than the Ray cluster has.
        """
        from asyncrl.data.dataset import get_task_rows, load_rows, task_options
        from asyncrl.message_queue import MessageQueue
        from asyncrl.rollout.load_balancer import GlobalRequestLoadBalancer, LocalRequestLoadBalancer
        from asyncrl.rollout.replica import RolloutReplica
        from asyncrl.rollouter import FullyAsyncRollouter
        from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer

        cfg = self.config
        self.t_start = time.time()
        d = cfg.data  # data first: a bad task name or file fails before any process starts
        opts = task_options(d)
        train = load_rows(d.train_files) if d.train_files else get_task_rows(d.task, "train", d.train_size, cfg.trainer.seed, d.operators, **opts)
        val = load_rows(d.val_files) if d.val_files else get_task_rows(d.task, "test", d.val_size, cfg.trainer.seed, d.operators, **opts)
        if not ray.is_initialized():
            _init_ray(cfg.ray.address, cfg.ray.num_cpus)
            self._started_ray = True
        layout = self._place()
        rollout_opts = [self.placement.actor_options(s) if self.placement else None for s in layout.rollout]
        self._replica_objs = self._external_replicas or [
            RolloutReplica(cfg, server_id=f"replica_{i}", replica_rank=i, actor_options=actor_opts)
            for i, actor_opts in enumerate(rollout_opts)]
        self.replicas = {r.server_id: r.actor for r in self._replica_objs}
        ray.get([r.actor.ready.remote() for r in self._replica_objs])
        if cfg.actor_rollout_ref.rollout.agent.num_workers > 0:  # shared by several worker processes
            self.lb = GlobalRequestLoadBalancer(self.replicas)
        else:  # agent loops run inside the rollouter: route in-process, no actor hop per request
            self.lb = LocalRequestLoadBalancer(self.replicas)
        self.mq = MessageQueue(self.budget.max_required_samples)
        self.rollouter = ray.remote(FullyAsyncRollouter).options(num_cpus=0, max_concurrency=100000).remote(
            cfg, train, val, self.replicas, self.lb, self.mq)
        worker_opts = [self.placement.actor_options(s) for s in layout.trainer] if self.placement else None
        self.trainer = ray.remote(FullyAsyncTrainer).options(num_cpus=0, max_concurrency=64).remote(
            cfg, self.mq, self.rollouter, self.replicas, worker_opts)
        if self._external_replicas or cfg.actor_rollout_ref.rollout.load_format == "dummy":
            ray.get(self.trainer.initial_sync.remote())  # replicas hold other (or random) weights
        ray.get(self.rollouter.start_evaluation.remote())  # version-0 "before" accuracy
        ray.get(self.rollouter.start.remote())
        self._fit_ref = self.trainer.fit.remote()
        logger.info("experiment %s started: %s", self.name, self.budget)
        return self

    def _place(self) -> Any:
        """Check the GPUs against the cluster and create the placement groups of a GPU run (none on CPU)."""
        from asyncrl.placement import Placement, check_cluster, plan_layout

        check_cluster(self.config, ray.cluster_resources())
        layout = plan_layout(self.config)
        if layout.groups:
            self.placement = Placement(layout)
            logger.info("placement groups: %s", layout.groups)
        return layout

    # ------------------------------------------------------------------ live state
    async def status_async(self) -> dict:
        """Snapshot of every actor (never blocks the event loop)."""
        if self.rollouter is None:
            return {"state": "not started"}
        ro, tr, mq = await asyncio.gather(self.rollouter.snapshot.remote(), self.trainer.status.remote(),
                                          self.mq.stats_async())
        return self._status(ro, tr, mq)

    def status(self) -> dict:
        """Blocking variant of :meth:`status_async` for scripts."""
        if self.rollouter is None:
            return {"state": "not started"}
        ro, tr = ray.get([self.rollouter.snapshot.remote(), self.trainer.status.remote()])
        return self._status(ro, tr, self.mq.stats())

    def _status(self, ro: dict, tr: dict, mq: Any) -> dict:
        return {"state": "done" if tr["done"] else "running", "name": self.name, "elapsed_s": time.time() - self.t_start,
                "rollouter": ro, "trainer": tr, "message_queue": dataclasses.asdict(mq),
                "load_balancer": ro.pop("load_balancer", {}), "budget": dataclasses.asdict(self.budget)}

    def wait(self, progress: Optional[bool] = None, poll_s: float = 1.0) -> Summary:
        """Block until training ends (tqdm progress bar), then :meth:`finish`."""
        from tqdm.auto import tqdm

        show = self.config.trainer.progress_bar if progress is None else progress
        total = self.config.trainer.total_training_steps
        bar = tqdm(total=total, desc=self.name, unit="step", disable=not show)
        done_steps = 0
        while True:
            ready, _ = ray.wait([self._fit_ref], timeout=poll_s)
            st = ray.get(self.trainer.status.remote())
            bar.update(st["global_steps"] - done_steps)
            done_steps = st["global_steps"]
            last = st["history"][-1] if st["history"] else {}
            evals = ray.get(self.rollouter.snapshot.remote())["eval_history"]
            bar.set_postfix(reward=f"{last.get('reward/mean', 0):.2f}", lag=f"{last.get('staleness/lag_max', 0):.0f}",
                            acc=f"{evals[-1]['accuracy']:.2f}" if evals else "-")
            if ready:
                break
        bar.close()
        ray.get(self._fit_ref)  # re-raise a trainer error here
        return self.finish()

    async def wait_async(self, poll_s: float = 1.0) -> Summary:
        """Notebook-friendly :meth:`wait`: awaits the trainer without blocking the kernel's event loop
        (widgets keep updating), then runs :meth:`finish` in a worker thread."""
        while not (await self.trainer.status.remote())["done"]:
            await asyncio.sleep(poll_s)
        await self._fit_ref  # re-raise a trainer error here
        return await asyncio.to_thread(self.finish)

    def finish(self) -> Summary:
        """Stop rollout, push the last weights, evaluate, account every prompt, write artifacts."""
        ray.get(self.rollouter.stop.remote())
        ray.get(self.rollouter.wait_evaluation.remote())
        ray.get([r.abort_all_requests.remote() for r in self.replicas.values()])  # orphaned training requests
        ray.get(self.trainer.final_sync.remote())
        ray.get(self.rollouter.wait_evaluation.remote())
        ro = ray.get(self.rollouter.snapshot.remote())
        if not ro["eval_history"] or ro["eval_history"][-1]["version"] != ro["param_version"]:
            ray.get(self.rollouter.evaluate.remote())
        self.mq.shutdown()
        ro, tr = ray.get([self.rollouter.snapshot.remote(), self.trainer.status.remote()])
        accounting = self._accounting(ro["accounting"], tr, dataclasses.asdict(self.mq.stats()))
        evals = ro["eval_history"]
        k = self.config.trainer.eval_average_last
        after_evals = [e for e in evals if e["version"] > 0][-k:]
        self.summary = Summary(
            run_dir=str(self.run_dir), steps=tr["global_steps"], param_version=tr["param_version"],
            accuracy_before=evals[0]["accuracy"] if evals and evals[0]["version"] == 0 else None,
            accuracy_after=sum(e["accuracy"] for e in after_evals) / len(after_evals) if after_evals else None,
            accounting=accounting, wall_s=time.time() - self.t_start, evals=evals,
            lag_counts=tr["lag_counts"], staleness_bound=tr["staleness_bound"], stop_reason=tr.get("stop_reason", ""))
        history = tr["history"]
        write_run_artifacts(self.run_dir, history, evals, to_yaml(self.config), dataclasses.asdict(self.summary))
        return self.summary

    @staticmethod
    def _accounting(ro: dict, tr: dict, mq: dict) -> dict:
        """Invariant 1: taken == trained + dropped + failed, every drop and failure with a reason."""
        dropped: dict[str, int] = {}
        for src in (ro["dropped"], mq["drop_reasons"]):
            for k, v in src.items():
                dropped[k] = dropped.get(k, 0) + v
        failed = dict(ro["failed"])
        out = {"taken": ro["taken"], "trained": tr["trained"], "dropped": dropped, "failed": failed,
               "dropped_total": sum(dropped.values()), "failed_total": sum(failed.values()),
               "in_flight_left": ro["pending"] + ro["active"]}
        out["balanced"] = out["taken"] == out["trained"] + out["dropped_total"] + out["failed_total"]
        return out

    def stop(self) -> None:
        """Shut everything down: no actors, engine processes or ports left behind. Idempotent."""
        if self.rollouter is not None:
            try:
                ray.get(self.rollouter.shutdown.remote(), timeout=60)
            except Exception as exc:  # keep tearing down the rest
                logger.warning("rollouter shutdown: %s", exc)
        if self.trainer is not None:
            try:  # fsdp2 workers and the weight-sync group
                ray.get(self.trainer.shutdown.remote(), timeout=60)
            except Exception as exc:
                logger.warning("trainer shutdown: %s", exc)
        for name in ("rollouter", "trainer"):
            h = getattr(self, name)
            if h is not None:
                try:
                    ray.kill(h)
                except Exception:  # already dead
                    pass
                setattr(self, name, None)
        if self.mq is not None:
            try:
                ray.kill(self.mq.actor)
            except Exception:
                pass
            self.mq = None
        if not self._external_replicas:
            for r in getattr(self, "_replica_objs", []):
                r.shutdown()
        self._replica_objs, self.replicas = [], {}
        if self.lb is not None:
            self.lb.shutdown()
            self.lb = None
        if self.placement is not None:
            self.placement.remove()
            self.placement = None
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    def run(self) -> Summary:
        """start + wait + stop; returns the :class:`Summary`."""
        try:
            self.start()
            return self.wait()
        finally:
            self.stop()

    # rich display in notebooks
    def _repr_html_(self) -> str:
        st = "not started" if self.rollouter is None else ("finished" if self.summary else "running")
        return (f"<b>asyncrl Experiment</b> <code>{self.name}</code> &mdash; {st}<br>"
                f"required_samples={self.budget.required_samples}, max_required_samples={self.budget.max_required_samples}, "
                f"max_concurrent_samples={self.budget.max_concurrent_samples}, staleness_bound={self.budget.staleness_bound}")

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, budget={self.budget})"

