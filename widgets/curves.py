"""TrainingCurves: train reward, policy loss and held-out accuracy over trainer steps.

::

    trainer.history rows {step, param_version, reward/mean, actor/pg_loss, ...} --> reward, loss vs step
    rollouter.eval_history [{version, accuracy}]  --> accuracy vs the first step that reached each
                                                      version (version 0 at step 0), as in metrics.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from widgets._common import SnapshotView, as_int, svg_lines


@dataclass
class CurvesModel:
    """Series for :class:`TrainingCurves` (x = trainer step)."""

    steps: list[int] = field(default_factory=list)
    reward: list[Optional[float]] = field(default_factory=list)
    pg_loss: list[Optional[float]] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)
    global_steps: int = 0
    param_version: int = 0


def curves_model(snapshot: dict) -> CurvesModel:
    """Pure model: series from the trainer history and the rollouter's evaluation history."""
    tr = snapshot.get("trainer") or {}
    ro = snapshot.get("rollouter") or {}
    hist = tr.get("history") or []
    steps = [as_int(r.get("step", i + 1)) for i, r in enumerate(hist)]
    first_step: dict[int, int] = {}
    for r, s in zip(hist, steps):
        first_step.setdefault(as_int(r.get("param_version")), s)
    last = steps[-1] if steps else 0
    evals = ro.get("eval_history") or []
    return CurvesModel(
        steps=steps, reward=[r.get("reward/mean") for r in hist], pg_loss=[r.get("actor/pg_loss") for r in hist],
        eval_steps=[0 if (v := as_int(e.get("version"))) == 0 else first_step.get(v, last) for e in evals],
        eval_accuracy=[float(e.get("accuracy", 0.0)) for e in evals],
        global_steps=as_int(tr.get("global_steps", last)), param_version=as_int(tr.get("param_version")))


class TrainingCurves(SnapshotView):
    """Reward / accuracy and loss curves (inline SVG live; matplotlib for PNG)."""

    title = "Training curves"

    def _compute(self, snapshot: dict) -> CurvesModel:
        return curves_model(snapshot)

    def reward_svg(self, width: int = 320, height: int = 130) -> str:
        m = self.model or CurvesModel()
        return svg_lines({"train reward": (m.steps, m.reward, "#1890ff"),
                          "held-out acc": (m.eval_steps, m.eval_accuracy, "#52c41a")},
                         width, height, "reward / accuracy", y_range=(0.0, 1.0), x_label="trainer step")

    def loss_svg(self, width: int = 320, height: int = 130) -> str:
        m = self.model or CurvesModel()
        return svg_lines({"pg_loss": (m.steps, m.pg_loss, "#eb2f96")}, width, height, "actor/pg_loss",
                         x_label="trainer step")

    def _body_html(self) -> str:
        return f"<div>{self.reward_svg()} {self.loss_svg()}</div>"

    def _plot(self) -> Any:
        from widgets.static import plot_curves

        return plot_curves(self.model)

    def _summary(self) -> str:
        m = self.model
        if m is None:
            return "no snapshot yet"
        rew = next((r for r in reversed(m.reward) if r is not None), None)
        acc = m.eval_accuracy[-1] if m.eval_accuracy else None
        return f"step={m.global_steps}, v{m.param_version}, reward={rew}, accuracy={acc}"
