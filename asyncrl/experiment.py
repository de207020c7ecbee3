"""Experiment: the notebook / CLI entry that builds the actors, runs, exposes live state, shuts down.

::

    Experiment.start()  ray.init (local unless ray.address) -> GPU check + placement groups (GPU runs)
                        -> replicas -> load balancer -> MessageQueue -> FullyAsyncRollouter
                        -> FullyAsyncTrainer (fsdp2: + one worker per trainer GPU) .fit()   (returns)
    Experiment.status() / await status_async()   snapshots of every actor (widgets poll this; experiment_status.py)
    Experiment.wait()   progress bar until the trainer is done -> finish() -> Summary
    Experiment.stop()   abort generation, shut the queue, kill actors, free engines and ports

``trainer.resume_mode`` (auto | disable | resume_path) picks a checkpoint at construction; the run
then continues in that checkpoint's run directory (metrics.csv keeps its rows up to the step).
A trainer error stops the run cleanly (:class:`TrainerError` after the accounting and artifacts
are written; the last checkpoint stays usable). ``run()`` = start + wait + stop. Nothing here blocks a notebook's event loop except ``wait`` /
``run``; use ``start`` + ``status_async`` from notebooks.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from asyncrl.accounting import final_accounting
from asyncrl.config import ExperimentConfig, to_yaml
from asyncrl.config_data import name_after_data
from asyncrl.cpu_affinity import glue_cores, pin_actors
from asyncrl.data.dataset import no_held_out, no_train_files, train_source
from asyncrl.experiment_status import LiveState
from asyncrl.interrupts import RunInterrupted, SigintCounter
from asyncrl.metrics import write_run_artifacts
from asyncrl.ray_start import init_ray
from asyncrl.run_names import claim_run_dir, run_name
from asyncrl.staleness import sample_budget
from asyncrl.summary import Summary, TrainerError, held_out  # noqa: F401  (public here: asyncrl.experiment.Summary)

logger = logging.getLogger(__name__)


class Experiment(LiveState):
    """One fully-async RL run.

    Args:
        config: an :class:`~asyncrl.config.ExperimentConfig` (e.g. from a recipe or ``load_config``).
        replicas: already-running :class:`~asyncrl.rollout.replica.RolloutReplica` objects to reuse
            (engine start costs ~35 s on CPU); they get the trainer's starting weights as version 0
            and are left running by :meth:`stop`. ``None`` builds ``rollout.num_replicas`` new ones.

    The Experiment works on its own copy of ``config`` (``copy.deepcopy`` at construction): what it does to the
    config (the run named after ``data.train_files``, the paths made absolute at :meth:`start`, ``num_replicas`` set
    to the replicas given) stays in :attr:`config`, and a change to the caller's object afterwards (the next run's
    ``cfg.data.train_files = ...``) does not reach this run (it renamed ``e1.config``'s run while ``e1.run_dir``
    stayed). To change this run before :meth:`start`, change :attr:`config`.

    An Experiment runs once: :meth:`start` a second time, or after :meth:`stop`, raises (a second start ran a
    second copy of the run into the same run directory, and a start after stop cut the finished run's
    ``metrics.csv`` back to its header); make a new one for another run.

    Raises:
        TypeError: ``config`` is not an ``ExperimentConfig`` (a dict, a path, a recipe function not called), or
            ``replicas`` is not a list of ``RolloutReplica``.
        asyncrl.config.ConfigError: on an invalid config (at construction, and again at :meth:`start`).
        asyncrl.checkpoint.CheckpointError: ``resume_mode=resume_path`` names a missing or
            incomplete checkpoint.
    """

    def __init__(self, config: Optional[ExperimentConfig] = None, replicas: Optional[list] = None):
        from asyncrl.config import validate

        if config is not None and not isinstance(config, ExperimentConfig):
            what = "a recipe function: call it" if callable(config) else f"a {type(config).__name__}"
            raise TypeError(f"Experiment(config): expected an ExperimentConfig, got {what} (build one with a recipe, "
                            "e.g. asyncrl.recipes.arith_grpo_cpu(), or asyncrl.config.load_config(path_or_dict, "
                            "overrides))")
        if replicas is not None and (isinstance(replicas, (str, bytes)) or not hasattr(replicas, "__iter__") or not all(
                hasattr(r, "server_id") and hasattr(r, "actor") for r in replicas)):
            raise TypeError(f"Experiment(replicas=...): expected a list of running RolloutReplica objects "
                            f"(e.g. from NotebookSession.replica(cfg)), got {replicas!r}")
        self.config = copy.deepcopy(config) if config is not None else ExperimentConfig()  # its own: see above
        name_after_data(self.config)  # a recipe's name on own data: named after it, as the CLI names it
        validate(self.config)
        self.budget = sample_budget(self.config)
        from asyncrl.checkpoint import find_resume_checkpoint
        from asyncrl.run_paths import local_model_path

        tr = self.config.trainer
        local_dir = Path(tr.default_local_dir).expanduser()  # ~/runs: the home's, not a directory named ~
        self.resume_from = find_resume_checkpoint(  # auto: only a checkpoint of this data, model and task
            str(local_dir), tr.experiment_name, tr.seed, tr.resume_mode, tr.resume_from_path,
            source=train_source(self.config.data), task=self.config.data.task,
            model=local_model_path(self.config.actor_rollout_ref.model.path))  # as config.yaml records it (absolute)
        if self.resume_from is not None:  # continue in the checkpoint's run directory
            self.run_dir = self.resume_from.parent.parent
            self.name = self.run_dir.name
        else:
            self._named_at = time.time()  # start() claims this name, or the next free second's (run_names.claim_run_dir)
            self.name = run_name(tr.experiment_name, tr.seed, when=self._named_at)
            self.run_dir = local_dir / self.name
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
        self._phase = "new"  # -> "started" (start) -> "stopped" (stop): an Experiment runs once

    def _require_run(self, method: str) -> None:
        """Raise a clear RuntimeError for ``method`` called before :meth:`start` or after :meth:`stop`."""
        if self._phase == "new":
            raise RuntimeError(f"Experiment.{method}() before start(): call exp.start() first (or exp.run())")
        if self._phase == "stopped" or self.trainer is None:
            raise RuntimeError(f"Experiment.{method}() after stop(): the run's actors are gone; its results are in "
                               f"exp.summary and {self.run_dir}")

    # ------------------------------------------------------------------ build
    def start(self) -> "Experiment":
        """Create the actors and start rollout + training; returns once the actors are up (about a
        minute on CPU, mostly the vLLM engine start) while training continues in the background.

        Raises:
            KeyError / asyncrl.data.DatasetError: unknown ``data.task``, a bad dataset file, or a row whose
                ``data_source`` has no reward function.
            asyncrl.config.ConfigError: prompt + response (or a vLLM max_model_len) past the model's
                ``max_position_embeddings``, the run asks for more GPUs than the Ray cluster has, or the data
                can never fill one trainer step (fewer prompts than ``required_samples``, or too few
                within ``data.max_prompt_length``), or a ``custom_reward_function`` that cannot load.
        """
        from asyncrl.message_queue import MessageQueue
        from asyncrl.placement import trainer_env
        from asyncrl.rollout.load_balancer import GlobalRequestLoadBalancer, LocalRequestLoadBalancer
        from asyncrl.rollout.replica import RolloutReplica
        from asyncrl.rollouter import FullyAsyncRollouter
        from asyncrl.trainer.fully_async_trainer import FullyAsyncTrainer
        from asyncrl.trainer.hybrid_rollout import QueueForward, RolloutForward, in_process_rollout

        from asyncrl.config import validate
        from asyncrl.run_paths import resolve_run_paths

        if self._phase != "new":
            raise RuntimeError(f"Experiment {self.name} was already started{' and stopped' if self._phase == 'stopped' else ''}:"
                               f" an Experiment runs once (a second start would write into {self.run_dir} beside "
                               "it); make a new Experiment(config) for another run")
        cfg = self.config
        validate(cfg)  # the config may have been changed since the constructor checked it
        self.budget = sample_budget(cfg)
        self._phase = "started"
        self.t_start = time.time()
        train, val = self.preflight()
        # relative paths made absolute before config.yaml is written and the config reaches the actors: the run
        # directory's config.yaml re-runs from any directory (data, reward file, model, trainer.default_local_dir)
        resolve_run_paths(cfg)
        for note in (no_held_out(self.config.data), no_train_files(self.config.data)):  # once, before anything
            if note:  # starts (--dry-run prints them; the summary repeats the first)
                logger.warning("%s", note)
        if not ray.is_initialized():
            init_ray(cfg.ray.address, cfg.ray.num_cpus)
            self._started_ray = True
        layout = self._place()
        local = in_process_rollout(cfg) and not self._external_replicas  # trainer/hybrid_rollout.py
        rollout_opts = [] if local else [self.placement.actor_options(s) if self.placement else None for s in layout.rollout]
        self._replica_objs = self._external_replicas or [
            RolloutReplica(cfg, server_id=f"replica_{i}", replica_rank=i, actor_options=actor_opts)
            for i, actor_opts in enumerate(rollout_opts)]
        self.replicas = {r.server_id: r.actor for r in self._replica_objs}
        ray.get([r.actor.ready.remote() for r in self._replica_objs])
        if cfg.actor_rollout_ref.rollout.agent.num_workers > 0:  # shared by several worker processes
            self.lb = GlobalRequestLoadBalancer(self.replicas)
        else:  # agent loops run inside the rollouter: route in-process, no actor hop per request
            self.lb = LocalRequestLoadBalancer(self.replicas)
        self.mq = None if local else MessageQueue(self.budget.max_required_samples)  # local: the trainer's own
        resume = None
        if self.resume_from is not None:
            from asyncrl.checkpoint.trainer_state import rollouter_resume

            resume = rollouter_resume(self.resume_from)
            logger.warning("resuming %s from %s (trainer.resume_mode=%s)", self.name, self.resume_from,
                           self.config.trainer.resume_mode)
        if self.resume_from is None:  # a run of the same name and seed that started this second keeps its directory
            self.run_dir = claim_run_dir(self.run_dir.parent, cfg.trainer.experiment_name, cfg.trainer.seed, self._named_at)
            self.name = self.run_dir.name
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        if not local:
            self.rollouter = ray.remote(FullyAsyncRollouter).options(num_cpus=0, max_concurrency=100000).remote(
                cfg, train, val, self.replicas, self.lb, self.mq, resume)
            pin_actors([self.rollouter, self.mq.actor], glue_cores(cfg))  # the glue
        worker_opts = [self.placement.actor_options(s) for s in layout.trainer] if self.placement else None
        self.trainer = ray.remote(FullyAsyncTrainer).options(num_cpus=0, max_concurrency=64, **trainer_env(cfg)).remote(
            cfg, self.mq, self.rollouter, self.replicas, worker_opts, str(self.run_dir),
            str(self.resume_from) if self.resume_from else None, logging.getLogger("asyncrl").getEffectiveLevel(),
            {"train_rows": train, "val_rows": val, "resume": resume, "queue_maxsize": self.budget.max_required_samples}
            if local else None)
        if local:  # the rollouter and queue bodies live in the trainer actor: calls go through it
            self.rollouter = RolloutForward(self.trainer)
            self.mq = MessageQueue.from_handle(QueueForward(self.trainer), self.budget.max_required_samples)
        else:
            ray.get(self.rollouter.attach_trainer.remote(self.trainer))  # restarted replicas rejoin through it
        if (self._external_replicas or cfg.actor_rollout_ref.rollout.load_format == "dummy"
                or self.resume_from is not None):  # replicas hold other (random, older) weights than the trainer
            ray.get(self.trainer.initial_sync.remote())  # the trainer's weights (and version) everywhere
        if self.resume_from is None:
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

    def preflight(self) -> tuple[list[dict], list[dict]]:
        """The checks :meth:`start` makes before any process starts (``asyncrl train --dry-run`` makes them alone):
        the model directories, CPU cores and loggers exist (:func:`asyncrl.config_ranges.check_local_resources`), a
        ``custom_reward_function`` loads (:func:`asyncrl.reward.custom.scorer`), the train and test rows are read (a
        bad task name or file fails here, and, without a custom reward, a row whose ``data_source`` has no reward
        every process knows: :func:`asyncrl.reward.reward_problem`), the data must be able to fill one trainer step
        within ``data.max_prompt_length`` (:func:`asyncrl.watchdog.check_can_fill_batch`), and prompt + response must
        fit the model's positions (:func:`asyncrl.config_ranges.check_model_positions`: vLLM failed at its start,
        with Ray up). Groups in flight far past the engines' seats log a WARNING
        (:func:`asyncrl.staleness.in_flight_warning`). A resume on other training data than its checkpoint's logs the data-order WARNING here
        (:func:`asyncrl.checkpoint.trainer_state.resume_data_order`). Returns ``(train rows, test rows)``; raises as
        :meth:`start` documents."""
        from asyncrl.config_ranges import check_local_resources, check_model_positions
        from asyncrl.data.dataset import run_rows
        from asyncrl.models import load_tokenizer
        from asyncrl.reward import source_check
        from asyncrl.reward.custom import scorer
        from asyncrl.staleness import in_flight_warning
        from asyncrl.watchdog import check_can_fill_batch

        cfg = self.config
        check_local_resources(cfg)  # model directories, CPU cores, loggers: each failed after Ray had started
        crowd = in_flight_warning(cfg)
        if crowd:  # accepted: the run goes on as it says
            logger.warning("%s", crowd)
        scorer(cfg)  # a custom_reward_function that cannot load would fail every sample in the actors
        check = source_check(cfg, every_process=True)  # the actors that score see no register_reward made here
        train, val = (run_rows(cfg.data, split, cfg.trainer.seed, check_source=check) for split in ("train", "test"))
        m = cfg.actor_rollout_ref.model
        check_can_fill_batch(train, cfg, load_tokenizer(m.tokenizer_path or m.path))
        check_model_positions(cfg)
        if self.resume_from is not None:
            from asyncrl.checkpoint.trainer_state import resume_data_order

            resume_data_order(self.resume_from, cfg, len(train))
        return train, val

    def wait(self, progress: Optional[bool] = None, poll_s: float = 1.0) -> Summary:
        """Block until training ends (a tqdm progress bar; in a terminal, actor and log lines print above it:
        :func:`asyncrl.progress.progress_bar`), then :meth:`finish`."""
        from asyncrl.progress import draw_progress, progress_bar

        self._require_run("wait")
        show = self.config.trainer.progress_bar if progress is None else progress
        done_steps = 0
        with SigintCounter() as sigints:  # a second Ctrl-C aborts, even one that came with the first (interrupts.py)
            try:
                with progress_bar(self.name, self.config.trainer.total_training_steps, show) as bar:
                    while True:
                        ready, _ = ray.wait([self._fit_ref], timeout=poll_s)
                        st = ray.get(self.trainer.status.remote())
                        evals = ray.get(self.rollouter.snapshot.remote())["eval_history"]
                        done_steps = draw_progress(bar, st, evals, done_steps)
                        if ready:
                            break
            except KeyboardInterrupt:  # Ctrl-C (Ray's own processes block SIGINT, so the actors live on); bar closed
                if sigints.count > 1:  # two before the first was handled: abort, as a second one after it does
                    raise
                raise RunInterrupted(self.interrupt()) from None
        return self._finish_or_raise()

    def interrupt(self, reason: str = "interrupted by the user (Ctrl-C)") -> Summary:
        """Stop a running run as a normal end: the trainer finishes its running step and starts no other, a fetch
        waiting for a batch returns (the MessageQueue shuts down), then :meth:`finish`. Returns the summary, whose
        ``stop_reason`` is ``reason`` and the step reached."""
        self._require_run("interrupt")
        logger.warning("%s: stopping after the running step, then final sync, evaluation and artifacts "
                       "(Ctrl-C again aborts them)", reason)  # also a second one that came before this line
        ray.get(self.trainer.request_stop.remote(reason))
        self.mq.shutdown()  # the rollouter's puts now drop queue_shutdown (accounted); the trainer's fetch returns
        return self._finish_or_raise()

    def _finish_or_raise(self) -> Summary:
        try:
            ray.get(self._fit_ref)
        except ray.exceptions.RayTaskError as exc:  # the trainer raised: stop cleanly, then report
            summary = self.finish(failed=True)
            raise TrainerError(f"{summary.stop_reason}; prompts balanced: {summary.accounting['balanced']}; "
                               f"resume from: {summary.last_checkpoint or 'no checkpoint written'}", summary) from exc
        return self.finish()

    async def wait_async(self, poll_s: float = 1.0) -> Summary:
        """Notebook-friendly :meth:`wait`: awaits the trainer without blocking the kernel's event loop
        (widgets keep updating), then runs :meth:`finish` in a worker thread."""
        self._require_run("wait_async")
        while not (await self.trainer.status.remote())["done"]:
            await asyncio.sleep(poll_s)
        return await asyncio.to_thread(self._finish_or_raise)

    def finish(self, failed: bool = False) -> Summary:
        """Stop rollout, push the last weights, evaluate, account every prompt, checkpoint (with
        ``trainer.save_freq > 0``), write artifacts. ``failed``: the trainer raised, so its state is
        not trusted: no final sync, evaluation or checkpoint; the last checkpoint stays the one to use."""
        self._require_run("finish")
        ray.get(self.rollouter.stop.remote())
        ray.get(self.rollouter.wait_evaluation.remote())
        self._abort_live_replicas()  # orphaned training requests (a dead replica is skipped)
        if not failed:
            ray.get(self.trainer.final_sync.remote())
            ray.get(self.rollouter.wait_evaluation.remote())
            ro = ray.get(self.rollouter.snapshot.remote())
            if not ro["eval_history"] or ro["eval_history"][-1]["version"] != ro["param_version"]:
                ray.get(self.rollouter.evaluate.remote())
        self.mq.shutdown()
        if not failed and self.config.trainer.save_freq > 0:
            ray.get(self.trainer.save_checkpoint.remote(True))  # at stop: nothing in flight any more
        ray.get(self.trainer.close.remote())
        ro, tr = ray.get([self.rollouter.snapshot.remote(), self.trainer.status.remote()])
        accounting = self.accounting()
        accounting["in_flight_left"] = ro["accounting"]["pending"] + ro["accounting"]["active"]
        evals = ro["eval_history"]
        held = held_out(evals, self.config.trainer.eval_average_last, no_held_out(self.config.data))
        before, after = held.get("before") or {}, held.get("after") or {}
        self.summary = Summary(
            run_dir=str(self.run_dir), steps=tr["global_steps"], param_version=tr["param_version"],
            accuracy_before=before.get("value"), accuracy_after=after.get("value"), held_out=held,
            accounting=accounting, wall_s=time.time() - self.t_start, evals=evals,
            lag_counts=tr["lag_counts"], response_length_counts=tr.get("response_length_counts", {}),
            gradient_length_counts=tr.get("gradient_length_counts", {}),
            stale_length_counts=tr.get("stale_length_counts", {}),
            staleness_bound=tr["staleness_bound"], stop_reason=tr.get("stop_reason", ""),
            last_checkpoint=tr.get("last_checkpoint"), resumed_from=str(self.resume_from) if self.resume_from else None,
            accuracy_after_evals=after.get("evals", 0))
        history = tr["history"]
        write_run_artifacts(self.run_dir, history, evals, to_yaml(self.config), dataclasses.asdict(self.summary),
                            write_metrics=False)  # metrics.csv was streamed step by step
        return self.summary

    def _abort_live_replicas(self) -> None:
        for sid, r in self.replicas.items():
            try:
                ray.get(r.abort_all_requests.remote(), timeout=60)
            except Exception as exc:  # died, or restarting
                logger.warning("abort on replica %s: %s", sid, type(exc).__name__)

    def accounting(self) -> dict:
        """Invariant 1 from the per-sample ledger: ``taken == trained + dropped + failed``, every drop
        and failure with a reason, no seq lost or accounted twice (see :mod:`asyncrl.accounting`).
        Exact once the run is stopped; while it runs, samples in flight show as ``lost``."""
        self._require_run("accounting")
        ro_parts, tr_part, taken = ray.get([self.rollouter.ledger_parts.remote(), self.trainer.ledger_dict.remote(),
                                            self.rollouter.taken.remote()])
        return final_accounting(taken, [*ro_parts, tr_part])

    def stop(self) -> None:
        """Shut everything down: no actors, engine processes or ports left behind. Idempotent; the Experiment
        cannot be started again (make a new one)."""
        if self._phase == "started":
            self._phase = "stopped"
        if self.rollouter is not None:
            try:  # an aborted run's loops still generate: stopped first, else their samples fail on released workers
                ray.get(self.rollouter.stop.remote(), timeout=60)
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
                try:
                    r.shutdown()
                except Exception as exc:  # a replica that died (and was not restarted) is gone already
                    logger.warning("replica %s shutdown: %s", r.server_id, type(exc).__name__)
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

    def run(self, on_start: Optional[Callable[["Experiment"], None]] = None) -> Summary:
        """start + wait + stop; returns the :class:`Summary`. ``on_start(self)`` is called once the run has started,
        before the wait (``asyncrl train`` prints the run's directory and name there: after every check a run makes
        before it starts, so an error stays its one line)."""
        try:
            self.start()
            if on_start is not None:
                on_start(self)
            return self.wait()
        finally:
            self.stop()
