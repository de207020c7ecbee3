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
