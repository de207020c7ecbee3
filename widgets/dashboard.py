"""Dashboard: the live view of one experiment (funnel, staleness, curves, trajectory inspector).

::

    Dashboard(exp) ──Poller (one per experiment, ~1.3 Hz, on the kernel loop)──┐
        await exp.status_async()                              every poll          │
        await exp.rollouter.trajectories.remote(n)            when new samples    │
                                                              arrived (<= 1 / 2 s)│
    update(snapshot) ─> header, ConcurrencyFunnel, StalenessView, TrainingCurves, TrajectoryInspector
    to_html() / to_png() / save(dir) ─> static snapshots for batch runs and exported notebooks

Creating a second Dashboard for the same experiment (re-running the cell) cancels the first one's
poller; ``stop()`` cancels it explicitly. Typical notebook use::

    exp = Experiment(arith_grpo_cpu()).start()
    dash = Dashboard(exp)
    dash.show()                           # live; the cell returns at once
    ...
    dash.save(exp.run_dir / "widgets")    # PNG + HTML snapshots
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

from widgets._common import SnapshotView, as_int, wrap
from widgets.curves import TrainingCurves
from widgets.funnel import ConcurrencyFunnel
from widgets.inspector import TrajectoryInspector
from widgets.poller import Poller
from widgets.staleness import StalenessView

logger = logging.getLogger(__name__)


def header_model(snapshot: dict) -> dict:
    """The one-line run summary: name, state, elapsed, step, versions, accounting, held-out accuracy (the
    latest evaluation's; once the run is summarised, its summary's "after": the mean of its last evaluations)."""
    tr = snapshot.get("trainer") or {}
    ro = snapshot.get("rollouter") or {}
    acc = ro.get("accounting") or {}
    evals = ro.get("eval_history") or []
    return {"name": snapshot.get("name", ""), "state": snapshot.get("state", "?"),
            "elapsed_s": float(snapshot.get("elapsed_s") or 0.0), "global_steps": as_int(tr.get("global_steps")),
            "param_version": as_int(tr.get("param_version", ro.get("param_version"))),
            "trained": as_int(tr.get("trained")), "taken": as_int(acc.get("taken")),
            "enqueued": as_int(acc.get("enqueued")),
            "accuracy": snapshot["accuracy_after"] if "accuracy_after" in snapshot else evals[-1].get("accuracy") if evals else None,
            "accuracy_evals": as_int(snapshot.get("accuracy_after_evals", 1)),
            "error": tr.get("error"), "failed": dict(acc.get("failed") or {}),
            "last_failure": (ro.get("recent_failures") or [None])[-1],
            "watchdog": (snapshot.get("watchdog") or tr.get("watchdog") or {}).get("message")}


class Dashboard(SnapshotView):
    """Everything about one run in one live view.

    Args:
        source: an :class:`~asyncrl.experiment.Experiment` (polled via ``status_async`` and
            ``rollouter.trajectories``), an async callable returning a snapshot, a snapshot dict
            (static view), or ``None`` (call :meth:`update` yourself).
        interval: seconds between polls.
        trajectories: how many recent trajectories the inspector can pick from (0: no inspector fetch).
        replica_limit: per-replica in-flight capacity for the funnel (e.g. ``rollout.max_num_seqs``);
            default: read from ``source.config`` when it is an Experiment.
        autostart: start polling at once when an event loop is running (a notebook cell).
        key: poller identity (default: the experiment's ``name``); a new Dashboard with the same key
            cancels the old poller.
        done_polls: polls of a finished ("done") run before polling stops by itself.
    """

    title = "asyncrl dashboard"

    def __init__(self, source: Any = None, interval: float = 0.75, trajectories: int = 8,
                 replica_limit: Optional[int] = None, autostart: bool = True, key: Any = None,
                 done_polls: int = 20):
        super().__init__()
        if replica_limit is None:
            replica_limit = _config_replica_limit(source)
        self.funnel = ConcurrencyFunnel(replica_limit=replica_limit)
        self.staleness = StalenessView()
        self.curves = TrainingCurves()
        self.inspector = TrajectoryInspector()
        self.n_trajectories = trajectories
        self.snapshot: Optional[dict] = None
        self._status, self._traj = _fetchers(source)
        self._traj_mark: tuple = (None, 0.0)
        self.poller: Optional[Poller] = None
        self.done_polls, self._done_polls = done_polls, 0
        self._seen_running = False
        self.final = False  # set by close(): the view shows the run's end state
        if self._status is not None:
            self.poller = Poller(self.fetch, self.update, interval=interval,
                                 key=key if key is not None else ("dashboard", getattr(source, "name", id(source))),
                                 stop_when=self._finished, on_exit=self._on_poller_exit)
            if autostart:
                self.start()
        elif isinstance(source, dict):
            self.update(source)

    # ---------------------------------------------------------------- polling
    def start(self) -> "Dashboard":
        """Start (or restart) live polling on the running loop; no-op without a loop or a source."""
        if self.poller is None or self.poller.running:
            return self
        try:
            self.poller.start()
        except RuntimeError:
            logger.info("no running event loop: call `await dashboard.refresh()` or `await dashboard.run()`")
        return self

    def stop(self) -> None:
        """Cancel live polling (the widgets keep their last state, also in the static fallback)."""
        if self.poller is not None:
            if self.poller.running:
                self.poller.stop()
            self._refresh_header()
        if self._widget is not None:
            self._stop_button.layout.display = "none"  # nothing live left to stop
        self.refresh_display()

    def _on_poller_exit(self, poller: Poller) -> None:
        # the live view is final now: put the same state into the output's static HTML fallback,
        # so a saved / exported notebook shows the end of the run rather than its first frame
        self._refresh_header()
        self.refresh_display()

    async def close(self) -> Optional[dict]:
        """End of the run: one last snapshot (with fresh trajectories for the inspector), polling
        stopped, and the view marked final (the header shows the run's end state, no live-update
        button). Call it after ``await exp.wait_async()`` and before ``exp.stop()``.

        Returns:
            The final snapshot (``None`` when it could not be fetched; the last one stays shown).
        """
        snap = None
        if self.poller is not None:
            self.poller.stop("final")
            self._traj_mark = (None, 0.0)  # the inspector gets the run's last trajectories
            snap = await self.poller.poll_once()
        self.final = True
        if self._widget is not None:
            self._refresh()
            self._stop_button.layout.display = "none"
        self.refresh_display()
        return snap

    async def run(self, static_at_end: bool = False) -> None:
        """Poll until the run is over, then put the final state into the displayed output.

        In a notebook: ``await dash.run()`` in the cell after ``dash.show()`` (batch notebooks do
        this so the saved notebook's static fallback is the final state). In scripts:
        ``asyncio.run(dash.run())``.

        Args:
            static_at_end: replace the live view by its static HTML when done (batch runs whose
                notebooks are exported to HTML; see :meth:`refresh_display`).
        """
        self.start()
        if self.poller is not None and self.poller.task is not None:
            await asyncio.gather(self.poller.task, return_exceptions=True)
        # sent from the awaiting cell: papermill / nbclient only take messages of the running cell
        self.refresh_display(static=static_at_end)

    async def refresh(self) -> Optional[dict]:
        """One poll now (awaitable); returns the snapshot."""
        return None if self.poller is None else await self.poller.poll_once()

    async def fetch(self) -> dict:
        """Status snapshot plus, when new samples were enqueued, the recent trajectories."""
        snap = dict(await self._status())
        enq = ((snap.get("rollouter") or {}).get("accounting") or {}).get("enqueued")
        mark, t_last = self._traj_mark
        if self._traj is not None and self.n_trajectories and enq != mark and time.monotonic() - t_last > 2.0:
            try:
                snap["trajectories"] = list(await self._traj(self.n_trajectories) or [])
                self._traj_mark = (enq, time.monotonic())
            except Exception as exc:  # the inspector keeps its previous list
                logger.debug("trajectory fetch failed: %s", exc)
        return snap

    def _finished(self, snap: dict) -> bool:
        """Stop after Experiment.stop() (``stopped``), or after ``done_polls`` polls of a finished run (long enough
        to catch ``finish()``'s final evaluation)."""
        self._done_polls = self._done_polls + 1 if snap.get("state") == "done" else 0
        return (snap.get("state") in ("not started", "stopped") and self._seen_running) or self._done_polls >= self.done_polls

    # ---------------------------------------------------------------- model
    def _compute(self, snapshot: dict) -> dict:
        if "rollouter" not in snapshot and self._seen_running:
            return self.model  # a stopped experiment: keep the final state on screen
        self.snapshot = snapshot
        if "rollouter" in snapshot:
            self._seen_running = True
            self.funnel.update(snapshot)
            self.staleness.update(snapshot)
            self.curves.update(snapshot)
        if snapshot.get("trajectories") is not None:
            self.inspector.update(snapshot)
        return header_model(snapshot)

    def _header_html(self) -> str:
        h = self.model or {}
        acc = "–" if h.get("accuracy") is None else f"{100 * h['accuracy']:.1f}%"
        # once done, the summary's "after" figure: where it averages several evaluations, the header says so
        mean_of = (f" (mean of the last {h['accuracy_evals']} evaluations)"
                   if h.get("accuracy") is not None and h.get("accuracy_evals", 1) > 1 else "")
        live = self.poller.reason if self.poller is not None else "static"
        err = f'<div class="warn">trainer error: {html.escape(str(h["error"]))}</div>' if h.get("error") else ""
        if h.get("failed"):  # failed samples by exception type, and the latest one's message
            counts = ", ".join(f"{html.escape(str(k))} {v}" for k, v in sorted(h["failed"].items()))
            last = h.get("last_failure") or {}
            latest = (f" &middot; latest: sample {html.escape(str(last.get('uid')))}: "
                      f"{html.escape(str(last.get('type')))}: {html.escape(str(last.get('message', ''))[:160])}"
                      if last else "")
            err += f'<div class="warn">failed samples: {counts}{latest}</div>'
        if h.get("watchdog"):  # no trainer step for trainer.watchdog_timeout_s: the binding limit
            err += f'<div class="warn">watchdog: {html.escape(str(h["watchdog"]))}</div>'
        if self.poller is not None and self.poller.last_error and self.poller.errors:
            err += f'<div class="warn">snapshot fetch failing: {html.escape(self.poller.last_error)}</div>'
        name, state = html.escape(str(h.get("name", ""))), html.escape(str(h.get("state", "no snapshot yet")))
        return (f"<b>{name}</b> &middot; {state}"
                f" &middot; {h.get('elapsed_s', 0):.0f} s &middot; step <b>{h.get('global_steps', 0)}</b>"
                f" &middot; v{h.get('param_version', 0)} &middot; prompts taken {h.get('taken', 0)}, "
                f"enqueued {h.get('enqueued', 0)}, trained {h.get('trained', 0)} &middot; held-out acc <b>{acc}</b>{mean_of}"
                + ("" if self.final else f' <span class="muted">[{html.escape(live)}]</span>') + err)

    # ---------------------------------------------------------------- live widget
    def _build(self) -> Any:
        import ipywidgets as w

        self._head = w.HTML()
        self._charts = w.HTML()
        stop = self._stop_button = w.Button(description="stop live updates", layout=w.Layout(width="160px"))
        stop.on_click(lambda _: self.stop())
        if self.final:
            stop.layout.display = "none"
        return w.VBox([w.HBox([self._head, stop]),
                       w.HBox([self.funnel.widget, self.staleness.widget]),
                       self._charts, self.inspector.widget])

    def _refresh_header(self) -> None:
        if self._widget is not None:
            self._head.value = wrap(self._header_html())

    def _refresh(self) -> None:
        self._refresh_header()
        self._charts.value = wrap(self._charts_html())

    def _charts_html(self) -> str:
        return f"{self.curves.reward_svg(250)} {self.curves.loss_svg(250)} {self.staleness.idle_svg(250, 130)}"

    # ---------------------------------------------------------------- static
    def to_html(self) -> str:
        parts = [wrap(self._header_html(), self.title), self.funnel.to_html(), self.staleness.to_html(),
                 wrap(self._charts_html(), self.curves.title), self.inspector.to_html()]
        return "\n".join(parts)

    def _plot(self) -> Any:
        from widgets import static

        plt = static._plt()
        fig = plt.figure(figsize=(14, 11))
        gs = fig.add_gridspec(3, 3, height_ratios=[1.1, 1, 1.3])
        static.draw_funnel(fig.add_subplot(gs[0, :2]), self.funnel.model)
        static.draw_lag(fig.add_subplot(gs[0, 2]), self.staleness.model)
        static.draw_reward(fig.add_subplot(gs[1, 0]), self.curves.model)
        static.draw_loss(fig.add_subplot(gs[1, 1]), self.curves.model)
        static.draw_idle(fig.add_subplot(gs[1, 2]), self.staleness.model)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        static.draw_tokens(fig.add_subplot(gs[2, :]), self.inspector.model)
        h = self.model or {}
        fig.suptitle(f"{h.get('name', '')}  [{h.get('state', '')}]  step {h.get('global_steps', 0)}  "
                     f"v{h.get('param_version', 0)}  {h.get('elapsed_s', 0):.0f} s", fontsize=11, x=0.01, ha="left")
        return fig

    def save(self, directory: "str | Path", dpi: int = 100) -> dict[str, Path]:
        """Write ``dashboard.png/.html`` and each view's PNG/HTML into ``directory``; returns the paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        out: dict[str, Path] = {}
        for name, view in (("dashboard", self), ("funnel", self.funnel), ("staleness", self.staleness),
                           ("curves", self.curves), ("inspector", self.inspector)):
            out[f"{name}.png"] = view.to_png(d / f"{name}.png", dpi=dpi)
            out[f"{name}.html"] = d / f"{name}.html"
            out[f"{name}.html"].write_text(f"<!doctype html><meta charset='utf-8'>{view.to_html()}", encoding="utf-8")
        logger.info("dashboard snapshots written to %s", d)
        return out

    def _summary(self) -> str:
        h = self.model
        if h is None:
            return "no snapshot yet"
        return (f"{h['name']!r}, {h['state']}, step={h['global_steps']}, v{h['param_version']}, "
                f"funnel: {self.funnel._summary()}")


def _fetchers(source: Any) -> tuple[Optional[Callable[[], Awaitable[dict]]], Optional[Callable[[int], Awaitable]]]:
    """``(status fetch, trajectory fetch)`` for an Experiment-like object or an async callable."""
    if source is None or isinstance(source, dict):
        return None, None
    if hasattr(source, "status_async"):
        async def trajectories(n: int) -> list:
            ro = getattr(source, "rollouter", None)
            return [] if ro is None else await ro.trajectories.remote(n)
        return source.status_async, trajectories
    if callable(source):
        return source, None
    raise TypeError(f"Dashboard source must be an Experiment, an async callable or a snapshot dict, not {type(source)}")


def _config_replica_limit(source: Any) -> Optional[int]:
    """``actor_rollout_ref.rollout.max_num_seqs`` of an Experiment's config (the engine's request cap)."""
    try:
        return int(source.config.actor_rollout_ref.rollout.max_num_seqs)
    except AttributeError:
        return None
