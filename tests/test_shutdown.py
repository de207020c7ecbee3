"""Clean shutdown: after `asyncrl train` exits, no Ray actors, engine processes or ports are left.

Runs the real CLI in a subprocess (its own local Ray + vLLM replica) with a marker in the
environment, then looks for any surviving process that inherited the marker.
"""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]
REPO = Path(__file__).resolve().parents[1]


def _marked(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.pid != os.getpid() and marker in p.environ().get("ASYNCRL_TEST_MARKER", ""):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def test_cli_run_leaves_nothing_behind(tmp_path):
    pytest.importorskip("vllm")
    marker = uuid.uuid4().hex
    env = {**os.environ, "ASYNCRL_TEST_MARKER": marker, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "train", "--recipe", "smoke_cpu",
         "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}", "trainer.progress_bar=false"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held-out greedy accuracy" in proc.stdout and "balanced: True" in proc.stdout
    run_dirs = list(tmp_path.iterdir())
    assert len(run_dirs) == 1
    for name in ("metrics.csv", "eval.csv", "plot.png", "config.yaml", "summary.json"):
        assert (run_dirs[0] / name).stat().st_size > 0, name
    deadline = time.time() + 30  # Ray reaps its workers asynchronously after shutdown
    left = _marked(marker)
    while left and time.time() < deadline:
        time.sleep(1)
        left = _marked(marker)
    # no process of the run survives (Ray GCS/raylet/workers, vLLM EngineCore/Worker), hence no port either
    assert not left, [(p.pid, p.name(), " ".join(p.cmdline())[:120]) for p in left]
