"""StalenessView: how off-policy the trained tokens are, and who waits for whom.

::

    trainer.lag_counts {lag: tokens}   --> histogram of parameter-version lag over trained tokens
    trainer/rollouter.param_version    --> current version (rollouter adopts it after each sync)
    rollouter.staleness_samples        --> vs max_required_samples (the rollouter pauses at the bound)
    trainer.idle_ratio, rollouter.idle_ratio (recorded per poll, x = elapsed_s) --> idle over time
                                     (a single snapshot: the trainer's history rows instead)
    rollouter.partial_spans [(min_v, max_v)] --> how many versions a partial rollout spanned

Lag = trainer version at the update minus the version that generated the token (0 = on-policy);
the trainer drops anything beyond ``staleness_bound`` (DESIGN.md invariant 3).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Optional

from widgets._common import SnapshotView, as_int, bar_html, sparkline, svg_lines


@dataclass
class StalenessModel:
    """What :class:`StalenessView` shows.

    Attributes:
        lag_bins: lags ``0..max(bound, max lag)``; ``lag_tokens`` the trained-token count per bin.
        lag_fraction: share of trained tokens per bin (0..1; all 0 before the first step).
        total_tokens: trained tokens counted.
        bound: ``staleness_bound`` (largest allowed lag).
        param_version: the trainer's version; ``rollout_version`` the rollouter's.
        staleness_samples / max_required_samples: the rollouter's admission budget.
        trainer_idle / rollouter_idle: ``[(time_s, ratio)]`` series.
        span_counts: ``{versions spanned - 1: samples}`` over recent partial rollouts.
        partial_spans: the recent ``(min_v, max_v)`` pairs.
        partial_produced: partial rollouts the rollouter produced (recent pairs spanning versions; includes
            samples not trained, e.g. still queued or dropped at shutdown).
        partial_trained: partial rollouts the trainer trained (``rollouter/partial_count`` summed over its
            steps; the number a run's table counts).
    """

    lag_bins: list[int]
    lag_tokens: list[int]
    lag_fraction: list[float]
    total_tokens: int
    bound: int
    param_version: int
    rollout_version: int
    staleness_samples: int
    max_required_samples: Optional[int]
    trainer_idle: list[tuple[float, float]] = field(default_factory=list)
    rollouter_idle: list[tuple[float, float]] = field(default_factory=list)
    span_counts: dict[int, int] = field(default_factory=dict)
    partial_spans: list[tuple[int, int]] = field(default_factory=list)
    mean_lag: float = 0.0
    partial_produced: int = 0
    partial_trained: int = 0


def lag_histogram(lag_counts: dict, bound: int = 0) -> tuple[list[int], list[int]]:
    """Dense histogram bins from ``{lag: tokens}`` (keys may be str after JSON).

    Returns:
        ``(bins, counts)`` with ``bins = [0, 1, ..., max(bound, largest lag)]``.
    """
    counts = {as_int(k): as_int(v) for k, v in (lag_counts or {}).items()}
    top = max([bound, *counts]) if counts else bound
    bins = list(range(0, max(0, top) + 1))
    return bins, [counts.get(b, 0) for b in bins]


def span_counts(spans: list) -> dict[int, int]:
    """``{max_v - min_v: n}`` over partial-rollout spans (pairs may arrive as lists)."""
    out: collections.Counter = collections.Counter()
    for pair in spans or []:
        lo, hi = pair[0], pair[1]
        if lo is not None and hi is not None:
            out[as_int(hi) - as_int(lo)] += 1
    return dict(sorted(out.items()))


def staleness_model(snapshot: dict, rollouter_idle: Optional[list[tuple[float, float]]] = None) -> StalenessModel:
    """Pure model of one snapshot (plus the rollouter idle series recorded by the caller)."""
    ro = snapshot.get("rollouter") or {}
    tr = snapshot.get("trainer") or {}
    budget = snapshot.get("budget") or {}
    bound = as_int(tr.get("staleness_bound", budget.get("staleness_bound")))
    bins, tokens = lag_histogram(tr.get("lag_counts") or {}, bound)
    total = sum(tokens)
    hist = tr.get("history") or []
    trainer_idle = [(float(r.get("time_s", r.get("step", i))), float(r["trainer/idle_ratio"]))
                    for i, r in enumerate(hist) if "trainer/idle_ratio" in r]
    spans = [(as_int(p[0]), as_int(p[1])) for p in ro.get("partial_spans") or [] if p[0] is not None]
    return StalenessModel(
        lag_bins=bins, lag_tokens=tokens, lag_fraction=[t / total if total else 0.0 for t in tokens],
        total_tokens=total, bound=bound,
        param_version=as_int(tr.get("param_version", ro.get("param_version"))),
        rollout_version=as_int(ro.get("param_version")),
        staleness_samples=as_int(ro.get("staleness_samples")),
        max_required_samples=ro.get("max_required_samples", budget.get("max_required_samples")),
        trainer_idle=trainer_idle, rollouter_idle=list(rollouter_idle or []),
        span_counts=span_counts(spans), partial_spans=spans,
        partial_produced=sum(1 for lo, hi in spans if hi != lo),
        partial_trained=sum(as_int(r.get("rollouter/partial_count", 0)) for r in hist),
        mean_lag=sum(b * t for b, t in zip(bins, tokens)) / total if total else 0.0)


class StalenessView(SnapshotView):
    """Live staleness panel: lag histogram, versions, staleness budget, idle ratios, partial spans.

    Args:
        history: polls of rollouter idle ratio kept (the trainer's comes from its step history).
    """

    title = "Staleness"

    def __init__(self, history: int = 300):
        super().__init__()
        self._ro_idle: collections.deque = collections.deque(maxlen=history)
        self._tr_idle: collections.deque = collections.deque(maxlen=history)

    def _compute(self, snapshot: dict) -> StalenessModel:
        t = float(snapshot.get("elapsed_s", len(self._ro_idle)))
        for series, part in ((self._ro_idle, "rollouter"), (self._tr_idle, "trainer")):
            ratio = (snapshot.get(part) or {}).get("idle_ratio")
            if ratio is not None and (not series or series[-1][0] != t):
                series.append((t, float(ratio)))
        model = staleness_model(snapshot, list(self._ro_idle))
        if len(self._tr_idle) >= 2:  # polled: same time base (experiment elapsed_s) as the rollouter's
            model.trainer_idle = list(self._tr_idle)
        return model

    def _body_html(self) -> str:
        m = self.model
        top = max(m.lag_tokens) if any(m.lag_tokens) else 1
        rows = []
        for b, n, f in zip(m.lag_bins, m.lag_tokens, m.lag_fraction):
            color = "#52c41a" if b == 0 else "#faad14" if b <= m.bound else "#f5222d"
            rows.append(f'<tr data-lag="{b}"><td>lag {b}</td><td>{bar_html(n / top, color)}</td>'
                        f"<td><code>{n}</code></td><td class='muted'>{100 * f:.1f}%</td></tr>")
        budget_frac = m.staleness_samples / m.max_required_samples if m.max_required_samples else None
        ti = [r for _, r in m.trainer_idle]
        ri = [r for _, r in m.rollouter_idle]
        spans = ", ".join(f"{k + 1} versions: {n}" for k, n in m.span_counts.items() if k > 0) or "none"
        last = ", ".join(f"v{a}&rarr;v{b}" for a, b in m.partial_spans[-6:] if b != a) or "&ndash;"
        return (
            f"<div>param version: trainer <b>v{m.param_version}</b>, rollouter <b>v{m.rollout_version}</b>"
            f" &middot; bound: lag &le; {m.bound} &middot; mean lag {m.mean_lag:.3f} over {m.total_tokens} tokens</div>"
            f"<table>{''.join(rows)}</table>"
            f"<div>staleness_samples <code>{m.staleness_samples} / {m.max_required_samples}</code> "
            f"{bar_html(budget_frac, '#722ed1')}</div>"
            f"<div>trainer idle (run so far) <code>{(ti or [0])[-1]:.2f}</code> "
            f"<span class='spark'>{sparkline(ti[-12:], 0, 1)}</span> &middot; rollouter idle (run so far) "
            f"<code>{(ri or [0])[-1]:.2f}</code> <span class='spark'>{sparkline(ri[-12:], 0, 1)}</span></div>"
            f"<div>partial rollouts: trained <code>{m.partial_trained}</code> &middot; produced "
            f"<code>{m.partial_produced}</code> <span class='muted'>(by the rollouter, recent; also those not trained:"
            f" queued or dropped at shutdown)</span> &middot; spanning: {spans} &middot; recent: {last}</div>")

    def idle_svg(self, width: int = 300, height: int = 110) -> str:
        """Trainer and rollouter idle ratio over time as inline SVG (used by the Dashboard)."""
        m = self.model
        if m is None:
            return svg_lines({}, width, height, "idle ratio")
        return svg_lines({"trainer": ([t for t, _ in m.trainer_idle], [r for _, r in m.trainer_idle], "#fa541c"),
                          "rollouter": ([t for t, _ in m.rollouter_idle], [r for _, r in m.rollouter_idle], "#13c2c2")},
                         width, height, "idle ratio", y_range=(0.0, 1.0), x_label="time (s)")

    def _plot(self) -> Any:
        from widgets.static import plot_staleness

        return plot_staleness(self.model)

    def _summary(self) -> str:
        m = self.model
        if m is None:
            return "no snapshot yet"
        lags = {b: n for b, n in zip(m.lag_bins, m.lag_tokens) if n}
        return (f"v{m.param_version}, lag_tokens={lags}, bound={m.bound}, "
                f"staleness_samples={m.staleness_samples}/{m.max_required_samples}")

