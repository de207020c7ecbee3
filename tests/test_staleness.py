"""DESIGN.md section 4 formulas for several configs, including the seed's worked example."""

import pytest

from asyncrl.config import load_config
from asyncrl.staleness import max_concurrent_samples, max_required_samples, required_samples, sample_budget, staleness_bound


def test_seed_example():
    # mini batch 64, staleness 1.0, trigger 1, 2 replicas x 32 -> max_required 128, max_concurrent 64
    req = required_samples(64, 1)
    assert req == 64
    assert max_required_samples(req, 1.0, 1) == 128
    assert max_concurrent_samples(2, 32, 128) == 64


@pytest.mark.parametrize("mb,rb,s,trig,reps,per,exp_req,exp_max,exp_conc", [
    (16, 2, 0.0, 1, 1, 256, 32, 32, 32),     # mode a
    (16, 2, 0.0, 4, 1, 256, 32, 128, 128),   # mode b
    (16, 2, 0.5, 1, 1, 256, 32, 48, 48),     # modes c/d
    (32, 1, 0.3, 2, 4, 8, 32, 83, 32),       # int() truncation, concurrency-bound
])
def test_formulas(mb, rb, s, trig, reps, per, exp_req, exp_max, exp_conc):
    cfg = load_config(overrides=[
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mb}", f"async_training.require_batches={rb}",
        f"async_training.staleness_threshold={s}", f"async_training.trigger_parameter_sync_step={trig}",
        f"actor_rollout_ref.rollout.num_replicas={reps}", f"actor_rollout_ref.rollout.concurrent_samples_per_replica={per}"])
    b = sample_budget(cfg)
    assert (b.required_samples, b.max_required_samples, b.max_concurrent_samples) == (exp_req, exp_max, exp_conc)


def test_staleness_bound():
    assert staleness_bound(0.0, True) == 0 and staleness_bound(0.0, False) == 0
    assert staleness_bound(0.5, False) == 1 and staleness_bound(0.5, True) == 2
    assert staleness_bound(2.0, False) == 2


def test_the_read_ahead_is_what_can_start_at_once_whatever_the_staleness_budget(capsys):
    """s35 newcomer #1: the rollouter's read-ahead queue was sized by max_required_samples, 32 x (1e9 + 1) rows at
    ``staleness_threshold=1e9``, and its feed loop, cycling epochs to fill it, grew by ~80 MB/s until killed. The
    bound is max_concurrent_samples now; the same simulated run ends, as at a staleness of 100."""
    from asyncrl.cli import main
    from asyncrl.config import ExperimentConfig
    from asyncrl.staleness import sample_budget

    cfg = ExperimentConfig()
    cfg.async_training.staleness_threshold = 1e9
    b = sample_budget(cfg)
    assert b.max_required_samples > 10**10 and b.read_ahead == b.max_concurrent_samples == 256
    cfg.actor_rollout_ref.rollout.concurrent_samples_per_replica = 8
    assert sample_budget(cfg).read_ahead == 8
    rows = []
    for s in ("1e9", "100"):
        assert main(["sim", "task=longtail", "trainer.total_training_steps=2", f"async_training.staleness_threshold={s}"]) == 0
        rows.append(capsys.readouterr().out.split("samples/s")[0].split()[-1])
    assert rows[0] == rows[1]  # the budget binds at neither: the same run
