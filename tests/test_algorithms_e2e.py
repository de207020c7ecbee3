"""One short end-to-end run per algorithm family on arith (real Ray + vLLM CPU + torch trainer).

GRPO itself runs in ``test_e2e.py`` (modes a-d). Each run here is 2 trainer steps of 2 prompt groups x
4 responses in mode a, sharing the session's vLLM replica; the checks are what the family adds.
"""

import math

import pandas as pd
import pytest

from asyncrl.recipes import smoke_cpu
from test_e2e import _check_accounting, _run

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

SMALL = {"trainer.total_training_steps": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
         "async_training.require_batches": 1, "data.val_size": 8, "trainer.test_freq": 0}


def _family(family, shared_replica, tmp_path, **extra):
    cfg, summary, _ = _run("a", shared_replica, tmp_path, cfg=smoke_cpu("a", family), **{**SMALL, **extra})
    _check_accounting(cfg, summary)
    hist = pd.read_csv(f"{summary.run_dir}/metrics.csv")
    assert len(hist) == 2 and hist["actor/pg_loss"].map(math.isfinite).all()
    return cfg, summary, hist


def test_rloo(shared_replica, tmp_path):
    cfg, summary, hist = _family("rloo", shared_replica, tmp_path)
    assert cfg.algorithm.adv_estimator == "rloo"
    assert (hist["critic/advantages_abs_mean"] >= 0).all()


def test_reinforce_plus_plus_with_kl_in_reward(shared_replica, tmp_path):
    cfg, summary, hist = _family("reinforce_plus_plus", shared_replica, tmp_path)
    assert "actor/reward_kl_penalty" in hist and hist["actor/reward_kl_penalty"].map(math.isfinite).all()
    assert (hist["actor/reward_kl_penalty_coeff"] == cfg.algorithm.kl_ctrl.kl_coef).all()  # fixed controller
    # whitened over the batch: mean advantage ~ 0
    assert hist["critic/advantages_mean"].abs().max() < 1e-4


def test_ppo_gae_trains_a_critic(shared_replica, tmp_path):
    cfg, summary, hist = _family("ppo_gae", shared_replica, tmp_path)
    assert hist["critic/vf_loss"].map(math.isfinite).all() and (hist["critic/grad_norm"] > 0).all()
    assert "critic/returns_mean" in hist


def test_dapo_dynamic_sampling_with_decoupled_rollout_correction(shared_replica, tmp_path):
    cfg, summary, hist = _family(
        "dapo", shared_replica, tmp_path, **{
            "algorithm.rollout_correction.bypass_mode": False,
            "algorithm.rollout_correction.rollout_is": "token",
            "algorithm.rollout_correction.rollout_rs": "geometric",
            "algorithm.rollout_correction.rollout_rs_threshold": 1.01})
    # every trained group carries signal: no step trains on a zero-advantage batch
    assert (hist["critic/advantages_abs_mean"] > 0).all()
    dropped = summary.accounting["dropped"].get("dapo_no_signal", 0)
    assert dropped == int(hist["trainer/dropped_dapo_no_signal"].iloc[-1])
    # staleness 0: the trainer's recomputed log-probs equal vLLM's (same weights, same filters)
    assert hist["rollout_corr/kl_k3"].abs().max() < 1e-3 and hist["rollout_corr/out_of_support"].max() == 0
