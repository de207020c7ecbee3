"""The calibration's prefill and context probes (asyncrl.sim.probes) recover the prices of a replica whose
costs are known: a cost-model engine in virtual time stands in for vLLM, so every number is exact."""

import asyncio

import pytest

from asyncrl.rollout.base import SamplingParams
from asyncrl.sim.clock import run
from asyncrl.sim.cost_models import RolloutCostModel
from asyncrl.sim.engines import CostModelInferenceEngine

TRUE = RolloutCostModel(step_s=0.005, per_seq_s=1e-4, per_ctx_token_s=1e-6, prefill_s=0.001, per_prefill_token_s=20e-6)
SHORT, LONG, T = 57, 320, 48


class FakeReplicaOfCostModel:
    """A fake replica for the probes: ``generate_async`` on a cost-model engine that charges the prompt it is
    given (the simulator's engines charge one fixed prompt length, so one engine per length; the probes never
    run two lengths at once)."""

    def __init__(self, cost: RolloutCostModel):
        self.cost, self.engines = cost, {}

    async def generate_async(self, request_id, prompt_ids, sampling_params):
        eng = self.engines.setdefault(len(prompt_ids), CostModelInferenceEngine(self.cost, prompt_tokens=len(prompt_ids)))
        return await eng.generate(request_id, prompt_ids, sampling_params)


def measure(cost: RolloutCostModel):
    from asyncrl.sim.probes import probe_decode, probe_token_costs

    async def go():
        rep = FakeReplicaOfCostModel(cost)
        decode = await probe_decode(rep, [1] * SHORT, batch_sizes=(1, 8, 32, 128), tokens=T)
        costs, raw = await probe_token_costs(rep, [1] * SHORT, [1] * LONG, decode, T)
        return decode, costs, raw

    return run(go)


def test_the_probes_recover_prefill_and_context_prices():
    """By hand, for B one-token requests: t = B x (prefill_s + pp x P) + one iteration at context B x P, so the
    prefill probe reads pp + ctx (the one iteration's context grows with P too); the decode probe at the long
    prompt takes B x pp x dP / T + ctx x B x dP longer per iteration, read as ctx x (1 - 1/T) once pp + ctx is
    taken out."""
    decode, costs, raw = measure(TRUE)
    assert costs.probe_prompt_tokens == SHORT and raw["long_prompt_tokens"] == LONG
    assert costs.per_prefill_token_s == pytest.approx(20e-6 + 1e-6, rel=1e-6)
    assert costs.per_ctx_token_s == pytest.approx(1e-6 * (1 - 1 / T), rel=1e-3)
    # the probe's share these prices account for, and the probe net of it: the engine's own iteration again
    from asyncrl.sim.calibrate import net_of_per_request

    net = net_of_per_request(decode, TRUE.prefill_s, T, costs)
    for b in (8, 32, 128):
        assert net[b] == pytest.approx(TRUE.iteration_s(b), rel=0.01)


def test_a_model_with_token_prices_runs_long_responses_as_the_engine_does():
    """The kind behind session 33's d_s1_t2 +27% (vLLM-CPU): a model priced by the decode probe alone charges every
    iteration the probe's context (57 + 24 tokens a sequence); long responses run at 5x that. With the token prices
    the rebuilt model runs 300-token responses within 2% of the engine; without them over 10% fast."""
    from asyncrl.sim.calibrate import fit_per_request, simulate_rollout_only

    decode, costs, _ = measure(TRUE)
    short_groups = [[12] * 8] * 8
    measured = simulate_rollout_only(TRUE, short_groups, 4, SHORT)
    with_prices = fit_per_request(decode, T, short_groups, 4, measured, SHORT, token_costs=costs)
    without = fit_per_request(decode, T, short_groups, 4, measured, SHORT)
    assert with_prices.per_prefill_token_s == costs.per_prefill_token_s and with_prices.per_ctx_token_s == costs.per_ctx_token_s
    assert without.per_prefill_token_s == 0.0 and without.per_ctx_token_s == 0.0
    long_groups = [[300] * 8] * 8
    truth = simulate_rollout_only(TRUE, long_groups, 4, SHORT)
    assert simulate_rollout_only(with_prices, long_groups, 4, SHORT) == pytest.approx(truth, rel=0.02)
    assert simulate_rollout_only(without, long_groups, 4, SHORT) < 0.9 * truth
    # a partial rollout resumed at 200 tokens of context prefills them again: priced with the prices, free without
    assert with_prices.prefill_time(200) - with_prices.prefill_s == pytest.approx(200 * 21e-6, rel=1e-3)
    assert without.prefill_time(200) == without.prefill_s


def test_token_costs_refuse_what_they_cannot_be():
    from asyncrl.sim.calibrate import net_of_per_request
    from asyncrl.sim.probes import TokenCosts, long_prompt

    with pytest.raises(ValueError, match="per_ctx_token_s"):
        TokenCosts(per_ctx_token_s=-1e-6)
    with pytest.raises(ValueError, match="per_prefill_token_s"):
        TokenCosts(per_prefill_token_s=float("nan"))
    with pytest.raises(ValueError, match="probe_prompt_tokens"):
        TokenCosts(probe_prompt_tokens=-3)
    # prices measured elsewhere that exceed what the probe took: a clear error, not a table entry <= 0
    with pytest.raises(ValueError, match="price more than the decode probe"):
        net_of_per_request({1: 1e-3, 8: 2e-3}, 0.0, 48, TokenCosts(per_prefill_token_s=1e-3, probe_prompt_tokens=57))
    assert long_prompt([[1, 2, 3], [4, 5], [6]], 5) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="6 tokens in 3 prompts, 7 asked"):
        long_prompt([[1, 2, 3], [4, 5], [6]], 7)


def test_probe_token_costs_refuses_a_long_prompt_that_is_not_longer():
    from asyncrl.sim.probes import probe_token_costs

    async def go():
        await probe_token_costs(FakeReplicaOfCostModel(TRUE), [1] * 57, [1] * 40, {32: 0.01, 128: 0.02}, T)

    with pytest.raises(ValueError, match="must be longer"):
        asyncio.run(go())

    async def missing():
        await probe_token_costs(FakeReplicaOfCostModel(TRUE), [1] * 57, [1] * 320, {1: 0.01}, T)

    with pytest.raises(ValueError, match=r"no batch size \[32, 128\]"):
        asyncio.run(missing())
