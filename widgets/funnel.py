"""ConcurrencyFunnel: every layer a prompt passes through, its current count vs its limit.

::

    dataloader --> pending_queue      (bound: max_required_samples; full by design, a prefetch buffer)
               --> staleness_samples  (< max_required_samples, reset after each weight sync)
               --> active_tasks       (< max_concurrent_samples)
               --> agent_loop_workers (pool, when the snapshot has one)
               --> sandboxes          (when the snapshot has them)
               --> replica in-flight  (per replica, from the GlobalRequestLoadBalancer)
               --> message_queue      (maxsize = max_required_samples) --> trainer

The **binding layer** is the most downstream layer at its limit (a full layer back-pressures all
layers above it, so the furthest-down full one is the cause); when none is full, the layer with the
highest utilisation. The pending queue is shown but never binding: the feed loop keeps it full.
"""

from __future__ import annotations

import collections
import html
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from widgets._common import SnapshotView, as_int, bar_html, count_limit, funnel_bar_color, sparkline

#: the one line under the funnel's head that says what its "binding layer" is (GLOSSARY.md#binding-layer)
BINDING_NOTE = "the binding layer (red) is the one at its limit, or the fullest when none is: it sets the pace"

#: keys looked up in the rollouter snapshot for optional pools (shape: see ``count_limit``)
OPTIONAL_POOLS = (("agent_loop_workers", "AgentLoopWorker pool"), ("sandboxes", "sandboxes"))


@dataclass
class Layer:
    """One funnel layer.

    Attributes:
        key: stable id (``pending_queue``, ``active_tasks``, ``replica:<server_id>`` ...).
        label: what the widget shows.
        count: current occupancy (samples, or requests for replicas).
        limit: capacity; ``None`` when the snapshot does not say.
        bindable: whether this layer can be the binding one (the prefetch buffer cannot).
    """

    key: str
    label: str
    count: int
    limit: Optional[int]
    bindable: bool = True

    @property
    def utilisation(self) -> Optional[float]:
        """``count / limit`` (may exceed 1 right after a limit shrinks); ``None`` without a limit."""
        if not self.limit:
            return None
        return self.count / self.limit

    @property
    def full(self) -> bool:
        return self.utilisation is not None and self.utilisation >= 1.0


@dataclass
class FunnelModel:
    """What :class:`ConcurrencyFunnel` shows for one snapshot."""

    layers: list[Layer]
    binding: Optional[str]
    paused: bool = False
    state: str = ""
    history: dict[str, list[int]] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    """Prompt groups the trainer dropped after the queue, by reason (``stale``, ``dapo_no_signal``)."""

    def layer(self, key: str) -> Layer:
        return next(layer for layer in self.layers if layer.key == key)


def funnel_layers(snapshot: dict, replica_limit: Optional[int] = None) -> list[Layer]:
    """The funnel layers of a status snapshot, top (dataloader) to bottom (trainer).

    Args:
        snapshot: ``Experiment.status_async()`` result.
        replica_limit: in-flight request capacity per replica (e.g. vLLM ``max_num_seqs``), used
            when the load-balancer snapshot carries no limit of its own.
    """
    ro = snapshot.get("rollouter") or {}
    budget = snapshot.get("budget") or {}
    mq = snapshot.get("message_queue") or {}
    lb = snapshot.get("load_balancer") or {}
    max_req = ro.get("max_required_samples", budget.get("max_required_samples"))
    layers = [
        Layer("pending_queue", "pending_queue (dataloader)", as_int(ro.get("pending_queue")),
              ro.get("pending_queue_max", max_req), bindable=False),
        Layer("staleness_samples", "staleness_samples", as_int(ro.get("staleness_samples")), max_req),
        Layer("active_tasks", "active_tasks", as_int(ro.get("active_tasks")),
              ro.get("max_concurrent_samples", budget.get("max_concurrent_samples"))),
    ]
    for key, label in OPTIONAL_POOLS:
        pair = count_limit(ro.get(key, snapshot.get(key)))
        if pair is not None:
            layers.append(Layer(key, label, pair[0], pair[1]))
    limits = lb.get("limits") or {}
    default_limit = lb.get("max_in_flight_per_server", replica_limit)
    for sid, n in sorted((lb.get("in_flight") or {}).items()):
        layers.append(Layer(f"replica:{sid}", f"{sid} in-flight requests", as_int(n), limits.get(sid, default_limit)))
    if mq:
        layers.append(Layer("message_queue", "MessageQueue", as_int(mq.get("size")), mq.get("maxsize", max_req)))
    for layer in layers:
        layer.limit = None if layer.limit is None else as_int(layer.limit)
    return layers


def binding_layer(layers: list[Layer]) -> Optional[str]:
    """Key of the binding layer: the most downstream full one, else the highest utilisation.

    Returns ``None`` when no bindable layer has a limit or every utilisation is 0.
    """
    candidates = [(i, layer) for i, layer in enumerate(layers) if layer.bindable and layer.utilisation is not None]
    full = [(i, layer) for i, layer in candidates if layer.full]
    if full:
        return full[-1][1].key
    best = max(candidates, key=lambda c: (c[1].utilisation, c[0]), default=None)
    if best is None or best[1].utilisation == 0:
        return None
    return best[1].key


def funnel_model(snapshot: dict, replica_limit: Optional[int] = None) -> FunnelModel:
    """Pure model of one snapshot (no history): layers, binding layer, paused flag."""
    layers = funnel_layers(snapshot, replica_limit)
    ro = snapshot.get("rollouter") or {}
    drops = {str(k): as_int(v) for k, v in ((snapshot.get("trainer") or {}).get("dropped") or {}).items() if v}
    return FunnelModel(layers=layers, binding=binding_layer(layers), paused=bool(ro.get("paused")),
                       state=str(snapshot.get("state", "")), drops=drops)


class ConcurrencyFunnel(SnapshotView):
    """Live funnel: count vs limit per layer, the binding layer highlighted, a short history.

    Args:
        replica_limit: per-replica in-flight capacity when the load balancer does not report one.
        history: number of polls kept per layer (a deque).

    Example::

        funnel = ConcurrencyFunnel()
        funnel.update(await exp.status_async())
        funnel            # live widget in a notebook, HTML elsewhere
    """

    title = "Concurrency funnel"

    def __init__(self, replica_limit: Optional[int] = None, history: int = 60):
        super().__init__()
        self.replica_limit = replica_limit
        self.history: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=history))
        self.times: collections.deque = collections.deque(maxlen=history)
        self._rows: dict[str, Any] = {}

    def _compute(self, snapshot: dict) -> FunnelModel:
        model = funnel_model(snapshot, self.replica_limit)
        self.times.append(snapshot.get("elapsed_s", time.time()))
        for layer in model.layers:
            self.history[layer.key].append(layer.count)
        model.history = {k: list(v) for k, v in self.history.items()}
        return model

    def pin(self, snapshot: dict, title: Optional[str] = None) -> FunnelModel:
        """Show one chosen moment (e.g. a run's peak load) instead of the latest poll, under ``title``.

        The history (sparklines) keeps every poll recorded so far; nothing is appended. Re-displayed
        outputs, PNG and HTML snapshots show this moment.
        """
        model = funnel_model(snapshot, self.replica_limit)
        model.history = {k: list(v) for k, v in self.history.items()}
        if title:
            self.title = title
        self.model = model
        if self._widget is not None:
            self._refresh()
        return model

    # -- live widget: one row per layer (label | progress bar | numbers | sparkline)
    def _build(self) -> Any:
        import ipywidgets as w

        self._head = w.HTML()
        self._grid = w.VBox()
        return w.VBox([self._head, self._grid], layout=w.Layout(min_width="460px", margin="0 16px 0 0"))

    def _row(self, key: str) -> Any:
        import ipywidgets as w

        if key not in self._rows:
            label = w.HTML(layout=w.Layout(width="230px"))
            bar = w.IntProgress(min=0, max=1, layout=w.Layout(width="120px"))
            num = w.HTML(layout=w.Layout(width="86px"))
            spark = w.HTML(layout=w.Layout(width="110px"))
            self._rows[key] = (w.HBox([label, bar, num, spark]), label, bar, num, spark)
        return self._rows[key]

    def _refresh(self) -> None:
        m = self.model
        if m is None:
            self._head.value = f"<b>{self.title}</b><br>no snapshot yet"
            return
        self._head.value = self._head_live(m)
        rows = []
        for layer in m.layers:
            box, label, bar, num, spark = self._row(layer.key)
            with bar.hold_sync():
                bar.max = max(1, layer.limit or layer.count or 1)
                bar.value = min(layer.count, bar.max)
                bar.bar_style = ("danger" if layer.key == m.binding else "" if not layer.bindable else
                                 "warning" if layer.full else "info")
                bar.style.bar_color = funnel_bar_color(layer, m.binding)  # as the HTML fallback and the PNG
            text = f"<b>{html.escape(layer.label)}</b>" if layer.key == m.binding else html.escape(layer.label)
            label.value = f'<span style="white-space:nowrap">{text}</span>'
            num.value = f"<code>{layer.count} / {layer.limit if layer.limit is not None else '?'}</code>"
            spark.value = (f'<span style="font-family:monospace;font-size:9px;color:#8c8c8c;white-space:nowrap">'
                           f'{sparkline(m.history.get(layer.key, [])[-20:], lo=0, hi=layer.limit)}</span>')
            rows.append(box)
        if list(self._grid.children) != rows:
            self._grid.children = rows

    def _head_html(self, m: FunnelModel) -> str:
        binding = next((layer.label for layer in m.layers if layer.key == m.binding), "none")
        paused = ' &middot; <span class="warn">rollouter paused for weight sync</span>' if m.paused else ""
        drops = ", ".join(f"{html.escape(k)} {v}" for k, v in sorted(m.drops.items()))
        dropped = f"<br>trainer dropped (after the queue): {drops}" if drops else ""
        return (f"binding layer: <b style='color:#cf1322'>{html.escape(binding)}</b>{paused}{dropped}"
                f"<br><span style='color:#888;font-size:90%'>{BINDING_NOTE}</span>")

    def _head_live(self, m: FunnelModel) -> str:
        return f"<b>{html.escape(self.title)}</b><br>{self._head_html(m)}"

    # -- static
    def _body_html(self) -> str:
        m = self.model
        rows = []
        for layer in m.layers:
            u = layer.utilisation
            color = funnel_bar_color(layer, m.binding)
            cls = ' class="binding"' if layer.key == m.binding else ""
            lim = "?" if layer.limit is None else layer.limit
            pct = "" if u is None else f"{100 * u:.0f}%"
            spark = sparkline(m.history.get(layer.key, []), lo=0, hi=layer.limit)
            rows.append(f'<tr{cls} data-layer="{html.escape(layer.key)}"><td>{html.escape(layer.label)}</td>'
                        f"<td>{bar_html(u, color)}</td><td><code>{layer.count} / {lim}</code></td>"
                        f'<td class="muted">{pct}</td><td class="spark">{spark}</td></tr>')
        return f"<div>{self._head_html(m)}</div><table>{''.join(rows)}</table>"

    def _plot(self) -> Any:
        from widgets.static import plot_funnel

        return plot_funnel(self.model, title=self.title if self.title != type(self).title else None)

    def _summary(self) -> str:
        m = self.model
        if m is None:
            return "no snapshot yet"
        parts = [f"{layer.key}={layer.count}/{layer.limit if layer.limit is not None else '?'}" for layer in m.layers]
        return f"binding={m.binding!r}, " + ", ".join(parts)
