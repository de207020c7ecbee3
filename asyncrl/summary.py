"""What a finished run reports: :class:`Summary` (also ``summary.json``) and :class:`TrainerError`
(a run whose trainer raised, stopped cleanly, with its summary). Built by :meth:`asyncrl.experiment.Experiment.finish`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Summary:
    """What a finished run reports (also written to ``summary.json``).

    Attributes:
        run_dir: artifact directory.
        steps: trainer fit steps done; ``param_version``: weight syncs done.
        accuracy_before: held-out greedy accuracy at version 0 (0..1).
        accuracy_after: mean of the last ``trainer.eval_average_last`` evaluations (0..1).
        accuracy_after_evals: how many evaluations ``accuracy_after`` averages (the last ones after version 0).
        accounting: prompts taken vs trained / dropped / failed, with reasons (invariant 1).
        response_length_counts: trained rows by response length in tokens (model and tool tokens of the row;
            single-turn: what the engine generated), ``{tokens: rows}``; the workload a simulation of this run
            draws from (``asyncrl.sim.workload.empirical_lengths``).
        gradient_length_counts: the same, of the rows whose advantage is non-zero (GRPO: groups whose responses
            did not all score alike), recorded whatever the engine; the CPU engine trains only those when
            ``skip_zero_advantage`` is on (and one row of a mini-batch that has none). With
            ``response_length_counts``, the share a simulation of this run trains at each length
            (``asyncrl.sim.workload.gradient_fraction``).
        stale_length_counts: rows of the prompt groups the trainer dropped as stale (``dropped/stale_at_trainer``) by
            response length in tokens, ``{tokens: rows}``: generated and never trained. Under partial rollout the
            groups that outlive the staleness bound are the slow ones, so their mean beside the trained mean shows
            how much of the long tail a run leaves untrained (:meth:`stale_line`).
        wall_s: seconds from start to the end of the final evaluation.
        held_out: what the accuracy figures are (:func:`held_out`): ``{"metric", "before", "after"}`` with each
            figure's held-out rows, scored and failed samples, or ``{"none": why}`` for a run without held-out rows;
            ``{}`` in summaries written before it (the figures are then shown alone).
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
    response_length_counts: dict = field(default_factory=dict)
    gradient_length_counts: dict = field(default_factory=dict)
    stale_length_counts: dict = field(default_factory=dict)
    staleness_bound: int = 0
    stop_reason: str = ""
    last_checkpoint: Optional[str] = None
    resumed_from: Optional[str] = None
    accuracy_after_evals: int = 0
    held_out: dict = field(default_factory=dict)

    def __str__(self) -> str:
        a = self.accounting
        drops = ", ".join(f"{k} {v}" for k, v in sorted(a.get("dropped", {}).items())) or "none"
        fails = ", ".join(f"{k} {v}" for k, v in sorted(a.get("failed", {}).items()))
        return (f"run {self.run_dir}: {self.steps} steps, {self.param_version} syncs, {self.wall_s:.0f} s"
                f" (stopped: {self.stop_reason or 'n/a'})\n"
                f"  {self._held_out_line()}\n"
                f"  prompts: taken {a.get('taken')} = trained {a.get('trained')} + dropped {a.get('dropped_total')}"
                f" + failed {a.get('failed_total')}  (balanced: {a.get('balanced')})\n"
                f"  dropped by reason: {drops}\n"
                + (f"  failed by reason: {fails} (each kind's first traceback is in the log)\n" if fails else "")
                + ("  (*_at_shutdown: prompts the rollouter had taken ahead of the trainer, still queued, generating or"
                   " unconsumed when training stopped; counted, not failures)\n"
                   if any(k.endswith("_at_shutdown") for k in a.get("dropped", {})) else "")
                + (f"  {self.stale_line()}\n" if self.stale_line() else "") +
                f"  trained tokens by version lag: "
                + (", ".join(f"lag {k}: {v}" for k, v in sorted(self.lag_counts.items())) or "none")
                + f" (bound: lag <= {self.staleness_bound})"
                + self._eval_failure_line() + self._tool_lines())

    def stale_line(self) -> str:
        """:func:`stale_line` of this run (``""`` when nothing was dropped as stale)."""
        return stale_line(self.stale_length_counts, self.response_length_counts,
                          (self.accounting.get("dropped") or {}).get("stale_at_trainer"), self.staleness_bound)

    def _held_out_line(self) -> str:
        """``held-out greedy accuracy: before 37.5% over 4 scored of 16 (12 failed: not in the mean) -> after ...``:
        each figure with the held-out samples it is a mean of and those that failed (not in it); ``mean score`` for a
        reward that gives no accuracy (:func:`asyncrl.evaluation.accuracy_of`); no figure where every sample failed."""
        h = self.held_out
        if "none" in h:
            return f"held-out: {h['none']}"
        if not h:  # a summary written before held_out: the figures alone
            return (f"held-out greedy accuracy: before {_pct(self.accuracy_before)} -> after "
                    f"{_pct(self.accuracy_after)}{self._after_what()}")
        score = h.get("metric") == "mean score"
        name = "mean score (the reward gives no 'acc': not an accuracy)" if score else "accuracy"
        after = _figure(h.get("after"), score, self._after_what().strip(" ()"))
        return f"held-out greedy {name}: before {_figure(h.get('before'), score)} -> after {after}"

    def _after_what(self) -> str:
        """What the "after" figure is: the final evaluation, or the mean of the last few (the dashboard's
        header says the same once the run is done)."""
        n = self.accuracy_after_evals
        return "" if n == 0 else " (final evaluation)" if n == 1 else f" (mean of the last {n} evaluations)"

    def _eval_failure_line(self) -> str:
        """Held-out samples that failed over all evaluations, by reason (none: no line)."""
        reasons: dict = {}
        for e in self.evals:
            for reason, n in (e.get("eval/failed_reasons") or {}).items():
                reasons[reason] = reasons.get(reason, 0) + n
        return ("\n  held-out samples failed (not scored): " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
                if reasons else "")

    def _tool_lines(self) -> str:
        """Before/after of the evaluations' tool metrics (``eval/tool_*``, tool-using tasks) and the
        well-formed answer rate (``eval/format``, rules that report it).

        Each is a mean over the held-out samples of a per-sample number: a rate (``*_rate``, ``format``)
        stays a rate; a count (``tool_calls``, ``tool_call_success_count``, errors) becomes a count per
        sample, and the line says so. Seconds (``tool_s``) are timing, not learning: left out."""
        if not self.evals:
            return ""
        first, last = self.evals[0], self.evals[-1]
        keys = sorted(k for k in last if k.startswith(("eval/tool", "eval/format")) and not k.endswith("_s"))
        # a tool metric zero before and after says nothing; the well-formed rate is the point of tasks that report it
        shown = [k for k in keys if k.startswith("eval/format") or first.get(k) or last.get(k)]
        quiet = (f"\n  ({len(keys) - len(shown)} other eval/tool_* metrics: 0 before and after)"
                 if len(shown) < len(keys) else "")

        def name(k: str) -> str:
            return k[5:] if k.endswith("_rate") or k == "eval/format" else f"{k[5:]} per sample"
        return "".join(f"\n  {name(k)}: before {first.get(k, float('nan')):.3f} -> after {last[k]:.3f}"
                       for k in shown) + quiet


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _figure(f: Optional[dict], score: bool, what: str = "") -> str:
    """One figure of :func:`held_out` as the summary prints it: ``37.5% over 4 scored of 16 (12 failed: not in the
    mean)``, a mean score as a number, ``n/a: all 16 failed``, ``n/a`` (no evaluation)."""
    if not f:
        return "n/a"
    if f["value"] is None:
        return f"n/a: all {f['rows']} failed" if f["rows"] else "n/a"
    notes = [what] if what else []
    if f["failed"]:
        notes.append(f"{f['failed']} failed{' over them' if f['evals'] > 1 else ''}: not in the mean")
    if f.get("all_failed_evals"):
        notes.append(f"{f['all_failed_evals']} more evaluation(s) had every sample failed: left out")
    value = f"{f['value']:.3f}" if score else _pct(f["value"])
    # one evaluation with failures: over how many it is the mean ("of 16" read as 16 scored, session 31)
    scored = f" over {f['rows'] - f['failed']} scored" if f["failed"] and f["evals"] == 1 else ""
    return f"{value}{scored} of {f['rows']}" + (f" ({'; '.join(notes)})" if notes else "")


def held_out(evals: list[dict], average_last: int, none: str = "") -> dict:
    """The summary's held-out figures from a run's evaluations (:func:`asyncrl.evaluation.evaluate` results).

    ``before`` is the version-0 evaluation; ``after`` the mean of the last ``average_last`` evaluations after version 0
    (``trainer.eval_average_last``). A figure is a mean over scored samples only: each figure says how many held-out
    rows it covers and how many failed (not in the mean), and an evaluation whose every sample failed has no figure
    (``value`` None) and is left out of the ``after`` mean rather than counted as 0.

    Args:
        evals: the rollouter's ``eval_history``.
        average_last: how many of the last evaluations ``after`` averages.
        none: why the run has no held-out rows (``{"none": none}`` is returned), ``""`` when it has some.

    Returns:
        ``{"metric": "accuracy" | "mean score", "before": figure | None, "after": figure | None}``, a figure being
        ``{"value": mean or None, "rows": held-out rows of one evaluation, "scored", "failed", "evals": evaluations
        averaged, "all_failed_evals": evaluations left out as every sample failed}``.
    """
    if none:
        return {"none": none}
    after = [e for e in evals if e["version"] > 0][-average_last:]
    before = [evals[0]] if evals and evals[0]["version"] == 0 else []
    kinds = {e.get("accuracy_of", "rule") for e in evals}
    metric = "mean score" if kinds == {"score"} else "accuracy"
    return {"metric": metric, "before": _held_out_figure(before), "after": _held_out_figure(after)}


def _held_out_figure(evals: list[dict]) -> Optional[dict]:
    if not evals:
        return None
    scored = [e for e in evals if e.get("n", 1) > 0]  # "n" missing: an evaluation recorded before it was counted
    return {"value": sum(e["accuracy"] for e in scored) / len(scored) if scored else None,
            "rows": evals[-1].get("rows", evals[-1].get("n", 0) + evals[-1].get("eval/failed", 0)),
            "scored": sum(e.get("n", 0) for e in evals), "failed": sum(e.get("eval/failed", 0) for e in evals),
            "evals": len(scored), "all_failed_evals": len(evals) - len(scored)}


LONG_TAIL_RATIO = 1.5
"""Dropped-stale responses this many times longer than the trained ones on average: :func:`stale_line` says the long
tail trains less than its share."""


def stale_line(stale_counts: dict, trained_counts: dict, groups: Optional[int], bound: int) -> str:
    """One line on the responses of the groups dropped as stale against the trained ones (``""`` when none were
    dropped): their mean and longest length in tokens, and, when they are :data:`LONG_TAIL_RATIO` times the trained
    mean or more, that the bound cuts the long tail (a real run's :class:`Summary`, a simulated run's
    ``asyncrl sim``).

    Args:
        stale_counts / trained_counts: ``{response tokens: rows}`` (keys may be strings, as JSON leaves them).
        groups: prompt groups dropped stale (``None``: not said); ``bound``: the staleness bound (max version lag).
    """
    stale, trained = _mean_max(stale_counts), _mean_max(trained_counts)
    if stale is None:
        return ""
    line = ((f"{groups} group{'s' if groups != 1 else ''} " if groups else "groups ") + "dropped stale at the trainer: "
            f"{sum(int(v) for v in stale_counts.values())} responses, mean {stale[0]:.0f} tokens (longest {stale[1]})")
    if trained is None:
        return line
    ratio = stale[0] / max(1e-9, trained[0])
    line += f" against a mean of {trained[0]:.0f} tokens trained ({ratio:.1f}x)"
    if ratio >= LONG_TAIL_RATIO:
        line += (f"; the longest responses outlive the staleness bound (lag <= {bound}) and train less than their "
                 "share (README: 'The staleness bound and the long tail')")
    return line


def _mean_max(counts: dict) -> Optional[tuple[float, int]]:
    """``(mean, max)`` of ``{length: rows}`` (keys may be strings, as JSON leaves them); None when empty."""
    pairs = [(int(k), int(v)) for k, v in (counts or {}).items() if int(v) > 0]
    rows = sum(v for _, v in pairs)
    return (sum(k * v for k, v in pairs) / rows, max(k for k, _ in pairs)) if rows else None


class TrainerError(RuntimeError):
    """The trainer raised; the run was stopped cleanly. ``summary`` holds the balanced accounting and
    ``last_checkpoint`` the checkpoint to resume from (``None`` if none was written)."""

    def __init__(self, message: str, summary: "Summary"):
        super().__init__(message)
        self.summary = summary
        self.last_checkpoint = summary.last_checkpoint
