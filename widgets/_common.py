"""Shared pieces of the widgets: the snapshot-view base class, HTML/SVG helpers, tolerant readers.

Every view follows one pattern::

    snapshot dict --update()--> model (pure function, a dataclass; unit-tested)
                                  |--> live ipywidgets (built lazily on first display)
                                  |--> to_html()  static, self-contained HTML fragment
                                  '--> to_png()   static matplotlib figure

Models are computed without ipywidgets or a browser, so tests and batch runs need neither.
"""

from __future__ import annotations

import html
import logging
import math
import unicodedata
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

logger = logging.getLogger(__name__)

#: the inspector's legend: token kind -> (colour name, background). Notebooks name these colours in their
#: text; the HTML (``widgets._common.CSS``) and PNG (``widgets.static``) renderings use these values.
LEGEND = {"prompt": ("grey", "#f0f0f0"), "mask 1": ("blue", "#1890ff"), "mask 0": ("orange", "#ffe7ba")}

#: the funnel's bar colours, the same in the live widget, its HTML fallback and the PNG
FUNNEL_COLORS = {"binding": "#f5222d", "not bindable": "#bfbfbf", "full": "#faad14", "open": "#1890ff"}


def funnel_bar_color(layer: Any, binding: Optional[str]) -> str:
    """Colour of one funnel layer's bar: red binding, orange full (a full prefetch buffer too: grey at 100%
    read as empty), grey for a layer that cannot bind (shown for reference), blue otherwise (``FUNNEL_COLORS``)."""
    state = ("binding" if layer.key == binding else "full" if layer.full
             else "not bindable" if not layer.bindable else "open")
    return FUNNEL_COLORS[state]


SPARK_CHARS = "▁▂▃▄▅▆▇█"

CSS = """
<style>
.asyncrl-w {font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; font-size: 12px; color: #222;}
.asyncrl-w table {border-collapse: collapse;}
.asyncrl-w td, .asyncrl-w th {padding: 2px 6px; text-align: left; vertical-align: middle;}
.asyncrl-w .bar {background: #e8e8e8; width: 160px; height: 10px; border-radius: 2px; overflow: hidden;}
.asyncrl-w .bar > div {height: 10px;}
.asyncrl-w .binding td {font-weight: bold; background: #fff1f0;}
.asyncrl-w .spark {font-family: monospace; color: #555; letter-spacing: -1px;}
.asyncrl-w .warn {color: #a8071a; background: #fff1f0; padding: 2px 6px; border-left: 3px solid #f5222d;}
.asyncrl-w .ok {color: #237804;}
.asyncrl-w .muted {color: #888;}
.asyncrl-w .toks {font-family: monospace; white-space: pre-wrap; line-height: 1.7; word-break: break-all;}
.asyncrl-w .tok {box-shadow: inset -1px 0 0 rgba(255,255,255,.75);}
.asyncrl-w .tok.prompt {background: #f0f0f0; color: #777;}
.asyncrl-w .tok.m0 {background: #ffe7ba; color: #873800;}
.asyncrl-w .tok.m1 {color: #002766;}
.asyncrl-w .vbadge {color: #fff; background: #cf1322; border-radius: 3px; padding: 0 2px; font-size: 9px;}
.asyncrl-w .turn {border-left: 2px solid #722ed1; margin-left: 2px;}
.asyncrl-w .legend span {margin-right: 8px; padding: 0 4px;}
</style>
"""


# ---------------------------------------------------------------------- tolerant readers
def as_int(value: Any, default: int = 0) -> int:
    """``int(value)``, or ``default`` for ``None`` / non-numbers (snapshots may lack a field)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def count_limit(value: Any) -> Optional[tuple[int, Optional[int]]]:
    """Read a ``(count, limit)`` pair from the shapes a snapshot may use for a pool.

    Accepts ``{"count"|"busy"|"active"|"in_use"|"size": n, "limit"|"max"|"total"|"maxsize": m}``,
    ``[n, m]`` / ``(n, m)``, or a bare number (no limit). Returns ``None`` when absent.
    """
    if value is None:
        return None
    if isinstance(value, dict):
        count = next((value[k] for k in ("count", "busy", "active", "in_use", "size") if k in value), None)
        limit = next((value[k] for k in ("limit", "max", "total", "maxsize", "capacity") if k in value), None)
        if count is None:
            return None
        return as_int(count), (None if limit is None else as_int(limit))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return as_int(value[0]), (None if value[1] is None else as_int(value[1]))
    if isinstance(value, (int, float)):
        return int(value), None
    return None


# ---------------------------------------------------------------------- text / HTML helpers
def sparkline(values: Sequence[float], lo: Optional[float] = None, hi: Optional[float] = None) -> str:
    """Unicode block sparkline (cheap enough to redraw at every poll)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return ""
    lo = min(vals) if lo is None else lo
    hi = max(vals) if hi is None else hi
    span = (hi - lo) or 1.0
    n = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[max(0, min(n, round((v - lo) / span * n)))] for v in vals)


def bar_html(fraction: Optional[float], color: str) -> str:
    """A horizontal bar of ``fraction`` (0..1, clipped) as a div, for HTML tables."""
    width = 0.0 if fraction is None else max(0.0, min(1.0, fraction)) * 100
    return f'<div class="bar"><div style="width:{width:.1f}%;background:{color}"></div></div>'


def svg_lines(series: dict[str, tuple[Sequence[float], Sequence[float], str]], width: int = 300,
              height: int = 120, title: str = "", y_range: Optional[tuple[float, float]] = None,
              x_label: str = "") -> str:
    """A small inline SVG line chart (no JS, renders in exported HTML too).

    Args:
        series: ``{label: (xs, ys, color)}``.
        width, height: pixels.
        title: drawn top-left (say what the y axis is).
        y_range: fixed ``(lo, hi)``; default: the data range.
        x_label: the x axis's name, drawn under the axis between its end values.
    """
    pts = [(x, y) for xs, ys, _ in series.values() for x, y in zip(xs, ys) if y is not None]
    pad_l, pad_r, pad_t, pad_b = 34, 6, 30, 14
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'style="background:#fff;border:1px solid #eee">',
           f'<text x="4" y="11" font-size="10" fill="#333">{html.escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{width // 2 - 20}" y="{height // 2}" font-size="10" fill="#999">no data</text></svg>')
        return "".join(out)
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = y_range or (min(p[1] for p in pts), max(p[1] for p in pts))
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * (width - pad_l - pad_r)

    def sy(y: float) -> float:
        return height - pad_b - (y - y0) / (y1 - y0) * (height - pad_t - pad_b)

    out.append(f'<text x="2" y="{pad_t + 8}" font-size="9" fill="#888">{y1:.2g}</text>'
               f'<text x="2" y="{height - pad_b}" font-size="9" fill="#888">{y0:.2g}</text>'
               f'<text x="{pad_l}" y="{height - 2}" font-size="9" fill="#888">{x0:.4g}</text>'
               f'<text x="{width - pad_r - 24}" y="{height - 2}" font-size="9" fill="#888">{x1:.4g}</text>'
               + (f'<text x="{(pad_l + width - pad_r) // 2}" y="{height - 2}" font-size="9" fill="#888" '
                  f'text-anchor="middle">{html.escape(x_label)}</text>' if x_label else ""))
    lx = pad_l
    for label, (xs, ys, color) in series.items():
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        if coords:
            cx, cy = coords.split(" ")[0].split(",")
            marker = "" if len(xs) > 1 else f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>'
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>{marker}')
        out.append(f'<text x="{lx}" y="23" font-size="9" fill="{color}">&#9632; {html.escape(label)}</text>')
        lx += 6 * len(label) + 22
    out.append("</svg>")
    return "".join(out)


def wrap(body: str, title: str = "") -> str:
    """Wrap an HTML fragment in the widgets' CSS scope (self-contained, inline styles only)."""
    head = f"<b>{html.escape(title)}</b><br>" if title else ""
    return f'{CSS}<div class="asyncrl-w">{head}{body}</div>'


# ---------------------------------------------------------------------- base class
class SnapshotView:
    """Base of every widget: ``update(snapshot)`` -> model -> live widget / HTML / PNG.

    Subclasses implement :meth:`_compute` (snapshot -> model), :meth:`_body_html` (model -> HTML),
    :meth:`_plot` (model -> matplotlib figure) and optionally :meth:`_build` / :meth:`_refresh` for
    a richer live widget than the default ``ipywidgets.HTML`` of :meth:`_body_html`.
    """

    title = "asyncrl"

    def __init__(self) -> None:
        self.model: Any = None
        self._widget: Any = None

    # -- model
    def update(self, snapshot: dict) -> Any:
        """Recompute the model from a status snapshot and refresh the live widget (if shown)."""
        self.model = self._compute(snapshot)
        if self._widget is not None:
            self._refresh()
        return self.model

    def _compute(self, snapshot: dict) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- live widget
    @property
    def widget(self) -> Any:
        """The ipywidgets view (built on first access)."""
        if self._widget is None:
            self._widget = self._build()
            self._refresh()
        return self._widget

    def _build(self) -> Any:
        import ipywidgets as w

        return w.HTML()

    def _refresh(self) -> None:
        self._widget.value = self.to_html()

    def show(self) -> None:
        """Display the live widget in the current notebook cell.

        Returns ``None`` (like matplotlib's ``show``), so ``Dashboard(exp).show()`` as a cell's last
        line displays once; keep a handle with ``dash = Dashboard(exp); dash.show()``.

        The output gets a display id, so :meth:`refresh_display` can later replace its static
        ``text/html`` fallback with the final state (what exported / papermill notebooks show).
        """
        import uuid

        from IPython.display import display

        self._display_id = uuid.uuid4().hex
        display(self, display_id=self._display_id)

    def refresh_display(self, static: bool = False) -> None:
        """Re-send this object's display (widget view + current HTML fallback) to its output.

        Args:
            static: send only the HTML / text forms, replacing the live widget view in that output:
                exported HTML then shows the final state even where widget JavaScript cannot load
                (nbconvert prefers a saved widget view over the HTML fallback).
        """
        display_id = getattr(self, "_display_id", None)
        if display_id is not None:
            from IPython.display import update_display

            if static:
                update_display({"text/plain": repr(self), "text/html": self.to_html()}, raw=True,
                               display_id=display_id)
            else:
                update_display(self, display_id=display_id)

    # -- static
    def to_html(self) -> str:
        """Self-contained HTML snapshot of the current model (works without widget JS)."""
        if self.model is None:
            return wrap('<span class="muted">no snapshot yet</span>', self.title)
        return wrap(self._body_html(), self.title)

    def _body_html(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _plot(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_png(self, path: "str | Path", dpi: int = 100) -> Path:
        """Render the current model with matplotlib (Agg) to ``path``; returns the path."""

        return save_figure(self._plot(), Path(path), dpi=dpi)

    def show_static(self, png: "str | Path | None" = None) -> None:
        """Display the HTML snapshot (and, with ``png``, write and show that PNG) as plain outputs.

        For papermill / exported notebooks: these outputs need no widget JavaScript and show the
        state at the time of the call (call it last to keep the final state in the saved notebook).
        """
        from IPython.display import HTML, Image, display

        display(HTML(self.to_html()))
        if png is not None:
            display(Image(filename=str(self.to_png(png))))

    # -- rich display (like ``ray.init()``'s context): widget view + HTML fallback + text
    def _repr_mimebundle_(self, include: Optional[Iterable[str]] = None,
                          exclude: Optional[Iterable[str]] = None) -> dict:
        bundle = {"text/plain": repr(self), "text/html": self.to_html()}
        try:
            bundle.update(self.widget._repr_mimebundle_() or {})
        except Exception:  # no ipywidgets / no kernel: the HTML and text forms still show
            logger.debug("no live widget view", exc_info=True)
        bundle["text/plain"] = repr(self)
        return bundle

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._summary()})"

    def _summary(self) -> str:
        return "no snapshot yet" if self.model is None else "updated"


def visible(text: str) -> str:
    """A token's text as the views draw it: control characters other than newline and tab as ``\\x03``
    (fonts have no glyph for them: a garbled sample drew boxes in the page and made matplotlib warn)."""
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in text)


def _plt() -> Any:
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Save and close ``fig``; creates parent directories. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    _plt().close(fig)
    logger.debug("wrote %s", path)
    return path
