"""The simulator on the seed's 7B experiment: colocated 128 H20 vs fully async 64:64 (about a minute)."""

import pytest

from asyncrl.sim.scenarios import SEED_RATIO, VERL_COLOCATED_STEP, reproduce_seed

pytestmark = pytest.mark.e2e


def test_reproduces_the_seeds_speedup_within_15_percent():
    rep = reproduce_seed()
    lo, hi = SEED_RATIO
    assert 0.85 * lo <= rep.ratio <= 1.15 * hi, rep.breakdown()
    table = rep.breakdown().set_index("run")
    colo = table.loc["colocated 128"]
    # the calibrated colocated components are near verl's: generation waits for the longest response
    assert abs(colo["generation_s"] - VERL_COLOCATED_STEP["gen"]) < 0.25 * VERL_COLOCATED_STEP["gen"]
    assert abs(colo["update_s"] - VERL_COLOCATED_STEP["update_actor"]) < 0.25 * VERL_COLOCATED_STEP["update_actor"]
    # where the gain comes from: async hides generation behind training, and its trainer waits little
    assert rep.fully_async.trainer_idle_ratio < 0.35 < rep.colocated.trainer_idle_ratio
    assert max(int(k) for k in rep.fully_async.lag_counts) <= 2  # staleness 0.5 + partial rollout
