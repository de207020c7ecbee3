"""The simulator prices ``actor.use_prefix_grouper`` (asyncrl.sim.prefix_pricing): each micro-batch the CPU engine
would plan pays its groups' prefixes once and its rows' suffixes, as asyncrl.trainer.shared_prefix.prefix_plan
decides; everything else is priced as before."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from asyncrl.recipes import arith_grpo_cpu
from asyncrl.sim import runner
from asyncrl.sim.calibrate import priced_tokens
from asyncrl.sim.cost_models import ClusterCostModel, RolloutCostModel, SyncCostModel, TrainCostModel
from asyncrl.sim.prefix_pricing import chunk_plan
from asyncrl.sim.presets import cpu_embedded_vllm, h20_qwen25_7b, h100_qwen25_7b, h200_qwen25_05b_hf
from asyncrl.sim.train_engines import CostModelTrainEngine

# 2 groups x 4 rows, prompt 10, responses 3..6: lengths 13..16 in each group
LENGTHS = [13, 14, 15, 16] * 2
GROUPS = ["a"] * 4 + ["b"] * 4
PROMPTS = [10] * 8


def _train(**kw) -> TrainCostModel:
    return TrainCostModel(**{"per_token_s": 1e-3, "per_row_s": 2e-3, "per_token_ctx_s": 1e-5, "shared_prefix": True, **kw})


def test_a_planned_mini_batch_pays_each_groups_prefix_once_by_hand():
    # the plan: prefix 9 (the prompt less the token whose successor is the first response token), suffixes 4..7;
    # 2 x 9 + 8 x 7 = 74 tokens against 8 x 16 = 128 padded: under 0.75 x 128 = 96, so it is used
    plan = chunk_plan(LENGTHS, GROUPS, PROMPTS)
    assert plan is not None and plan.group_prefix == (9, 9) and plan.width == 9 and plan.suffix_width == 7
    assert plan.tokens == 74
    cost = _train()
    # plain: 8 rows x 2 ms + 116 tokens x 1 ms + 1e-5 x (sum of L^2 = 1692) / 2
    assert cost.pass_time(LENGTHS) == pytest.approx(0.016 + 0.116 + 0.00846)
    # planned: each group's prefix once (2 ms + 9 ms + 1e-5 x 81 / 2), then each row's suffix: 2 ms, its 4..7 tokens,
    # and its part of the attention triangle, 1e-5 x (L^2 - 81) / 2
    groups = 2 * (0.002 + 0.009 + 1e-5 * 81 / 2)
    rows = 8 * 0.002 + 2 * (4 + 5 + 6 + 7) * 1e-3 + 1e-5 * (1692 - 8 * 81) / 2
    assert cost.pass_time(LENGTHS, GROUPS, PROMPTS) == pytest.approx(groups + rows)  # 0.08803 s
    assert cost.update_time(LENGTHS, GROUPS, PROMPTS) == pytest.approx(groups + rows)
    assert cost.log_prob_time(LENGTHS, GROUPS, PROMPTS) == pytest.approx((groups + rows) / 3)
    # the contention term stretches the planned pass as any other
    loaded = dataclasses.replace(cost, contention=0.5)
    assert loaded.pass_time(LENGTHS, GROUPS, PROMPTS) == pytest.approx(1.5 * (groups + rows))
    # padded (the plain pass at the longest row, one call): the prefix pass at 9, the suffix pass at 7, one call more
    padded = _train(padded=True, per_micro_batch_s=0.05)
    assert padded.pass_time(LENGTHS) == pytest.approx(8 * (0.002 + 0.016 + 1e-5 * 256 / 2) + 0.05)
    assert padded.pass_time(LENGTHS, GROUPS, PROMPTS) == pytest.approx(
        2 * (0.002 + 0.009 + 1e-5 * 81 / 2) + 8 * (0.002 + 0.007 + 1e-5 * (256 - 81) / 2) + 2 * 0.05)
    # without the grouper, or without the rows' groups, the plain price
    assert _train(shared_prefix=False).pass_time(LENGTHS, GROUPS, PROMPTS) == cost.pass_time(LENGTHS)
    assert _train(shared_prefix=None).pass_time(LENGTHS, GROUPS, PROMPTS) == cost.pass_time(LENGTHS)
    # calibration counts the same plan: 2 x 9 prefix tokens + 44 suffix tokens, not 116
    assert priced_tokens(LENGTHS, groups=GROUPS, prompts=PROMPTS, shared_prefix=True) == 62
    assert priced_tokens(LENGTHS, groups=GROUPS, prompts=PROMPTS) == 116


def test_a_plan_above_three_quarters_of_the_plain_tokens_falls_back_to_the_plain_forward():
    cost = TrainCostModel(per_token_s=1.0, shared_prefix=True)
    # one group of 2 rows, prompt 10: plan 9 + 2 x (L - 9) tokens against 0.75 x 2 x L
    assert chunk_plan([18, 18], ["g", "g"], [10, 10]).tokens == 27  # = 0.75 x 36: used
    assert cost.pass_time([18, 18], ["g", "g"], [10, 10]) == 9 + 2 * 9
    assert chunk_plan([19, 19], ["g", "g"], [10, 10]) is None  # 29 > 28.5: the plain forward
    assert cost.pass_time([19, 19], ["g", "g"], [10, 10]) == 38


def test_single_row_groups_and_a_prompt_of_one_token_are_priced_plain():
    cost = _train()
    assert cost.pass_time(LENGTHS, list("abcdefgh"), PROMPTS) == cost.pass_time(LENGTHS)  # no group of two rows
    assert cost.pass_time(LENGTHS, GROUPS, [1] * 8) == cost.pass_time(LENGTHS)  # no prefix before the response
    assert cost.pass_time(LENGTHS, GROUPS, PROMPTS) < 0.7 * cost.pass_time(LENGTHS)  # the same rows paired: planned
    with pytest.raises(ValueError, match="one of each per row"):
        cost.pass_time(LENGTHS, GROUPS[:3], PROMPTS)


def test_token_budget_micro_batches_split_a_group_and_each_part_pays_its_prefix():
    cost = TrainCostModel(per_token_s=1.0, max_token_len=64, per_micro_batch_s=0.5, shared_prefix=True)
    # packed by length (rows x longest <= 64): [13, 13, 14, 14] and [15, 15, 16, 16], two rows of each group in each
    # chunk 1: 2 x 9 + 4 x 5 = 38 tokens <= 0.75 x 4 x 14 = 42; chunk 2: 2 x 9 + 4 x 7 = 46 <= 48; each one call more
    assert cost.pass_time(LENGTHS) == (4 * 14 + 0.5) + (4 * 16 + 0.5)
    assert cost.pass_time(LENGTHS, GROUPS, PROMPTS) == (18 + 20 + 1.0) + (18 + 28 + 1.0)  # 86, not 2 x 9 + 8 x 7 + 1
    # the packed calls' own price, when set, is the extra call's too
    packed = dataclasses.replace(cost, per_packed_micro_batch_s=2.0)
    assert packed.pass_time(LENGTHS, GROUPS, PROMPTS) == (18 + 20 + 4.0) + (18 + 28 + 4.0)
    # fixed micro-batches of 4 rows in order: one group each, its prefix once
    rows = TrainCostModel(per_token_s=1.0, micro_batch_rows=4, shared_prefix=True)
    assert rows.pass_time(LENGTHS, GROUPS, PROMPTS) == 2 * (9 + 4 + 5 + 6 + 7)
    # 3 rows a micro-batch, each decided alone: [a a a] planned (9 + 3 x 6 = 27 <= 33.75); [a b b] plain
    # (2 x 9 + 3 x 7 = 39 > 0.75 x 3 x 16 = 36); [b b] planned (9 + 2 x 7 = 23 <= 24)
    three = TrainCostModel(per_token_s=1.0, micro_batch_rows=3, shared_prefix=True)
    assert three.pass_time(LENGTHS, GROUPS, PROMPTS) == (9 + 4 + 5 + 6) + (16 + 13 + 14) + (9 + 6 + 7)


def test_gpu_presets_price_no_grouper_and_the_cpu_preset_follows_the_config():
    for preset in (h20_qwen25_7b(), h100_qwen25_7b(), h200_qwen25_05b_hf(), h200_qwen25_05b_hf("cuda_ipc", "masked")):
        assert preset.train.shared_prefix is False, preset.name
    h200 = h200_qwen25_05b_hf().train
    rows = [200 + x for x in range(10, 26)] * 2
    groups, prompts = [i // 8 for i in range(32)], [200] * 32
    assert h200.pass_time(rows, groups, prompts) == h200.pass_time(rows)
    assert dataclasses.replace(h200, shared_prefix=True).pass_time(rows, groups, prompts) != h200.pass_time(rows)
    assert cpu_embedded_vllm(1).train.shared_prefix is None  # the CPU engine has it: as the config says
    with pytest.raises(TypeError, match="shared_prefix"):
        TrainCostModel(per_token_s=1.0, shared_prefix="yes")


def test_the_train_engine_passes_the_rows_groups_and_prompts_and_keeps_the_kept_rows_groups():
    cost = TrainCostModel(per_token_s=1e-3, per_update_s=0.5, shared_prefix=True)
    mask = torch.zeros(4, 30)
    for i, n in enumerate([10, 30, 20, 30]):
        mask[i, :n] = 1
    batch = SimpleNamespace(response_mask=mask, group_ids=["x", "z", "z", "z"])
    rows = [210, 230, 220, 230]  # 200 prompt tokens + the responses

    def priced(fraction):
        eng = CostModelTrainEngine(cost, prompt_tokens=200, gradient_fraction=fraction)
        eng._spend = lambda s, label: setattr(eng, "spent", s)
        eng.update(batch, None)
        return eng.spent

    assert priced(None) == pytest.approx(cost.update_time(rows, ["x", "z", "z", "z"], [200] * 4))
    assert priced(None) == pytest.approx(0.5 + 1e-3 * (2 * 199 + 11 + 31 + 21 + 31))  # z's three rows: one prefix
    # rows of 20 tokens and more kept: the three z rows, one prefix (the first three rows' groups would be two)
    kept = priced(lambda n: 1.0 if n >= 20 else 0.0)
    assert kept == pytest.approx(cost.update_time(rows[1:], ["z"] * 3, [200] * 3))
    assert kept == pytest.approx(0.5 + 1e-3 * (199 + 31 + 21 + 31))
    eng = CostModelTrainEngine(cost, prompt_tokens=200)
    eng._spend = lambda s, label: setattr(eng, "spent", s)
    eng.compute_log_probs(batch)
    assert eng.spent == pytest.approx(cost.log_prob_time(rows, ["x", "z", "z", "z"], [200] * 4))
    eng.compute_log_probs(SimpleNamespace(response_mask=mask))  # a batch without group ids: the plain price
    assert eng.spent == pytest.approx(cost.log_prob_time(rows))


def _cost(shared_prefix=None, prompt_tokens=200) -> ClusterCostModel:
    return ClusterCostModel("unit", RolloutCostModel(step_s=0.01, per_seq_s=1e-4, per_ctx_token_s=0.0, weight_load_s=0.01),
                            TrainCostModel(per_token_s=2e-5, per_update_s=0.01, shared_prefix=shared_prefix),
                            SyncCostModel(fixed_s=0.02), prompt_tokens=prompt_tokens)


def _config(n: int = 8, steps: int = 4):
    cfg = arith_grpo_cpu()
    cfg.trainer.total_training_steps, cfg.trainer.total_time_s = steps, 0
    cfg.data.train_size = 512
    cfg.actor_rollout_ref.rollout.response_length = 64
    lw = cfg.data.length_workload
    lw.distribution, lw.median, lw.sigma, lw.min_tokens = "lognormal", 16, 0.6, 2
    cfg.actor_rollout_ref.rollout.n = n
    if n == 1:
        cfg.algorithm.adv_estimator = "reinforce_plus_plus"  # GRPO needs a group
    return cfg


def _resolved(monkeypatch, cfg, cost) -> list:
    """The ``shared_prefix`` of the trainer cost model each simulated train engine was built with."""
    seen = []

    class RecordingTrainEngine(CostModelTrainEngine):  # the real cost-model engine, recording its cost model
        def __init__(self, train, *args, **kw):
            seen.append(train.shared_prefix)
            super().__init__(train, *args, **kw)

    monkeypatch.setattr(runner, "CostModelTrainEngine", RecordingTrainEngine)
    runner.simulate(cfg, cost)
    return seen


def test_the_runner_resolves_none_from_the_config(monkeypatch):
    cfg = _config(steps=1)
    assert _resolved(monkeypatch, cfg, _cost()) == [True]  # strategy=cpu, use_prefix_grouper null: on
    off = _config(steps=1)
    off.actor_rollout_ref.actor.use_prefix_grouper = False
    assert _resolved(monkeypatch, off, _cost()) == [False]
    assert _resolved(monkeypatch, cfg, _cost(shared_prefix=False)) == [False]  # the cost model's own word wins
    assert _resolved(monkeypatch, off, _cost(shared_prefix=True)) == [True]
    assert _resolved(monkeypatch, cfg, h200_qwen25_05b_hf()) == [False]  # an FSDP2 preset under a strategy=cpu config


def _trainer_busy(cfg, cost) -> float:
    res = runner.simulate(cfg, cost)
    assert len(res.history) == cfg.trainer.total_training_steps
    return sum(end - start for lane, start, end, _ in res.timeline.spans if lane == "trainer")


def test_a_simulated_trainer_is_busy_far_less_with_the_grouper_at_n8_and_as_long_at_n1():
    # 200-token prompts, ~16-token responses: at n = 8 each row's prompt is most of its tokens, run once per group
    on, off = _trainer_busy(_config(8), _cost(True)), _trainer_busy(_config(8), _cost(False))
    assert on < 0.5 * off, (on, off)
    # one response per prompt: nothing to share, the same price
    on1, off1 = _trainer_busy(_config(1), _cost(True)), _trainer_busy(_config(1), _cost(False))
    assert on1 == pytest.approx(off1, rel=0.01), (on1, off1)
