"""Seeds derived from ``trainer.seed`` (a replica's, by rank) stay in numpy's / vLLM's range: ``trainer.seed=4294967295``
(valid) gave replica 1 the seed ``2**32``, which its engine refused inside its Ray actor after the start."""

import numpy as np
import pytest

from asyncrl.config import ExperimentConfig
from asyncrl.config_ranges import SEED_SPACE, derived_seed
from asyncrl.rollout.backends import engine_kwargs_from_config


def test_seeds_at_the_top_of_the_range_wrap_and_stay_distinct():
    seeds = [derived_seed(2**32 - 1, rank) for rank in range(8)]
    assert all(0 <= s < SEED_SPACE for s in seeds), seeds
    assert len(set(seeds)) == 8
    assert seeds[:3] == [2**32 - 1, 0, 1]
    for s in seeds:
        np.random.RandomState(s)  # numpy's legacy generator (vLLM's at an engine's start) accepts each one


@pytest.mark.parametrize("seed,rank,expected", [(0, 0, 0), (0, 3, 3), (7, 2, 9), (2**31, 5, 2**31 + 5)])
def test_normal_seeds_are_unchanged(seed, rank, expected):
    """Runs whose seed + rank fit keep the seeds they had (``trainer.seed + replica_rank``)."""
    assert derived_seed(seed, rank) == expected


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_every_replica_engine_gets_a_seed_in_range(backend):
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.name = backend
    cfg.trainer.seed = 2**32 - 1
    seeds = [engine_kwargs_from_config(cfg, rank, max_model_len=512)["seed"] for rank in range(4)]
    assert seeds == [2**32 - 1, 0, 1, 2]
    cfg.trainer.seed = 0
    assert engine_kwargs_from_config(cfg, 0, max_model_len=512)["seed"] == 0
