"""``scripts/gpu/run_all.sh``'s environment check, run as a user runs it on a GPU machine, here on CPU with
no part: it must name every runtime dependency of ``pyproject.toml`` (session 19: a hard-coded list without
``tenacity`` passed the check, and the benchmark then died on ``import tenacity`` mid-run on the H200)."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_environment_check_names_every_runtime_dependency(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "run_all.sh"), str(tmp_path), "none"],
                          env={"PATH": "/usr/bin:/bin", "DEVICE": "cpu", "PY": sys.executable, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = dict(re.findall(r"^  (\S+)\s+(\S+)$", proc.stdout, flags=re.M))
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9_.\-]+", d).group(0) for d in deps]
    assert "tenacity" in names
    for name in names + ["pytest"]:
        assert name in listed, (name, proc.stdout)
        assert listed[name] != "MISSING", (name, proc.stdout)  # this environment has them all
    assert "missing packages" not in proc.stdout
