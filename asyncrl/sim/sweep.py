"""Sweep configurations in the simulator: a pandas table and plots, to choose a config before GPU hours.

::

    sweep(base_config, cost, {"async_training.staleness_threshold": [0, 0.25, 0.5],
                              "split": [(32, 96), (64, 64), (96, 32)]})
        -> one simulate() per combination (dotted keys are verl config keys; ``split`` is
           (rollout GPUs, trainer GPUs)) -> DataFrame: the keys, samples/s, step time, idle ratios,
           staleness (mean / max version lag, groups dropped stale)
    plot_sweep(df, x=..., hue=...)          samples/s (and trainer idle) against one knob
    plot_timeline(result, ax)               who is busy when: replicas, trainer, syncs
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Iterable, Optional

from asyncrl.config import ExperimentConfig, load_config
from asyncrl.sim.cost_models import ClusterCostModel
from asyncrl.sim.runner import SimResult, simulate

logger = logging.getLogger(__name__)

SPLIT = "split"
"""Grid key for the rollout:trainer split, values ``(rollout_gpus, train_gpus)``."""


def with_overrides(config: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """A validated copy of ``config`` with dotted-key overrides (``{"async_training.partial_rollout": False}``)."""
    return load_config(base=config, overrides=[f"{k}={v}" for k, v in overrides.items()])


def sweep(base: ExperimentConfig, cost: ClusterCostModel, grid: dict[str, Iterable[Any]], *,
          token_scale: int = 1, rollout_gpus: Optional[int] = None, train_gpus: Optional[int] = None,
          keep_results: bool = False, **simulate_kw: Any):
    """Simulate every combination of ``grid`` and tabulate the outcome.

    Args:
        base: the starting config.
        cost: cluster cost model.
        grid: dotted config key -> values, plus optionally ``"split"`` -> ``(rollout_gpus, train_gpus)``.
        token_scale, rollout_gpus, train_gpus, simulate_kw: passed to :func:`~asyncrl.sim.simulate`.
        keep_results: add a ``result`` column holding each :class:`SimResult`.

    Returns:
        ``pandas.DataFrame``, one row per combination: the grid values, then
        :meth:`SimResult.summary` (``samples_per_s``, ``step_s``, ``trainer_idle_ratio``,
        ``rollouter_idle_ratio``, ``lag_mean``, ``lag_max``, ``dropped_stale``: prompt groups the staleness bound
        dropped, ``max_num_seqs``: seats per replica as simulated, ...). Combinations the config rejects
        get an ``error`` and no numbers.
    """
    import pandas as pd

    keys = list(grid)
    rows = []
    for values in itertools.product(*(list(grid[k]) for k in keys)):
        combo = dict(zip(keys, values))
        split = combo.pop(SPLIT, None)
        row: dict[str, Any] = {k: v for k, v in zip(keys, values)}
        try:
            cfg = with_overrides(base, combo)
            r_gpus, t_gpus = split if split is not None else (rollout_gpus, train_gpus)
            res = simulate(cfg, cost, rollout_gpus=r_gpus, train_gpus=t_gpus, token_scale=token_scale,
                           name=", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, values)), **simulate_kw)
        except Exception as exc:  # a rejected combination is a row with its reason, not a crash
            logger.warning("sweep combination %s failed: %s", row, exc)
            row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            continue
        row.update({k: v for k, v in res.summary().items() if k not in row})
        if keep_results:
            row["result"] = res
        rows.append(row)
    return pd.DataFrame(rows)


AXIS_LABELS = {"samples_per_s": "prompt groups trained / s", "step_s": "seconds per trainer step",
               "trainer_idle_ratio": "trainer idle (share of wall time)", "lag_mean": "mean lag (versions, per token)",
               "async_training.staleness_threshold": "staleness_threshold",
               "async_training.trigger_parameter_sync_step": "trigger_parameter_sync_step"}
"""Readable axis labels (with units) for :meth:`SimResult.summary` columns and common sweep keys."""


def plot_sweep(df, x: str, y: str = "samples_per_s", hue: Optional[str] = None, ax: Any = None,
               idle: bool = True) -> Any:
    """Line plot of ``y`` against ``x`` (one line per ``hue`` value), with the trainer's idle ratio
    on a second axis when ``idle``. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    groups = [(None, df)] if hue is None else list(df.groupby(hue))

    def xvals(part):  # tuples (a split) are drawn as categories
        return part[x].map(str) if part[x].dtype == object else part[x]

    for value, part in groups:
        label = AXIS_LABELS.get(y, y) if value is None else f"{hue.rsplit('.', 1)[-1]}={value}"
        ax.plot(xvals(part), part[y], marker="o", label=label)
    ax.set_xlabel(AXIS_LABELS.get(x, x.rsplit(".", 1)[-1]))
    ax.set_ylabel(AXIS_LABELS.get(y, y))
    ax.set_ylim(0, 1.1 * max(float(df[y].max()), 1e-9))  # from 0: a cut axis magnifies small differences
    if idle and "trainer_idle_ratio" in df:
        ax2 = ax.twinx()
        for value, part in groups:
            ax2.plot(xvals(part), part["trainer_idle_ratio"], linestyle=":", alpha=0.6)
        ax2.set_ylabel("trainer idle (dotted)")
        ax2.set_ylim(0, 1)
    ax.legend(fontsize=8)
    return ax


LANE_COLORS = {"decode": "#4c72b0", "prefill": "#8172b2", "weight load": "#c44e52", "update": "#55a868",
               "log_prob": "#64b5cd", "ref_log_prob": "#64b5cd", "sync": "#8c564b",
               "switch+sync": "#dd8452"}


def plot_timeline(result: SimResult, ax: Any = None, until: Optional[float] = None, max_replicas: int = 4) -> Any:
    """Gantt chart of a simulated run: each replica's decode / prefill / weight-load spans, the
    trainer's updates and the weight syncs, over virtual time. A span narrower than 1/400 of the axis
    (e.g. a 1 s weight load in a 700 s window) is drawn that wide (about 2 px on a 9-inch axis), so every
    entry of the legend has a visible bar. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.5))
    until = until if until is not None else result.wall_s
    replicas = sorted({lane for lane, *_ in result.timeline.spans if lane.startswith("replica")},
                      key=lambda s: int(s.rsplit("_", 1)[-1]))[:max_replicas]
    lanes = replicas + ["trainer", "sync"]
    for y, lane in enumerate(lanes):
        spans = [(s, e, lab) for ln, s, e, lab in result.timeline.spans if ln == lane and s < until]
        for label in sorted({lab for *_, lab in spans}):
            bars = [(s, max(min(e, until) - s, until / 400)) for s, e, lab in spans if lab == label]
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=LANE_COLORS.get(label, "#999999"), label=label)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.set_xlim(0, until)
    ax.set_xlabel("virtual seconds")
    ax.tick_params(labelbottom=True)  # every panel keeps its x ticks, also with sharex=True
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0),
              borderaxespad=0.0, frameon=False)  # beside the axes, never over a bar
    ax.set_title(result.name)
    return ax
