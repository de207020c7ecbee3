"""What every teaching notebook repeats, as one library call: start Ray quietly, show progress while
engines start, run an experiment with its dashboard, check the chapter's claims, tear everything down.

::

    nb = start_ray(ray_address)                  ray.init (local unless an address; retried on a slow start)
         |                                       Ray's start-up log lines -> <log_dir>/ray_start.log
    replica = await nb.replica(cfg)              engine start with a ticking progress line; closed by nb.close()
    run = await nb.run(cfg, replicas=[replica])  Experiment start (progress) -> Dashboard (live) -> wait
         |                                       -> final dashboard state ("done") -> stop -> snapshots
         |                                       the run's status line: "done: N steps ... in T s" or the failure
    nb.claim("mode d shows a partial rollout", run.partial_samples > 0, f"{run.partial_samples} samples")
         |                                       "✓ text (evidence)", or ClaimFailed: the notebook stops there
    nb.claims()                                  the list of claims checked on this run (one line each)
    nb.close()                                   experiments, replicas, placement groups, pollers, Ray (if ours)

``nb.smoke`` is true when ``CI`` is set in the environment (the tests and ``asyncrl batch --env CI=1``
run every notebook at smoke size). Nothing here is needed to use asyncrl from a notebook; it keeps a
chapter's cells to the few lines that teach.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any, Optional

from asyncrl.batch_params import CLOSE_ON_ERROR_ENV
from asyncrl.notebook_claims import Claim, ClaimFailed, Claims  # noqa: F401 - part of this module's API
from asyncrl.notebook_progress import Progress, RunLine, in_notebook, show  # noqa: F401 - part of this module's API

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- Ray start
def _quiet_ray_init(address: Optional[str], log_path: Path, num_cpus: Optional[int]) -> None:
    """``ray.init`` with Ray's own start-up lines (token-auth notice, "Started a local Ray instance",
    retries) written to ``log_path`` instead of the notebook's stderr; Ray's later warnings show as usual."""
    from asyncrl.ray_start import init_ray

    ray_logger = logging.getLogger("ray")
    saved = (list(ray_logger.handlers), ray_logger.propagate)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ray_logger.handlers, ray_logger.propagate = [handler], False
    try:
        init_ray(address, num_cpus, attempts=5, log_to_driver=False)
    finally:
        ray_logger.handlers, ray_logger.propagate = saved
        handler.close()


def _quiet_library_progress_bars() -> None:
    """No transformers progress bars ("Loading weights") in this kernel: an engine loads in a worker thread,
    whose bar lands in whatever cell runs then (04 showed one in its table cell); ours are the Progress lines."""
    if importlib.util.find_spec("transformers") is not None:
        importlib.import_module("transformers.utils.logging").disable_progress_bar()


def start_ray(ray_address: Optional[str] = None, *, snapshot_dir: Optional[str] = None,
              name: str = "notebook", num_cpus: Optional[int] = None) -> "NotebookSession":
    """Start a local Ray (or attach to ``ray_address``) for a notebook; returns its session.

    Args:
        ray_address: ``None`` starts a local Ray; ``"auto"`` / ``"ray://head:10001"`` attaches to a
            cluster (which :meth:`NotebookSession.close` then leaves running).
        snapshot_dir: where widget PNG/HTML snapshots go (``asyncrl batch`` passes one);
            default ``runs/<name>``.
        name: the notebook's name (default snapshot and log directory).
        num_cpus: CPUs of a local Ray (default: all).

    Returns:
        A :class:`NotebookSession`; ``session.smoke`` tells whether ``CI`` asks for smoke sizes.

    Raises:
        ValueError: ``name`` empty or not a string, ``num_cpus`` not a whole number >= 1.
        Exception: Ray's own start error after 5 attempts (local) or at once (an address).
    """
    import ray

    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"start_ray(name=...): a non-empty notebook name (its runs/ directory), got {name!r}")
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
        raise ValueError(f"start_ray(num_cpus=...): a whole number >= 1 (or None: all of them), got {num_cpus!r}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_library_progress_bars()
    session = NotebookSession(name=name, snapshot_dir=snapshot_dir, ray_address=ray_address)
    if ray.is_initialized():
        show("Ray already running in this kernel: reusing it")
        return session
    where = "attaching to Ray at " + ray_address if ray_address else "starting a local Ray"
    with Progress(where) as p:
        _quiet_ray_init(ray_address, session.log_dir / "ray_start.log", num_cpus)
        session.started_ray = ray_address is None
        cpus = ray.cluster_resources().get("CPU", 0)
        p.done(f"Ray {'started' if session.started_ray else 'attached'} ({cpus:g} CPUs) in {p.elapsed_s:.0f} s;"
               f" start-up log: {session.log_dir / 'ray_start.log'}")
    if os.environ.get(CLOSE_ON_ERROR_ENV) == "1":
        close_on_cell_error(session)
    return session


def close_on_cell_error(session: "NotebookSession") -> bool:
    """Close ``session`` (its engines, then Ray) as soon as a cell of this kernel raises; for batch runs, where the
    first error ends the notebook. Without it, the kernel's exit shut Ray down (Ray's atexit hook), which outlasted
    jupyter_client's 2.5 s of grace, and Ray's signal handler printed a stack dump per process at the SIGTERM, like a
    crash, before the real error. Returns whether a hook was registered (``False`` outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False

    def _after_cell(result: Any) -> None:
        if result.error_in_exec is not None or result.error_before_exec is not None:
            shell.events.unregister("post_run_cell", _after_cell)
            session.close()

    shell.events.register("post_run_cell", _after_cell)
    return True


# ---------------------------------------------------------------------- the session
@dataclasses.dataclass
class RunResult:
    """One experiment run from :meth:`NotebookSession.run`.

    Attributes:
        summary: the :class:`~asyncrl.experiment.Summary`.
        history: ``metrics.csv`` as a DataFrame (one row per trainer step).
        dashboard: the final :class:`~widgets.Dashboard` (``None`` without widgets).
        trajectories: the rollouter's most recent trajectories (first response of each sample).
        wall_s: seconds from the start call to the end of the final evaluation (end-to-end).
    """

    summary: Any
    history: Any
    dashboard: Any = None
    trajectories: list = dataclasses.field(default_factory=list)
    wall_s: float = 0.0

    @property
    def partial_samples(self) -> int:
        """Trained samples whose tokens came from more than one parameter version."""
        if self.history is None or "rollouter/partial_count" not in self.history:
            return 0
        return int(self.history["rollouter/partial_count"].sum())


class NotebookSession:
    """Ray, engines, experiments and claims of one notebook (make it with :func:`start_ray`).

    Attributes:
        smoke: ``CI`` is set: run at smoke size.
        snapshot_dir: widget snapshots go here.
        log_dir: Ray's start-up log.
        started_ray: this session started Ray (so :meth:`close` shuts it down).
        checked: the claims checked so far.
    """

    def __init__(self, name: str = "notebook", snapshot_dir: Optional[str] = None, ray_address: Optional[str] = None):
        self.name = name
        self.smoke = bool(os.environ.get("CI"))
        self.snapshot_dir = Path(snapshot_dir or os.path.join("runs", name))
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)  # figures and widget snapshots go here
        self.log_dir = self.snapshot_dir / "logs"
        self.ray_address = ray_address
        self.started_ray = False
        self.checked: list[Claim] = []
        self._owned: list[Any] = []  # closed in reverse order
        self._lines: dict[int, RunLine] = {}  # id(experiment) -> its status line
        self.closed = False

    def _require_open(self, method: str) -> None:
        """A session that :meth:`close` ended starts nothing more (it started a new Ray, untracked, session 30)."""
        if self.closed:
            raise RuntimeError(f"NotebookSession.{method}(): this session is closed (nb.close() ran, or a batch run's "
                               "cell failed): start a new one with start_ray(...)")

    # -- things to close
    def track(self, obj: Any) -> Any:
        """Close ``obj`` at :meth:`close` (an Experiment, a RolloutReplica, a placement group, or anything
        with ``shutdown()`` / ``stop()``); returns it."""
        self._owned.append(obj)
        return obj

    async def replica(self, cfg: Any, server_id: str = "replica_0", **kwargs: Any) -> Any:
        """Start a :class:`~asyncrl.rollout.replica.RolloutReplica` for ``cfg`` with a progress line;
        it outlives the experiments that reuse it and is shut down by :meth:`close`.

        Args:
            cfg: the experiment config (backend and engine settings from ``actor_rollout_ref``).
            server_id: the replica's name.
            **kwargs: passed to ``RolloutReplica`` (``replica_rank``, ``actor_options`` ...).
        """
        from asyncrl.config import ExperimentConfig
        from asyncrl.rollout.replica import RolloutReplica

        self._require_open("replica")
        if not isinstance(cfg, ExperimentConfig):
            raise TypeError(f"NotebookSession.replica(cfg): expected an ExperimentConfig, got a {type(cfg).__name__}")
        backend = cfg.actor_rollout_ref.rollout.name
        async with Progress(f"starting the {backend} engine {server_id}") as p:  # the line ticks the measured time
            replica = self.track(RolloutReplica(cfg, server_id=server_id, **kwargs))
            await replica.ready_async()
            p.done(f"{server_id} ready ({backend}) in {p.elapsed_s:.0f} s")
        return replica

    async def start(self, exp: Any) -> Any:
        """``exp.start()`` in a worker thread with a progress line (the kernel stays live); returns ``exp``.

        The line reads "running" while the run trains and, once it ends (whoever waits for it), "done"
        with its steps, final version and wall time, or the failure (:class:`~asyncrl.notebook_progress.RunLine`).
        """
        self._require_open("start")
        n = len(exp._external_replicas or []) or exp.config.actor_rollout_ref.rollout.num_replicas
        what = ("starting the queue, rollouter and trainer, pushing version 0"
                if exp._external_replicas else f"starting {n} engine(s), the queue, rollouter and trainer")
        self.track(exp)
        async with Progress(f"{exp.name}: {what}") as p:
            await asyncio.to_thread(exp.start)
            up_s = p.elapsed_s
            p.done(f"{exp.name} running (actors up in {up_s:.0f} s)")
        self._lines[id(exp)] = RunLine(exp, p, up_s).watch()
        return exp

    async def run(self, cfg: Any, replicas: Optional[list] = None, *, dashboard: bool = True,
                  name: Optional[str] = None, trajectories: int = 16) -> RunResult:
        """Start an experiment, show its live dashboard, wait for the end, stop it, save snapshots.

        Args:
            cfg: an :class:`~asyncrl.config.ExperimentConfig`.
            replicas: running replicas to reuse (see :class:`~asyncrl.experiment.Experiment`).
            dashboard: show the live :class:`~widgets.Dashboard` (needs ipywidgets).
            name: snapshot sub-directory (default: the experiment name).
            trajectories: recent trajectories to keep in the result (for an inspector).

        Returns:
            A :class:`RunResult`; the dashboard's final state reads "done".
        """
        import pandas as pd

        from asyncrl.experiment import Experiment

        self._require_open("run")
        exp = await self.start(Experiment(cfg, replicas=replicas))
        dash = None
        if dashboard:
            try:
                from widgets import Dashboard
            except ImportError:  # the run works the same without widgets
                logger.info("widgets not importable: no dashboard")
            else:
                dash = Dashboard(exp, trajectories=min(trajectories, 8) or 8)
                dash.show()
        recent: list = []
        try:
            summary = await exp.wait_async()
            if trajectories:
                recent = list(await exp.rollouter.trajectories.remote(trajectories))
            if dash is not None:
                await dash.close()
        finally:
            if dash is not None:
                dash.stop()
            exp.stop()
            self._lines.pop(id(exp)).settle()  # "done: N steps ...", or the failure, in this cell's output
        if dash is not None:
            dash.save(self.snapshot_dir / (name or exp.name))
        metrics = Path(summary.run_dir) / "metrics.csv"
        history = pd.read_csv(metrics) if metrics.is_file() and metrics.stat().st_size > 1 else pd.DataFrame()
        return RunResult(summary=summary, history=history, dashboard=dash, trajectories=recent, wall_s=summary.wall_s)

    # -- claims
    def claim(self, text: str, ok: Any, evidence: Any = "", unchecked: str = "") -> None:
        """Check one claim of the chapter on this run: shows ``✓ text (evidence)``, or raises.

        Args:
            text: the claim, in the words of the markdown beside it.
            ok: truthy when the run shows it.
            evidence: the measured value(s) (shown with the claim).
            unchecked: when not empty, why this run cannot decide the claim (e.g. a measured speed-up from a run
                too short to show one): it is shown as ``– text (not checked: why)``, ``ok`` is ignored and
                nothing is raised. A parameter that shrinks a run decides this, never the measured value.

        Raises:
            ClaimFailed: the run contradicts the text (the notebook, and its test, fail here).
        """
        if not isinstance(text, str) or not text.strip():  # the summary lists the claims by their words
            raise TypeError(f"NotebookSession.claim(text, ok): text is the claim in the chapter's words, got {text!r}")
        if unchecked:
            c = Claim(text=text, ok=False, evidence=str(evidence), unchecked=unchecked)
            self.checked.append(c)
            show(c.line(), "#8c8c8c")
            return
        c = Claim(text=text, ok=bool(ok), evidence=str(evidence))
        self.checked.append(c)
        if not c.ok:
            raise ClaimFailed(f"the text says: {text!r}, but this run shows: {c.evidence or 'otherwise'}")
        show(c.line(), "#237804")  # returns None: a claim as a cell's last line leaves no stray repr

    def claims(self) -> "Claims":
        """The chapter's checked claims, one line each without evidence (a stable, comparable output)."""
        return Claims(list(self.checked))

    # -- teardown
    def close(self) -> None:
        """Stop live widgets, then everything tracked (newest first), then Ray if this session started it.

        Idempotent; a cluster attached to with ``ray_address`` is left running. A closed session starts nothing
        more (:meth:`replica`, :meth:`start`, :meth:`run` raise RuntimeError).
        """
        import ray

        self.closed = True

        try:
            from widgets.poller import Poller

            Poller.stop_all()
        except ImportError:
            pass
        while self._owned:
            obj = self._owned.pop()
            try:
                _close_one(obj)
            except Exception as exc:  # keep closing the rest
                logger.warning("closing %r: %s", obj, exc)
        for line in self._lines.values():  # runs nobody waited for: "done", or "stopped before its end"
            line.settle()
        self._lines.clear()
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
            self.started_ray = False

    def __enter__(self) -> "NotebookSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"NotebookSession({self.name!r}, smoke={self.smoke}, started_ray={self.started_ray}, "
                f"claims={sum(c.ok for c in self.checked)}/{sum(not c.unchecked for c in self.checked)})")


def _close_one(obj: Any) -> None:
    """Shut one tracked object down by its kind."""
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    if isinstance(obj, PlacementGroup):
        remove_placement_group(obj)
    elif hasattr(obj, "stop") and hasattr(obj, "wait_async"):  # an Experiment (idempotent stop)
        obj.stop()
    elif hasattr(obj, "shutdown"):
        obj.shutdown()
    elif hasattr(obj, "stop"):
        obj.stop()
