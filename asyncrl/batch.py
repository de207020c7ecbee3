"""Batch runs of the notebooks with papermill: ``asyncrl batch NOTEBOOK -p key value ...``.

::

    NOTEBOOK + parameters ──papermill (kernel cwd = run dir)──> run dir
        runs/batch/<notebook>__<YYYYmmdd-HHMMSS>/
            <notebook>.ipynb   the executed notebook (parameters injected after the ``parameters`` cell,
                               a finalize cell appended: widget state and HTML fallbacks are final)
            snapshots/         widget PNG + HTML (passed to the notebook as ``snapshot_dir``)
            snapshots/final/   a PNG + HTML of every widget view bound to a name at the end
            figures/           every PNG output of the executed notebook (matplotlib plots ...)
            runs/              the experiments' own artifacts (metrics.csv, plot.png, summary.json)
            batch.json         parameters, timings, status, produced files, and the code that ran:
                               the kernel's asyncrl import path and its git commit (``code``)

Why the finalize cell: papermill (nbclient) records only messages whose parent is the running cell,
so widget updates sent by a dashboard's poller after its cell finished would be lost, and the saved
widget state would be the first frame. The appended cell stops the pollers and re-sends every live
widget's state and every view's display from the running cell.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from asyncrl.batch_params import (CLOSE_ON_ERROR_ENV, BatchParameterError, check_kernel,  # noqa: F401  (re-exported)
                                  check_parameters, parse_value)

logger = logging.getLogger(__name__)

FINALIZE_TAG = "asyncrl-batch-finalize"

FINALIZE_SOURCE = '''# asyncrl batch: stop live polling, make widget state final, snapshot the views bound to names
def _asyncrl_batch_finalize(snapshot_dir):
    import os
    written = []
    try:
        from widgets.poller import Poller
        Poller.stop_all()
        from widgets._common import SnapshotView
    except ImportError:
        return written
    ns = get_ipython().user_ns
    views = {k: v for k, v in list(ns.items()) if isinstance(v, SnapshotView) and not k.startswith("_")}
    for view in {id(v): v for v in views.values()}.values():
        view.refresh_display()
    try:
        import ipywidgets
        for w in list(ipywidgets.widgets.widget._instances.values()):
            w.send_state()
    except Exception as exc:
        print("widget state not re-sent:", exc)
    out = os.path.join(snapshot_dir, "final")
    os.makedirs(out, exist_ok=True)
    for name, view in views.items():
        if view.model is None:
            continue
        try:
            written.append(str(view.to_png(os.path.join(out, f"{name}.png"))))
            with open(os.path.join(out, f"{name}.html"), "w", encoding="utf-8") as f:
                f.write("<!doctype html><meta charset='utf-8'>" + view.to_html())
        except Exception as exc:
            print(f"snapshot of {name} failed: {exc}")
    return written

_asyncrl_batch_finalize({snapshot_dir!r})
try:  # the code that ran, as the kernel imported it (batch.json "code")
    import json as _json
    from asyncrl.batch import code_info as _code_info
    with open({code_json!r}, "w") as _f:
        _json.dump(_code_info(), _f)
except ImportError:
    pass'''


@dataclass
class BatchResult:
    """What :func:`run_notebook` produced.

    Attributes:
        run_dir: the run directory.
        notebook: the executed notebook (written even when a cell failed).
        snapshots: PNG files under ``snapshots/`` (widget snapshots).
        figures: PNG outputs extracted from the executed notebook into ``figures/``.
        ok: every cell ran without error.
        error: the failing cell's error (``ename: evalue``), else ``None``.
        wall_s: seconds of execution.
    """

    run_dir: Path
    notebook: Path
    snapshots: list[Path] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    ok: bool = True
    error: Optional[str] = None
    wall_s: float = 0.0


def default_run_dir(notebook: str | Path, root: str | Path = "runs/batch", when: Optional[float] = None) -> Path:
    """``<root>/<notebook stem>__<YYYYmmdd-HHMMSS>`` (a ``-2``, ``-3`` ... suffix if it exists)."""
    stem = Path(notebook).stem
    base = Path(root) / f"{stem}__{time.strftime('%Y%m%d-%H%M%S', time.localtime(when or time.time()))}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def code_info() -> dict[str, Any]:
    """Where ``asyncrl`` was imported from in this process, and the git commit of that checkout.

    Returns:
        ``{"asyncrl_path", "python", "git_commit", "git_dirty"}``; the git fields are ``None`` when
        asyncrl is not imported from a git checkout (e.g. an installed wheel).
    """
    import subprocess
    import sys

    import asyncrl

    path = Path(asyncrl.__file__).resolve().parent
    info: dict[str, Any] = {"asyncrl_path": str(path), "python": sys.executable, "git_commit": None, "git_dirty": None}
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
        if head.returncode == 0:
            info["git_commit"] = head.stdout.strip()
            status = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=20)
            info["git_dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.info("no git information for %s: %s", path, exc)
    return info


def _with_finalize_cell(nb: Any, snapshot_dir: Path, code_json: Path) -> Any:
    import nbformat

    source = FINALIZE_SOURCE.replace("{snapshot_dir!r}", repr(str(snapshot_dir)))
    cell = nbformat.v4.new_code_cell(source.replace("{code_json!r}", repr(str(code_json))))
    cell.metadata["tags"] = [FINALIZE_TAG]
    cell.metadata["jupyter"] = {"source_hidden": True}
    nb.cells.append(cell)
    return nb


def extract_pngs(nb: Any, out_dir: Path) -> list[Path]:
    """Write every ``image/png`` output of ``nb`` to ``out_dir/cell<NN>_<k>.png``; returns the paths. ``NN`` is the
    cell's index in the notebook as written (the first cell 00): papermill's injected parameters cell is not counted,
    so a figure keeps its cell's number with or without ``-p`` parameters (it was one higher with them)."""
    paths = []
    cells = [c for c in nb.cells if "injected-parameters" not in (c.get("metadata") or {}).get("tags", [])]
    for i, cell in enumerate(cells):
        k = 0
        for output in cell.get("outputs", []):
            data = output.get("data") or {}
            if "image/png" in data:
                out_dir.mkdir(parents=True, exist_ok=True)
                path = out_dir / f"cell{i:02d}_{k}.png"
                path.write_bytes(base64.b64decode(data["image/png"]))
                paths.append(path)
                k += 1
    return paths


def _code_that_ran(code_json: Path) -> dict[str, Any]:
    """The kernel's :func:`code_info` (written by the finalize cell); this process's when the notebook
    stopped before it (``"seen_by": "runner"``)."""
    try:
        return {**json.loads(code_json.read_text(encoding="utf-8")), "seen_by": "kernel"}
    except (OSError, ValueError):
        return {**code_info(), "seen_by": "runner"}


def _first_error(nb: Any) -> Optional[str]:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return f"{output.get('ename')}: {output.get('evalue')}"
    return None


def run_notebook(notebook: str | Path, parameters: Optional[dict[str, Any]] = None, *,
                 run_dir: str | Path | None = None, kernel_name: Optional[str] = None,
                 env: Optional[dict[str, str]] = None, cell_timeout: Optional[float] = None,
                 log_output: bool = False, start_timeout: float = 120.0) -> BatchResult:
    """Execute ``notebook`` with papermill into a run directory (see the module docstring).

    Args:
        notebook: the ``.ipynb`` to run (its ``parameters``-tagged cell gets the parameters).
        parameters: papermill parameters; ``snapshot_dir`` defaults to ``<run_dir>/snapshots``.
        run_dir: default :func:`default_run_dir`; created; the kernel's working directory.
        kernel_name: Jupyter kernel (default: the notebook's kernelspec, e.g. ``python3``).
        env: extra environment variables for the kernel (e.g. ``{"CI": "1"}`` for smoke sizes).
        cell_timeout: per-cell limit in seconds (``None``: no limit).
        log_output: stream cell outputs to the log (papermill ``--log-output``).
        start_timeout: seconds to wait for the kernel to start.

    Returns:
        A :class:`BatchResult`; ``ok`` is False (and ``error`` set) when a cell raised. The executed
        notebook is written in both cases.

    Raises:
        FileNotFoundError: ``notebook`` does not exist.
        BatchParameterError: a parameter the notebook does not declare, or of a type papermill cannot
            pass (see :mod:`asyncrl.batch_params`), or a kernel that is not installed
            (:func:`~asyncrl.batch_params.check_kernel`); checked before anything runs.
        ImportError: papermill / nbformat are not installed (``pip install -e .[notebooks]``).
    """
    import nbformat
    import papermill as pm

    src = Path(notebook).resolve()
    if not src.is_file():
        raise FileNotFoundError(f"notebook not found: {src}")
    parameters = check_parameters(src, dict(parameters or {}))
    kernel_name = check_kernel(src, kernel_name)
    rd = Path(run_dir) if run_dir is not None else default_run_dir(src)
    rd = rd.resolve()
    rd.mkdir(parents=True, exist_ok=True)
    snapshots = rd / "snapshots"
    params = {"snapshot_dir": str(snapshots), **(parameters or {})}
    out_nb = rd / src.name
    code_json = rd / "code.json"
    code_json.unlink(missing_ok=True)
    nb = _with_finalize_cell(nbformat.read(src, as_version=4), Path(params["snapshot_dir"] or snapshots), code_json)
    saved_env = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    os.environ["ASYNCRL_BATCH_RUN_DIR"] = str(rd)
    # the first error ends the run unless a cell is tagged to raise: start_ray then closes Ray at that error
    expected = any("raises-exception" in c.get("metadata", {}).get("tags", []) for c in nb.cells)
    os.environ[CLOSE_ON_ERROR_ENV] = "0" if expected else "1"
    t0 = time.time()
    error = None
    try:
        pm.execute_notebook(nb, str(out_nb), parameters=params, kernel_name=kernel_name, cwd=str(rd),
                            log_output=log_output, progress_bar=False, execution_timeout=cell_timeout,
                            start_timeout=start_timeout, report_mode=False)
    except pm.PapermillExecutionError as exc:
        error = f"{exc.ename}: {exc.evalue}"
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.environ.pop("ASYNCRL_BATCH_RUN_DIR", None)
        os.environ.pop(CLOSE_ON_ERROR_ENV, None)
    wall = time.time() - t0
    executed = nbformat.read(out_nb, as_version=4)
    error = error or _first_error(executed)
    result = BatchResult(run_dir=rd, notebook=out_nb, ok=error is None, error=error, wall_s=wall,
                         snapshots=sorted(Path(params["snapshot_dir"] or snapshots).rglob("*.png")),
                         figures=extract_pngs(executed, rd / "figures"))
    meta = {**{k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()},
            "snapshots": [str(p) for p in result.snapshots], "figures": [str(p) for p in result.figures],
            "source": str(src), "parameters": params, "kernel_name": kernel_name, "env": env or {},
            "code": _code_that_ran(code_json)}
    (rd / "batch.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    logger.info("batch run of %s: %s in %.0f s -> %s", src.name, "ok" if result.ok else error, wall, rd)
    return result
