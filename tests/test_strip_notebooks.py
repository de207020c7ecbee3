"""scripts/strip_notebooks.py: outputs stripped except the nbval references, which --record copies in."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("strip_notebooks", REPO / "scripts" / "strip_notebooks.py")
strip_notebooks = importlib.util.module_from_spec(_spec)
sys.modules["strip_notebooks"] = strip_notebooks
_spec.loader.exec_module(strip_notebooks)


def _nb(claims_output: bool) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    work = nbformat.v4.new_code_cell("x = 1\nx", id="c00")
    checked = nbformat.v4.new_code_cell("nb.claims()", id="c01")
    checked.metadata["tags"] = ["nbval-check-output"]
    if claims_output:
        work.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "1"}, execution_count=3)]
        checked.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "✓ a\n✓ b"}, execution_count=4)]
        work.execution_count, checked.execution_count = 3, 4
    nb.cells = [work, checked]
    return nb


def test_strip_keeps_only_the_checked_cells_outputs_without_counts():
    nb = strip_notebooks.strip(_nb(claims_output=True))
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None
    (out,) = nb.cells[1].outputs
    assert out["data"]["text/plain"] == "✓ a\n✓ b" and out["execution_count"] is None
    assert nb.cells[1].execution_count == 1, "nbval refuses a reference output in a cell without a count"


def test_record_copies_the_checked_outputs_of_an_executed_notebook(tmp_path):
    (tmp_path / "notebooks").mkdir()
    src = tmp_path / "notebooks" / "x.ipynb"
    nbformat.write(_nb(claims_output=False), src)
    run = tmp_path / "run"
    run.mkdir()
    nbformat.write(_nb(claims_output=True), run / "x.ipynb")
    strip_notebooks.record(run / "x.ipynb", tmp_path / "notebooks")
    got = nbformat.read(src, as_version=4)
    assert got.cells[0].outputs == [] and got.cells[1].outputs[0]["data"]["text/plain"] == "✓ a\n✓ b"
    assert strip_notebooks.main(["--check", str(src)]) == 0  # recorded = stripped form
