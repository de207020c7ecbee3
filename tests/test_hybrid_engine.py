"""Colocated synchronous training (``actor_rollout_ref.hybrid_engine=True``) on the real stack,
driving the long-tail task with the synthetic length workload."""

import pytest
import ray

from asyncrl.data.length_workload import LengthWorkload
from asyncrl.experiment import Experiment
from asyncrl.recipes import smoke_cpu
from asyncrl.staleness import sample_budget

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_hybrid_engine_generates_then_trains_with_synthetic_lengths(shared_replica, tmp_path):
    from tests.test_e2e import _restore_checkpoint

    cfg = smoke_cpu("a")
    cfg.actor_rollout_ref.hybrid_engine = True
    cfg.trainer.total_training_steps = 3
    cfg.trainer.test_freq = 0
    cfg.trainer.default_local_dir = str(tmp_path)
    cfg.trainer.progress_bar = False
    cfg.data.task = "longtail"
    cfg.data.val_size = 8
    cfg.actor_rollout_ref.rollout.response_length = 64
    lw = cfg.data.length_workload
    lw.distribution, lw.median, lw.sigma, lw.min_tokens = "lognormal", 12, 1.0, 2
    exp = Experiment(cfg, replicas=[shared_replica])
    try:
        exp.start()
        summary = exp.wait(progress=False)
        history = ray.get(exp.trainer.status.remote())["history"]
        trajectories = ray.get(exp.rollouter.trajectories.remote(64))
    finally:
        exp.stop()
        _restore_checkpoint(shared_replica, cfg)
    required = sample_budget(cfg).required_samples
    acc = summary.accounting
    assert acc["balanced"] and acc["failed_total"] == 0, acc
    assert acc["trained"] == 3 * required
    # nothing is generated between rounds: after the last step no group was started, so the only
    # prompts left over are the ones the feed loop had queued but never started
    assert set(acc["dropped"]) <= {"unstarted_at_shutdown"}, acc["dropped"]
    assert summary.param_version == 3 and set(summary.lag_counts) == {0}  # every token on-policy
    assert all(row["timing/gen_s"] > 0 and row["timing/step_s"] >= row["timing/gen_s"] for row in history)
    assert history[-1]["trainer/idle_ratio"] > 0  # the trainer waits while the batch is generated
    # synthetic length workload: every response has exactly its drawn length, EOS ignored
    wl = LengthWorkload(lw, cfg.actor_rollout_ref.rollout.response_length, cfg.trainer.seed)
    assert trajectories
    for t in trajectories:
        assert len(t["response_ids"]) == wl.lengths(t["index"], cfg.actor_rollout_ref.rollout.n)[0]
