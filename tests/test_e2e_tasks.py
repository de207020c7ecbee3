"""End-to-end runs of the multi-turn tasks on the real stack (Ray + vLLM CPU + torch trainer).

`calc_tool` (ToolAgentLoop + calculator, its own warm-started checkpoint) and `swe_examples`
(sandboxed swe_agent loop with the bash agent, Harbor-format tasks): a couple of async steps each,
as `asyncrl train task=...` would run them, sharing the session's vLLM replica.
"""

import shutil

import pytest

from asyncrl.experiment import Experiment
from asyncrl.recipes import calc_tool_grpo_cpu, swe_grpo_cpu
from conftest import SHARED_REPLICA_MAX_MODEL_LEN
from test_e2e import _restore_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def _run(cfg, replica, tmp_path, started=None):
    cfg.trainer.default_local_dir = str(tmp_path)
    cfg.trainer.progress_bar = False
    cfg.trainer.total_time_s = 0.0
    exp = Experiment(cfg, replicas=[replica])  # the trainer pushes its checkpoint into the replica first
    try:
        exp.start()
        if started is not None:
            started(exp)
        return exp.wait(progress=False)
    finally:
        exp.stop()
        _restore_checkpoint(replica, smoke_cfg())


def smoke_cfg():
    from asyncrl.recipes import smoke_cpu
    return smoke_cpu("a")


def test_calc_tool_trains_and_reports_tool_metrics(shared_replica, tmp_path):
    cfg = calc_tool_grpo_cpu()
    cfg.trainer.total_training_steps = 2
    cfg.trainer.test_freq = 0
    cfg.data.val_size = 8
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    cfg.actor_rollout_ref.rollout.n = 4
    s = _run(cfg, shared_replica, tmp_path)
    assert s.steps == 2 and s.accounting["balanced"] and s.accounting["failed_total"] == 0, s.accounting
    assert s.evals[0]["version"] == 0 and s.evals[-1]["version"] == 2
    # the evaluation ran the multi-turn loop with the real calculator
    assert "eval/tool_call_success_rate" in s.evals[-1] and "eval/tool_calls" in s.evals[-1]
    assert s.evals[0]["eval/tool_calls"] > 0
    assert "tool_call_success_rate: before" in str(s) and "tool_calls per sample: before" in str(s)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing (apt-get install -y bubblewrap)")
def test_swe_examples_bash_agent_pipeline(shared_replica, tmp_path):
    """The recipe's 1024-context model on the session replica (served with 1024 positions): a trial's
    second turn (prompt + tool call + shell output, ~540 tokens) fits, so no sample fails, in training
    or in the evaluations. (On a 512-token engine it was refused; tests/test_context_limit.py covers
    that kind: a counted, reasoned failure, never a crash.)"""
    cfg = swe_grpo_cpu()
    cfg.trainer.total_training_steps = 2
    cfg.actor_rollout_ref.rollout.agent.sandbox.agent = "bash"
    cfg.actor_rollout_ref.rollout.agent.sandbox.trials_dir = str(tmp_path / "trials")
    assert cfg.actor_rollout_ref.rollout.max_model_len <= SHARED_REPLICA_MAX_MODEL_LEN
    s = _run(cfg, shared_replica, tmp_path)
    print(f"\nswe_examples: {s.accounting['audit']}; evals "
          f"{[(e['version'], e['accuracy'], e['n'], e['eval/failed']) for e in s.evals]}")
    assert s.steps == 2 and s.accounting["balanced"] and s.accounting["failed_total"] == 0, s.accounting
    assert s.accounting["trained"] == 4  # 2 steps x ppo_mini_batch_size 2 x require_batches 1
    assert [e["version"] for e in s.evals] == [0, 2] and all(0.0 <= e["accuracy"] <= 1.0 for e in s.evals)
    assert all(e["n"] == cfg.data.val_size and e["eval/failed"] == 0 for e in s.evals), s.evals
    # the tasks were really attempted through the sandbox (the verifier ran), not short-circuited
    assert all(e["eval/sandbox/attempts"] >= 1 and e["eval/sandbox/verifier"] > 0 for e in s.evals), s.evals


def test_own_data_and_custom_reward_file_train_end_to_end(shared_replica, tmp_path, monkeypatch):
    """Session 31: a user's own rows (``data_source: my_sum``, no reward registered for it) and reward file
    (``custom_reward_function.path``, given relative to the working directory) through a real run: the Ray actors
    load the file (the path travels absolute), a string extra (verl's ``"pred"``) fails nothing, a numeric one is a
    ``reward/<key>`` metric, and ``acc`` is what the held-out accuracy averages. Session 32: the config's
    ``reward_kwargs`` reach the function in the actors, ``config.yaml`` holds the data files' absolute paths, and
    ``async_training.rollouter_cpu_affinity`` pins every thread of the rollouter and queue actors (session 33: its
    default, ``auto``, puts them on the trainer's core once rollout and trainer are pinned); ``trainer.cpu_affinity``
    every thread of the trainer's (session 36)."""
    import csv
    import json
    from pathlib import Path

    from asyncrl.data.dataset import get_task_rows

    work = tmp_path / "mytask"
    work.mkdir()
    for split, name, count in (("train", "train.jsonl", 64), ("test", "test.jsonl", 8)):
        rows = get_task_rows("arith", split, count, 3)
        (work / name).write_text("".join(json.dumps({**r, "data_source": "my_sum"}) + "\n" for r in rows))
    (work / "reward.py").write_text(
        "import re\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    nums = re.findall(r'-?\\d+', solution_str)\n"
        "    pred = nums[-1] if nums else ''\n"
        "    return {'score': float(pred == str(ground_truth)), 'acc': pred == str(ground_truth), 'pred': pred,\n"
        "            'bonus': bonus}\n")
    monkeypatch.chdir(tmp_path)
    cfg = smoke_cfg()
    cfg.trainer.total_training_steps = 2
    cfg.data.train_files, cfg.data.val_files = "mytask/train.jsonl", "mytask/test.jsonl"
    cfg.custom_reward_function.path = "mytask/reward.py"
    cfg.custom_reward_function.reward_kwargs = {"bonus": 0.25}  # verl's: bound in every actor that scores
    import os

    import ray

    cores = sorted(os.sched_getaffinity(0))
    glue = cores[-1]  # session 32: the glue actors pinned, every thread of each
    if len(cores) > 1:  # session 33: by rollouter_cpu_affinity's default, "auto": the trainer's core beside the rollout's
        assert cfg.async_training.rollouter_cpu_affinity == "auto"
        cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity = str(cores[0]), str(glue)
    else:
        cfg.async_training.rollouter_cpu_affinity = str(glue)
    pinned = {}

    def threads_cores(_actor):
        return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})

    def started(exp):
        pinned.update(zip(("rollouter", "queue", "trainer"), ray.get([h.__ray_call__.remote(threads_cores)
                                                                      for h in (exp.rollouter, exp.mq.actor, exp.trainer)])))

    s = _run(cfg, shared_replica, tmp_path / "runs", started)
    # session 36: the trainer's Ray threads too (its main thread floated on both cores, ~7% of its CPU time)
    trainer = [(glue,)] if len(cores) > 1 else [tuple(cores)]
    assert pinned == {"rollouter": [(glue,)], "queue": [(glue,)], "trainer": trainer}, pinned
    assert s.steps == 2 and s.accounting["balanced"] and s.accounting["failed_total"] == 0, s.accounting
    saved = (Path(s.run_dir) / "config.yaml").read_text()  # absolute for the actors, and to re-run from elsewhere
    assert f"path: {work / 'reward.py'}" in saved and "bonus: 0.25" in saved, saved
    assert f"train_files: {work / 'train.jsonl'}" in saved and f"val_files: {work / 'test.jsonl'}" in saved, saved
    metrics = list(csv.DictReader(open(Path(s.run_dir) / "metrics.csv")))
    assert "reward/acc" in metrics[0] and "reward/pred" not in metrics[0], metrics[0].keys()
    assert [float(m["reward/bonus"]) for m in metrics] == [0.25, 0.25], metrics  # the kwarg reached the function
    assert s.evals and all(e["n"] == 8 for e in s.evals), s.evals  # the user's 8 held-out rows, none failed
