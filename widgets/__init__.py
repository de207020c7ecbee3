"""Notebook widgets for asyncrl: live concurrency funnel, staleness, trajectory masks, dashboard.

Each view turns a status snapshot (``Experiment.status_async()``) into a model (pure functions,
unit-tested), a live ipywidgets view, and static HTML / PNG snapshots for batch runs::

    from widgets import Dashboard
    dash = Dashboard(exp)
    dash.show()                      # live in JupyterLab, polling ~1.3 Hz on the kernel loop
    dash.save(exp.run_dir / "widgets")
"""

from widgets.curves import CurvesModel, TrainingCurves, curves_model
from widgets.dashboard import Dashboard
from widgets.funnel import ConcurrencyFunnel, FunnelModel, Layer, binding_layer, funnel_layers, funnel_model
from widgets.inspector import TrajectoryInspector, TrajectoryModel, check_lengths, tokens_html, trajectory_model
from widgets.poller import Poller
from widgets.staleness import StalenessModel, StalenessView, lag_histogram, span_counts, staleness_model

__all__ = [
    "ConcurrencyFunnel", "StalenessView", "TrajectoryInspector", "TrainingCurves", "Dashboard", "Poller",
    "FunnelModel", "Layer", "StalenessModel", "TrajectoryModel", "CurvesModel",
    "funnel_layers", "funnel_model", "binding_layer", "lag_histogram", "span_counts", "staleness_model",
    "trajectory_model", "check_lengths", "tokens_html", "curves_model",
]
