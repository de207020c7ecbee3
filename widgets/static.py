"""Static (matplotlib, Agg) renderings of every widget model, for batch runs and exported notebooks.

Widget JavaScript does not run in exported HTML or papermill outputs, so each view also renders a
PNG from the same model the live widget shows. ``draw_*`` functions draw on a given axes (the
Dashboard composes them); ``plot_*`` functions make a figure of their own.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from widgets._common import LEGEND, _plt, funnel_bar_color, visible  # the colours named in the notebooks

logger = logging.getLogger(__name__)

BLUE, GREEN, ORANGE, RED, PURPLE, GREY = "#1890ff", "#52c41a", "#faad14", "#f5222d", "#722ed1", "#bfbfbf"
MASK0_BG, PROMPT_BG, MASK1_RGB = LEGEND["mask 0"][1], LEGEND["prompt"][1], tuple(
    int(LEGEND["mask 1"][1][k:k + 2], 16) / 255 for k in (1, 3, 5))
CHAR_W_IN, LINE_H_IN, TOKEN_FONT_PT = 0.0669, 0.19, 8  # DejaVu Sans Mono at 8 pt: 0.602 em advance


def count_axis(ax: Any, label: str, axis: str = "x") -> None:
    """Label a counted axis (trainer steps, polls) and tick it at whole numbers only: matplotlib's default
    locator puts ticks at 0.5, 1.5, ... on a short run, steps that do not exist."""
    from matplotlib.ticker import MaxNLocator

    getattr(ax, f"set_{axis}label")(label, fontsize=8)
    getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def _empty(ax: Any, title: str, text: str = "no data yet") -> None:
    ax.set_title(title, fontsize=10, loc="left")
    ax.text(0.5, 0.5, text, ha="center", va="center", color="#999", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


# ---------------------------------------------------------------------- funnel
def draw_funnel(ax: Any, model: Any) -> None:
    """Horizontal utilisation bars, top layer first, binding layer red, ``count / limit`` labels."""
    if model is None or not model.layers:
        return _empty(ax, "Concurrency funnel")
    layers = model.layers
    ys = list(range(len(layers)))[::-1]
    for y, layer in zip(ys, layers):
        u = layer.utilisation
        color = funnel_bar_color(layer, model.binding)
        ax.barh(y, 1.0, color="#f0f0f0", height=0.6)
        ax.barh(y, min(1.0, u or 0.0), color=color, height=0.6)
        lim = "?" if layer.limit is None else layer.limit
        ax.text(1.02, y, f"{layer.count} / {lim}" + ("" if u is None else f"  ({100 * u:.0f}%)"),
                va="center", fontsize=8, fontweight="bold" if layer.key == model.binding else "normal")
    ax.set_yticks(ys)
    ax.set_yticklabels([layer.label for layer in layers], fontsize=8)
    for tick, layer in zip(ax.get_yticklabels(), layers):
        if layer.key == model.binding:
            tick.set_color(RED)
            tick.set_fontweight("bold")
    ax.set_xlim(0, 1.45)
    ax.set_xticks([0, 0.5, 1.0])
    ax.set_xticklabels(["0", "50%", "100%"], fontsize=8)
    binding = next((layer.label for layer in layers if layer.key == model.binding), "none")
    note = "  [paused for sync]" if model.paused else ""
    ax.set_title(f"Concurrency funnel - binding: {binding}{note}", fontsize=10, loc="left")
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)


def draw_funnel_history(ax: Any, model: Any) -> None:
    """Counts per layer over the recorded polls (utilisation, so layers share one axis)."""
    if model is None or not any(len(v) > 1 for v in model.history.values()):
        return _empty(ax, "funnel history (utilisation)", "needs 2+ polls")
    for layer in model.layers:
        vals = model.history.get(layer.key, [])
        if layer.limit:
            ax.plot([v / layer.limit for v in vals], label=layer.key, lw=2.2 if layer.key == model.binding else 1)
    ax.set_ylim(-0.05, 1.1)
    count_axis(ax, "poll")
    ax.set_ylabel("count / limit", fontsize=8)
    # beside the axes, not on them: at a peak most lines sit near 0 or 1, where any corner covers some
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, frameon=False)
    ax.set_title("funnel history (utilisation)", fontsize=10, loc="left")


def plot_funnel(model: Any, title: Optional[str] = None) -> Any:
    """Funnel bars and their history; ``title`` (e.g. the scenario and moment) above both."""
    plt = _plt()
    n = len(model.layers) if model is not None else 3
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.45 * n + 1.4 + (0.4 if title else 0)),
                                 gridspec_kw={"width_ratios": [3, 2]})
    draw_funnel(a1, model)
    draw_funnel_history(a2, model)
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left", fontweight="bold")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------- staleness
def draw_lag(ax: Any, model: Any) -> None:
    if model is None:
        return _empty(ax, "version lag of trained tokens")
    colors = [GREEN if b == 0 else ORANGE if b <= model.bound else RED for b in model.lag_bins]
    ax.bar(model.lag_bins, model.lag_tokens, color=colors)
    ax.axvline(model.bound + 0.5, color=RED, ls="--", lw=1, label=f"bound = {model.bound}")
    ax.set_xticks(model.lag_bins)
    ax.set_xlim(-0.6, max(model.lag_bins) + 0.9)
    ax.set_xlabel("trainer version - token version", fontsize=8)
    ax.set_ylabel("trained tokens", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title(f"version lag (v{model.param_version}, mean {model.mean_lag:.2f})", fontsize=10, loc="left")


def draw_idle(ax: Any, model: Any) -> None:
    if model is None or not (model.trainer_idle or model.rollouter_idle):
        return _empty(ax, "idle ratio")
    for series, label, color in ((model.trainer_idle, "trainer", "#fa541c"),
                                 (model.rollouter_idle, "rollouter", "#13c2c2")):
        if series:
            ax.plot([t for t, _ in series], [r for _, r in series], ".-" if len(series) < 3 else "-",
                    label=label, color=color)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("time (s)", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title("idle ratio", fontsize=10, loc="left")


def draw_budget(ax: Any, model: Any) -> None:
    if model is None:
        return _empty(ax, "staleness budget")
    lim = model.max_required_samples or max(1, model.staleness_samples)
    ax.barh([0], [lim], color="#f0f0f0")
    ax.barh([0], [model.staleness_samples], color=PURPLE)
    ax.set_yticks([])
    ax.set_xlim(0, lim * 1.05)
    ax.set_title(f"staleness_samples {model.staleness_samples} / {model.max_required_samples}", fontsize=10, loc="left")


def draw_spans(ax: Any, model: Any) -> None:
    if model is None or not model.span_counts:
        return _empty(ax, "partial-rollout spans", "no partial rollouts")
    ks = sorted(model.span_counts)
    ax.bar([k + 1 for k in ks], [model.span_counts[k] for k in ks], color=PURPLE)
    ax.set_xticks([k + 1 for k in ks])
    ax.set_xlabel("versions spanned by one sample", fontsize=8)
    ax.set_title(f"partial rollouts: {model.partial_produced} produced (recent), {model.partial_trained} trained",
                 fontsize=10, loc="left")


def plot_staleness(model: Any) -> Any:
    plt = _plt()
    fig = plt.figure(figsize=(10, 5.5))
    gs = fig.add_gridspec(3, 2, height_ratios=[3, 0.8, 3])
    draw_lag(fig.add_subplot(gs[0, 0]), model)
    draw_idle(fig.add_subplot(gs[0, 1]), model)
    draw_budget(fig.add_subplot(gs[1, :]), model)
    draw_spans(fig.add_subplot(gs[2, 0]), model)
    ax = fig.add_subplot(gs[2, 1])
    ax.axis("off")
    if model is not None:
        ax.text(0, 0.9, f"trainer v{model.param_version}, rollouter v{model.rollout_version}\n"
                f"trained tokens: {model.total_tokens}\nlag bound: {model.bound}", va="top", fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------- tokens
def _token_layout(tokens: list, cols: int) -> list[tuple[Any, str, int, int]]:
    """``(token, shown_text, col, row)`` with wrapping at ``cols`` and a new row after newlines."""
    out, col, row = [], 0, 0
    for t in tokens:
        text = visible(t.text).replace("\n", "↵").replace("\t", "→") or "∅"
        if col + len(text) > cols and col > 0:
            col, row = 0, row + 1
        out.append((t, text, col, row))
        col += len(text)
        if "\n" in t.text:
            col, row = 0, row + 1
    return out


def _token_color(t: Any) -> tuple[str, Any]:
    if t.mask is None:
        return "#777777", PROMPT_BG
    if t.mask == 0:
        return "#873800", MASK0_BG
    p = math.exp(t.logprob) if t.logprob is not None and t.logprob <= 0 else 1.0
    return "#002766", (*MASK1_RGB, 0.12 + 0.55 * p)


def draw_tokens(ax: Any, model: Any, show_prompt: bool = True, max_rows: Optional[int] = None) -> None:
    """Tokens as coloured boxes (prompt grey, mask 0 orange, mask 1 blue shaded by p), turns purple."""
    if model is None:
        return _empty(ax, "trajectory", "no trajectories yet")
    fig = ax.figure
    bbox = ax.get_position()
    w_in, h_in = bbox.width * fig.get_figwidth(), bbox.height * fig.get_figheight()
    cols = max(20, int(w_in / CHAR_W_IN))
    rows = max_rows or max(1, int(h_in / LINE_H_IN))
    tokens = (model.prompt if show_prompt else []) + model.response
    layout = _token_layout(tokens, cols)
    for k, (t, text, col, row) in enumerate(layout):
        if row >= rows:
            ax.text(0, row, f"... {len(tokens) - k} more tokens", fontsize=7, color="#999", family="monospace",
                    va="top")
            break
        fg, bg = _token_color(t)
        ax.add_patch(_rect(col, row + 0.1, len(text), 0.8, bg))
        ax.text(col, row + 0.5, text, fontsize=TOKEN_FONT_PT, family="monospace", color=fg, va="center", ha="left")
        if t.turn_start:
            ax.plot([col, col], [row + 0.05, row + 0.95], color=PURPLE, lw=1.5)
        if t.version_change:
            ax.plot([col, col], [row - 0.1, row + 1.0], color=RED, lw=2)
            ax.text(col, row, f"v{t.version}", fontsize=6, color=RED, va="bottom", ha="center")
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.axis("off")
    span = "-" if model.min_version is None else (f"v{model.min_version}" if model.min_version == model.max_version
                                                    else f"partial v{model.min_version}->v{model.max_version}")
    check = "lengths agree" if model.lengths_ok else "WARNING: " + "; ".join(model.warnings)
    reward = "not scored" if model.reward is None else f"reward={model.reward}"
    ax.set_title(f"sample {model.uid}  {reward}  turns={model.num_turns}  versions {span}  [{check}]",
                 fontsize=9, loc="left", color="black" if model.lengths_ok else RED)


def _rect(x: float, y: float, w: float, h: float, color: Any) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor=color, edgecolor="none")


def plot_tokens(model: Any, show_prompt: bool = True, cols: int = 120, max_rows: int = 40) -> Any:
    plt = _plt()
    tokens = [] if model is None else (model.prompt if show_prompt else []) + model.response
    rows = min(max_rows, (_token_layout(tokens, cols)[-1][3] + 1) if tokens else 2)
    fig = plt.figure(figsize=(cols * CHAR_W_IN + 0.2, rows * LINE_H_IN + 0.9))
    ax = fig.add_axes([0.01, 0.02, 0.98, 1 - 0.55 / fig.get_figheight()])
    draw_tokens(ax, model, show_prompt, max_rows=rows)
    from matplotlib.patches import Patch

    legend = [(f"prompt ({LEGEND['prompt'][0]})", PROMPT_BG),
              (f"mask 1 ({LEGEND['mask 1'][0]}: model; shade = p)", (*MASK1_RGB, 0.5)),
              (f"mask 0 ({LEGEND['mask 0'][0]}: tool / template)", MASK0_BG)]
    fig.legend(handles=[Patch(color=c, label=n) for n, c in legend], loc="lower right", fontsize=7, ncol=3,
               frameon=False)
    return fig


# ---------------------------------------------------------------------- curves
def draw_reward(ax: Any, model: Any) -> None:
    if model is None or not (model.steps or model.eval_steps):
        return _empty(ax, "reward / accuracy")
    ax.plot(model.steps, [r if r is not None else float("nan") for r in model.reward], color=BLUE, label="train reward")
    if model.eval_steps:
        ax.plot(model.eval_steps, model.eval_accuracy, "o-", color=GREEN, label="held-out accuracy")
    ax.set_ylim(-0.02, 1.02)
    count_axis(ax, "trainer step")
    ax.set_ylabel("reward / accuracy", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("reward / accuracy", fontsize=10, loc="left")


def draw_loss(ax: Any, model: Any) -> None:
    if model is None or not any(v is not None for v in model.pg_loss):
        return _empty(ax, "actor/pg_loss")
    ax.plot(model.steps, [v if v is not None else float("nan") for v in model.pg_loss], color="#eb2f96")
    count_axis(ax, "trainer step")
    ax.set_ylabel("pg_loss", fontsize=8)
    ax.set_title("actor/pg_loss", fontsize=10, loc="left")


def plot_curves(model: Any) -> Any:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3))
    draw_reward(a1, model)
    draw_loss(a2, model)
    fig.tight_layout()
    return fig
