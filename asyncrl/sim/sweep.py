"""Sweep configurations in the simulator: a pandas table and plots, to choose a config before GPU hours.

::

    sweep(base_config, cost, {"async_training.staleness_threshold": [0, 0.25, 0.5],
                              "split": [(32, 96), (64, 64), (96, 32)]})
        -> checks the grid and the arguments once (a mistake that holds for every point raises)
        -> one simulate() per combination (dotted keys are verl config keys; ``split`` is
           (rollout GPUs, trainer GPUs)) -> DataFrame: the keys, GPUs in all, samples/s, step time, idle ratios,
           staleness (mean / max version lag, groups dropped stale)
    plot_sweep(df, x=..., hue=...)          samples/s (and trainer idle) against one knob
    plot_timeline(result, ax)               who is busy when: replicas, trainer, syncs
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import logging
import numbers
from collections.abc import Iterable as IterableABC, Mapping
from typing import Any, Iterable, Optional

from asyncrl.config import ConfigError, ExperimentConfig, load_config
from asyncrl.sim.cost_models import ClusterCostModel
from asyncrl.sim.runner import SimResult, simulate

logger = logging.getLogger(__name__)

SPLIT = "split"
"""Grid key for the rollout:trainer split, values ``(rollout_gpus, train_gpus)``."""
_OWN_ARGS = ("config", "cost", "rollout_gpus", "train_gpus", "token_scale", "name")
"""simulate()'s parameters that sweep() sets itself (the rest pass through ``**simulate_kw``)."""
_SWEEP_ARGS = ("rollout_gpus", "train_gpus", "token_scale", "keep_results")
_SIMULATE_ARGS = tuple(inspect.signature(simulate).parameters)


def with_overrides(config: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """A validated copy of ``config`` with dotted-key overrides (``{"async_training.partial_rollout": False}``)."""
    return load_config(base=config, overrides=[f"{k}={v}" for k, v in overrides.items()])


def _units(cost: ClusterCostModel) -> str:
    """What a cost model's rollout_gpus / train_gpus count (the CPU presets count resource units of cores)."""
    return "units of cores" if cost.name.startswith("cpu-") else "GPUs"


def _check_count(cost: ClusterCostModel, what: str, n: Any, rollout: bool) -> int:
    """A GPU count of a split: a whole number >= 1, whole replicas (``rollout``) or trainer ranks of ``cost``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"{what} must be a whole number >= 1 ({_units(cost)} of {cost.name}), got {n!r}")
    unit, per = (cost.rollout.gpus, "per rollout replica") if rollout else (cost.train.gpus_per_rank, "per trainer rank")
    if n % unit:
        raise ConfigError(f"{what} must be a multiple of {cost.name}'s {unit} {_units(cost)} {per}; got {n} "
                          f"(try {max(unit, n // unit * unit)})")
    return int(n)


def _check_split(cost: ClusterCostModel, value: Any) -> tuple:
    """A ``split`` grid value as ``(rollout_gpus, train_gpus)``."""
    pair = list(value) if isinstance(value, IterableABC) and not isinstance(value, (str, bytes, Mapping)) else None
    if pair is None or len(pair) != 2:
        raise ValueError(f"each {SPLIT!r} value is a (rollout_gpus, train_gpus) pair of whole numbers >= 1 "
                         f"({_units(cost)}), got {value!r}; e.g. {SPLIT!r}: [(8, 8), (16, 16)]")
    r_gpus, t_gpus = pair
    return (_check_count(cost, f"{SPLIT} {value!r}: rollout_gpus", r_gpus, True),
            _check_count(cost, f"{SPLIT} {value!r}: train_gpus", t_gpus, False))


def _grid_key_error(base: ExperimentConfig, key: str, first: Any) -> Optional[Exception]:
    """The error for a grid key that is neither ``split`` nor a config key (``None`` when it is one)."""
    from asyncrl.config import KEY_HINTS, valid_keys

    if key == SPLIT:
        return None
    if key in _SWEEP_ARGS or key in _SIMULATE_ARGS:
        fix = (f"to vary the GPUs use the grid key {SPLIT!r}: [(rollout_gpus, train_gpus), ...]"
               if key in ("rollout_gpus", "train_gpus") else
               f"pass sweep(..., {key}=...) for every point (one sweep per {key} to compare them)")
        return ValueError(f"{key!r} is not a grid key but an argument of sweep() / simulate(): {fix}")
    keys = valid_keys()
    if key in keys:
        return None
    try:  # keys inside dict-valued fields (engine_kwargs.*) are config keys that valid_keys() does not list
        with_overrides(base, {key: first})
    except Exception as exc:  # noqa: BLE001 - only an unknown key is the grid's mistake
        if not (isinstance(exc, ConfigError) and str(exc).startswith("unknown config key")):
            return None  # a known key with a bad value: that point's row says so
    else:
        return None
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    lower = {k.lower(): k for k in [*keys, SPLIT, *_SWEEP_ARGS]}
    close = by_leaf or [lower[m] for m in difflib.get_close_matches(key.lower(), list(lower), n=1, cutoff=0.0)]
    hint = KEY_HINTS.get(key) or (f"did you mean {close[0]!r}?" if close else "")
    return ConfigError(f"unknown grid key {key!r}: not a config key nor {SPLIT!r} ((rollout_gpus, train_gpus) pairs); "
                       f"{hint}")


def _grid_values(base: ExperimentConfig, cost: ClusterCostModel, grid: Any) -> dict[str, list]:
    """``grid`` as key -> list of values, every key and every split checked (before any point runs)."""
    if not isinstance(grid, Mapping):
        raise TypeError(f"grid must be a dict of key -> list of values, got {type(grid).__name__}; "
                        "e.g. {'async_training.staleness_threshold': [0, 0.5]}")
    out = {}
    for key, values in grid.items():
        if not isinstance(key, str):
            raise TypeError(f"grid keys are dotted config keys or {SPLIT!r} (str), got {key!r}")
        listed = None
        if not isinstance(values, (str, bytes, Mapping)) and isinstance(values, IterableABC):
            try:
                listed = list(values)
            except TypeError:  # a 0-d numpy array
                pass
        if listed is None:
            what = (f"a {type(values).__name__}, which would be swept one character at a time"
                    if isinstance(values, (str, bytes)) else type(values).__name__)
            raise TypeError(f"grid[{key!r}] must be a list of values to sweep (list, tuple, range, numpy array), got "
                            f"{values!r} ({what}); for one value write [{values!r}]")
        if not listed:
            raise ValueError(f"grid[{key!r}] is empty: give at least one value (a key with no values has no points)")
        err = _grid_key_error(base, key, listed[0])
        if err is not None:
            raise err
        out[key] = [_check_split(cost, v) for v in listed] if key == SPLIT else listed
    return out


def _check_arguments(base: Any, cost: Any, token_scale: Any, rollout_gpus: Any, train_gpus: Any,
                     simulate_kw: dict) -> None:
    """The mistakes that hold for every point: raise before the first (they made one error row per point)."""
    if not isinstance(base, ExperimentConfig):
        raise TypeError(f"base must be an ExperimentConfig (e.g. asyncrl.recipes.arith_grpo_cpu() or "
                        f"asyncrl.sim.scenarios.verl_dapo_7b(False)), got {type(base).__name__}")
    if not isinstance(cost, ClusterCostModel):
        called = " (a preset is a function: call it, e.g. h20_qwen25_7b())" if callable(cost) else ""
        raise TypeError(f"cost must be a ClusterCostModel (asyncrl.sim.presets.PRESETS), got {type(cost).__name__}"
                        f"{called}")
    if isinstance(token_scale, bool) or not isinstance(token_scale, numbers.Integral):
        raise TypeError(f"token_scale is real tokens per simulated token, a whole number >= 1; got {token_scale!r}")
    if token_scale < 1:
        raise ConfigError(f"token_scale is real tokens per simulated token, at least 1; got {token_scale}")
    for what, n in (("rollout_gpus", rollout_gpus), ("train_gpus", train_gpus)):
        if n is not None:
            _check_count(cost, what, n, what == "rollout_gpus")
    passed = [p for p in _SIMULATE_ARGS if p not in _OWN_ARGS]
    for kw in simulate_kw:
        if kw == "name":
            raise TypeError("sweep() names each point from its grid values: drop name=")
        if kw not in passed:
            close = difflib.get_close_matches(kw, passed, n=1, cutoff=0.5)
            raise TypeError(f"sweep() got an unexpected keyword argument {kw!r}; it passes on to simulate(): "
                            f"{', '.join(passed)}" + (f"; did you mean {close[0]!r}?" if close else ""))


def sweep(base: ExperimentConfig, cost: ClusterCostModel, grid: dict[str, Iterable[Any]], *,
          token_scale: int = 1, rollout_gpus: Optional[int] = None, train_gpus: Optional[int] = None,
          keep_results: bool = False, **simulate_kw: Any):
    """Simulate every combination of ``grid`` and tabulate the outcome.

    ``split`` means what :func:`~asyncrl.sim.simulate` makes of ``(rollout_gpus, train_gpus)``, which depends on
    the row: an async row (``hybrid_engine`` false) runs the replicas on ``rollout_gpus`` GPUs and the trainer on
    ``train_gpus`` others, ``rollout_gpus + train_gpus`` in all; a colocated row (``hybrid_engine`` true) has one
    pool of ``rollout_gpus`` GPUs that rollout and training take turns on, so ``(8, 8)`` is 8 GPUs there and 16 in
    an async row (and a colocated row with unequal numbers gets an ``error``). The ``gpus`` column is the total;
    to compare at equal GPUs, give the colocated rows ``(16, 16)`` against async ``(8, 8)``.

    Args:
        base: the starting config.
        cost: cluster cost model (a preset called, e.g. ``h20_qwen25_7b()``).
        grid: key -> a list of values (list, tuple, range, numpy array; one value is ``[value]``). Keys: dotted
            config keys, and ``"split"`` -> ``(rollout_gpus, train_gpus)`` pairs (GPUs; with a CPU preset, units
            of its cores), whole replicas and trainer ranks of ``cost``.
        token_scale: real tokens per simulated token, for every point (``response_length`` and the length
            workload's ``median`` are then in simulated tokens).
        rollout_gpus, train_gpus: the split of every point without a ``split`` key (default: simulate()'s).
        simulate_kw: passed to :func:`~asyncrl.sim.simulate` (``natural_length``, ``snapshot_every_s``, ...).
        keep_results: add a ``result`` column holding each :class:`SimResult`.

    Returns:
        ``pandas.DataFrame``, one row per combination: the grid values under their full keys, then
        :meth:`SimResult.summary`, whose short-named columns repeat a swept key as the run applied it (kept: every
        table has them, so sweeps over different keys concatenate, and they read ``-`` where the key does not
        apply, e.g. ``partial_rollout`` of a colocated point) (``rollout_gpus``, ``train_gpus``, ``gpus``: in all, ``samples_per_s``,
        ``step_s``: simulated seconds, ``trainer_idle_ratio``, ``rollouter_idle_ratio``, ``lag_mean``, ``lag_max``,
        ``dropped_stale``: prompt groups the staleness bound dropped, ``max_num_seqs``: seats per replica as
        simulated, ...). Combinations the config rejects get an ``error`` and no numbers.

    Raises:
        TypeError: ``base`` not a config, ``cost`` not a :class:`ClusterCostModel`, a grid value that is not a
            list of values (a string or a scalar), an unknown ``simulate_kw``.
        ValueError: an empty value list, a ``split`` value that is not a pair of whole numbers >= 1, a grid key
            that is a sweep() argument (``rollout_gpus``, ``token_scale``, ...).
        asyncrl.config.ConfigError: an unknown grid key (naming the closest), ``token_scale`` below 1, GPU counts
            that are not whole replicas / trainer ranks of ``cost``.
        All before the first point runs: each of these would fail every point.
    """
    import pandas as pd

    _check_arguments(base, cost, token_scale, rollout_gpus, train_gpus, simulate_kw)
    values_of = _grid_values(base, cost, grid)
    keys = list(values_of)
    rows = []
    for values in itertools.product(*(values_of[k] for k in keys)):
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


def _plottable(df, **columns: Optional[str]):
    """The rows of a sweep table that have numbers, after checking that ``columns`` (``x=...``) are its columns.

    Raises:
        ValueError: every row is an error (showing the first), or a column the table lacks (listing its columns).
    """
    if len(df) == 0:
        raise ValueError("the sweep table is empty: nothing to plot")
    if "error" in df and df["error"].notna().all():
        raise ValueError(f"every point of this sweep failed ({len(df)} row(s)): nothing to plot; the first error: "
                         f"{df['error'].iloc[0]}")
    have = [str(c) for c in df.columns]
    for arg, col in columns.items():
        if col is not None and col not in df.columns:
            close = difflib.get_close_matches(str(col), have, n=1, cutoff=0.5)
            raise ValueError(f"plot_sweep({arg}={col!r}): the table has no such column"
                             + (f"; did you mean {close[0]!r}?" if close else "") + f" (columns: {', '.join(have)})")
    return df[df["error"].isna()] if "error" in df else df


def plot_sweep(df, x: str, y: str = "samples_per_s", hue: Optional[str] = None, ax: Any = None,
               idle: bool = True) -> Any:
    """Line plot of ``y`` against ``x`` (one line per ``hue`` value), with the trainer's idle ratio
    on a second axis when ``idle``; rows with an ``error`` are left out. Returns the matplotlib axes.

    Raises:
        ValueError: ``x`` / ``y`` / ``hue`` not a column of ``df`` (the message lists them), or a table whose
            every row is an error (the message shows the first).
    """
    import matplotlib.pyplot as plt

    df = _plottable(df, x=x, y=y, hue=hue)
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


def _drawn_spans(spans: list, until: float, min_w: float) -> list:
    """``(start, width, label)`` bars of one lane up to ``until``: each span at its true width, except that a span
    narrower than ``min_w`` grows into the idle time next to it (after it, then before it) up to ``min_w``, never
    over another span: a lone 1 s weight load in a sync's pause stays visible, a prefill between decodes keeps its
    width."""
    spans = sorted((s, min(e, until), lab) for s, e, lab in spans if s < until)
    bars, reach = [], 0.0  # reach: the latest end of the spans before
    for i, (s, e, lab) in enumerate(spans):
        start, end = s, e
        if e - s < min_w and reach <= s:
            nxt = spans[i + 1][0] if i + 1 < len(spans) else until
            end = e + max(0.0, min(min_w - (e - s), nxt - e))
            start = s - max(0.0, min(min_w - (end - s), s - reach))
        bars.append((start, end - start, lab))
        reach = max(reach, e)
    return bars


def plot_timeline(result: SimResult, ax: Any = None, until: Optional[float] = None, max_replicas: int = 4) -> Any:
    """Gantt chart of a simulated run: each replica's decode / prefill / weight-load spans, the trainer's updates
    and the weight syncs, over virtual seconds (up to ``until``, default the whole run; the first ``max_replicas``
    replicas). Areas are true to time: every span is drawn at its width, except that a span narrower than 1/400
    of the axis (a 1 s weight load in a 700 s window) grows into the idle time beside it, never over another span,
    so a lone short event stays visible (a replica's many short prefills between decodes keep their true width).
    Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.5))
    until = until if until is not None else result.wall_s
    replicas = sorted({lane for lane, *_ in result.timeline.spans if lane.startswith("replica")},
                      key=lambda s: int(s.rsplit("_", 1)[-1]))[:max_replicas]
    lanes = replicas + ["trainer", "sync"]
    for y, lane in enumerate(lanes):
        bars = _drawn_spans([(s, e, lab) for ln, s, e, lab in result.timeline.spans if ln == lane], until, until / 400)
        for label in sorted({lab for *_, lab in bars}):
            ax.broken_barh([(s, w) for s, w, lab in bars if lab == label], (y - 0.4, 0.8),
                           facecolors=LANE_COLORS.get(label, "#999999"), linewidth=0, label=label)
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
