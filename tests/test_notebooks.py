"""Notebook checks that need no engine: every notebook is stripped, parameterised and ends with its checked
claims; the batch runner (``asyncrl batch``) keeps the final widget state, records the code that ran and
passes typed parameters.

The notebooks themselves run in ``tests/test_nbval.py`` (nbval, smoke size): each checks the claims its
text makes on its own run (``nb.claim``), so "the outputs that matter" are asserted inside the notebook,
where a reader sees them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("papermill")
pytest.importorskip("ipywidgets")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


def _text(cell, kind: str = "execute_result") -> str:
    parts = []
    for out in cell.outputs:
        if kind == "stream" and out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == kind:
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def _widget_values(nb) -> list[str]:
    state = (nb.metadata.get("widgets") or {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return [str(m.get("state", {}).get("value", "")) for m in state.values()]


def test_every_notebook_is_stripped_parameterised_and_ends_with_its_claims():
    """What tests/test_nbval.py relies on, for every notebook (06-08 included): a ``parameters`` cell,
    outputs stripped except the ``nbval-check-output`` references, and a last check cell ``nb.claims()``
    whose stored output lists the claims (record it with ``scripts/strip_notebooks.py --record``)."""
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert len(names) >= 6
    for name in names:
        nb = json.loads((NOTEBOOKS / name).read_text())
        tags = [c.get("metadata", {}).get("tags", []) for c in nb["cells"]]
        assert any("parameters" in t for t in tags), f"{name}: no cell tagged 'parameters'"
        for c, t in zip(nb["cells"], tags):
            assert c.get("execution_count") is None or "nbval-check-output" in t and c.get("outputs"), \
                f"{name}: execution counts not stripped"
        for c, t in zip(nb["cells"], tags):
            if "nbval-check-output" in t and c.get("outputs"):  # else nbval: "Unrun reference cell has outputs"
                assert c.get("execution_count") is not None, f"{name}: reference cell without an execution count"
            assert not c.get("outputs") or "nbval-check-output" in t, f"{name}: outputs not stripped"
        checked = [c for c, t in zip(nb["cells"], tags) if "nbval-check-output" in t]
        claims = [c for c in checked if "".join(c["source"]).strip() == "nb.claims()"]
        assert claims, f"{name}: no 'nb.claims()' cell tagged nbval-check-output"
        text = "".join("".join(o.get("data", {}).get("text/plain", "")) for o in claims[-1]["outputs"])
        assert text.startswith("✓ ") and "✗" not in text, f"{name}: record the claims output ({text[:80]!r})"
        for c in checked:
            assert c["outputs"], f"{name}: checked cell without a reference output: {''.join(c['source'])[:60]!r}"


FAKE_SNAPSHOT = """
def snap(active):
    return {"state": "running", "elapsed_s": float(active), "budget": {"max_required_samples": 12, "max_concurrent_samples": 12},
            "rollouter": {"pending_queue": 12, "staleness_samples": active, "active_tasks": active},
            "message_queue": {"size": 0, "maxsize": 12}}
"""


@pytest.mark.notebook
@pytest.mark.timeout(300)
def test_batch_keeps_the_final_widget_state(tmp_path):
    """A view updated by a background task after its cell ended: the saved notebook's widget state and
    HTML fallback show the last update, and the batch run writes PNG snapshots (no engine needed)."""
    import nbformat

    from asyncrl.batch import parse_value, run_notebook

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("n_updates = 3\nsnapshot_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(FAKE_SNAPSHOT + """
import asyncio
from widgets import ConcurrencyFunnel
funnel = ConcurrencyFunnel()
funnel.update(snap(1))
funnel.show()
async def later():
    for k in range(2, n_updates + 1):
        await asyncio.sleep(0.2)
        funnel.update(snap(k))
task = asyncio.ensure_future(later())"""), nbformat.v4.new_code_cell("await asyncio.sleep(0.1)\nimport matplotlib.pyplot as plt\nplt.plot([0, 1]); plt.show()"),
                nbformat.v4.new_code_cell("await task")]
    src = tmp_path / "tiny.ipynb"
    nbformat.write(nb, src)
    result = run_notebook(src, {"n_updates": parse_value("7")}, run_dir=tmp_path / "run")
    assert result.ok, result.error
    out = nbformat.read(result.notebook, as_version=4)
    assert any("<code>7 / 12</code>" in v for v in _widget_values(out)), _widget_values(out)
    html = "".join(o.get("data", {}).get("text/html", "") for o in out.cells[2].outputs)
    assert "7 / 12" in html, "the static fallback of the saved notebook is the final state"
    assert (result.run_dir / "snapshots" / "final" / "funnel.png").is_file()
    assert result.figures and all(p.suffix == ".png" for p in result.figures)
    meta = json.loads((result.run_dir / "batch.json").read_text())
    assert meta["parameters"]["n_updates"] == 7
    import asyncrl

    code = meta["code"]  # the code that ran, as the kernel imported it
    assert code["seen_by"] == "kernel" and code["asyncrl_path"] == str(Path(asyncrl.__file__).resolve().parent)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert code["git_commit"] == head and isinstance(code["git_dirty"], bool)


def _tiny_notebook(path: Path) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("staleness_threshold = 0.0\npair = (0, 0)\nsnapshot_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import os\nprint(repr(staleness_threshold), repr(pair), os.environ.get('CI'), sep='|')")]
    nbformat.write(nb, path)
    return path


@pytest.mark.notebook
@pytest.mark.timeout(300)
def test_asyncrl_batch_cli(tmp_path):
    """``asyncrl batch NOTEBOOK -p key value --env CI=1``: typed parameters reach the notebook, the kernel
    sees the environment, the run directory holds the executed notebook and batch.json."""
    run_dir = tmp_path / "batch"
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "batch", str(_tiny_notebook(tmp_path / "tiny.ipynb")),
                           "-p", "staleness_threshold", "0.5", "-p", "pair", "[1, 2]", "--env", "CI=1",
                           "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=280, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import nbformat

    nb = nbformat.read(run_dir / "tiny.ipynb", as_version=4)
    assert _text(nb.cells[2], "stream").strip() == "0.5|[1, 2]|1"
    meta = json.loads((run_dir / "batch.json").read_text())
    assert meta["ok"] and meta["parameters"]["staleness_threshold"] == 0.5 and meta["env"] == {"CI": "1"}


@pytest.mark.notebook
@pytest.mark.timeout(300)
def test_a_failed_batch_run_closes_ray_at_the_error_without_stack_dumps(tmp_path):
    """Session 30's fresh user: a notebook stopped by an error left its Ray up; the kernel's exit shut Ray down past
    jupyter_client's 2.5 s of grace, and the SIGTERM made Ray print ``*** SIGTERM received ... epoll_wait`` stack
    dumps, like a crash, before the real error. Now ``start_ray`` closes the session at the failing cell (batch runs
    only), and a notebook with a cell tagged ``raises-exception`` (papermill goes on past it) keeps its Ray."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("snapshot_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import ray\nfrom asyncrl.notebook import start_ray\nnb = start_ray(None, snapshot_dir=snapshot_dir, "
        "name='fails', num_cpus=1)\n@ray.remote\nclass A:\n    def f(self):\n        return 1\n"
        "a = A.remote()\nassert ray.get(a.f.remote()) == 1"),
        nbformat.v4.new_code_cell("raise ValueError('boom')"), nbformat.v4.new_code_cell("nb.close()")]
    nbformat.write(nb, tmp_path / "fails.ipynb")
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "batch", str(tmp_path / "fails.ipynb"), "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=280, cwd=REPO)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "FAILED: ValueError: boom" in out, out[-3000:]
    assert "SIGTERM" not in out and "logging.cc" not in out, out[-3000:]
    # a cell expected to raise: papermill goes on, so Ray must stay up for the cells after it
    expected = nbformat.v4.new_code_cell("raise ValueError('expected')")
    expected.metadata["tags"] = ["raises-exception"]
    nb.cells = [params, nb.cells[1], expected, nbformat.v4.new_code_cell("print(ray.is_initialized())"),
                nbformat.v4.new_code_cell("nb.close()")]
    nbformat.write(nb, tmp_path / "expects.ipynb")
    from asyncrl.batch import run_notebook

    result = run_notebook(tmp_path / "expects.ipynb", run_dir=tmp_path / "run2")
    assert result.error == "ValueError: expected"  # papermill still reports the run failed, at the end
    after, = [c for c in nbformat.read(result.notebook, as_version=4).cells if c.source == "print(ray.is_initialized())"]
    assert _text(after, "stream").strip() == "True"


def test_parse_value():
    from asyncrl.batch import parse_value

    assert parse_value("0.5") == 0.5 and parse_value("3") == 3 and parse_value("True") is True
    assert parse_value("none") is None and parse_value("abcd") == "abcd" and parse_value("[1, 2]") == [1, 2]



def test_papermill_parses_every_parameter_line():
    """papermill cannot parse a parameter line with an ``=`` in its comment (``(0 = none)``): every batch run
    of that notebook logged "WARNING papermill.translators: Unable to parse line 4 ..." (07, full size)."""
    import papermill as pm

    from asyncrl.batch_params import declared_parameters

    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")):
        assert list(pm.inspect_notebook(str(path))) == declared_parameters(path), path.name


def test_batch_figures_are_named_by_the_cell_as_written_not_shifted_by_the_injected_parameters(tmp_path):
    """s35 newcomer #17: with papermill's injected parameters cell the lengths plot of cell 4 was saved as
    ``cell05_0.png``; the number is now the cell's in the notebook as written, parameters or not."""
    import base64

    import nbformat

    from asyncrl.batch import extract_pngs

    png = base64.b64encode(b"\x89PNG fake").decode()
    out = lambda: [nbformat.v4.new_output("display_data", data={"image/png": png})]  # noqa: E731
    cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
             nbformat.v4.new_code_cell("plot()", outputs=out()),
             nbformat.v4.new_code_cell("plot(); plot()", outputs=out() + out())]
    injected = nbformat.v4.new_code_cell("x = 2", metadata={"tags": ["injected-parameters"]})
    plain = nbformat.v4.new_notebook(cells=cells)
    with_params = nbformat.v4.new_notebook(cells=[cells[0], injected, *cells[1:]])
    names = [p.name for p in extract_pngs(plain, tmp_path / "a")]
    assert names == ["cell01_0.png", "cell02_0.png", "cell02_1.png"]
    assert [p.name for p in extract_pngs(with_params, tmp_path / "b")] == names
    assert (tmp_path / "b" / "cell01_0.png").read_bytes() == b"\x89PNG fake"
