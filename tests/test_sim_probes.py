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
    prefill probe reads pp + ctx (the one iteration's context grows with P too). The context price: at each prompt
    the T - T/4 iterations the 48-token probe runs more than the 12-token one cost iter(B) + ctx x B x (P + mean k),
    the prefill in both probes cancelling, so the long prompt's over the short one's is ctx x B x dP exactly. Before
    (results saved without the few-token probes): the long probe net of the prefill read as pp + ctx, which gives
    ctx x (1 - 1/T)."""
    decode, costs, raw = measure(TRUE)
    assert costs.probe_prompt_tokens == SHORT and raw["long_prompt_tokens"] == LONG and raw["few_tokens"] == T // 4
    assert costs.per_prefill_token_s == pytest.approx(20e-6 + 1e-6, rel=1e-6)
    assert costs.per_ctx_token_s == pytest.approx(1e-6, rel=1e-6)
    from asyncrl.sim.probes import FEW_KEYS, fit_token_costs

    before = fit_token_costs({k: v for k, v in raw.items() if k not in FEW_KEYS}, decode, T)
    assert before.per_ctx_token_s == pytest.approx(1e-6 * (1 - 1 / T), rel=1e-3)
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
    with pytest.raises(ValueError, match="long_prompt: length=2.0 must be a whole number >= 1"):
        long_prompt([[1, 2, 3]], 2.0)  # a TypeError from the slice before


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


# session 35, a tester's findings (s34u #1, #6, #10): odd measurements and arguments, each refused or noted
RAW = {"prefill_s": {"58": 0.29, "320": 0.98}, "prefill_batch": 128, "decode_long": {"32": 0.015, "128": 0.0518},
       "long_prompt_tokens": 320, "short_prompt_tokens": 58}
DECODE = {"1": 0.0033, "8": 0.0052, "32": 0.0089, "128": 0.0252, "256": 0.0433}


def test_fit_token_costs_reads_a_saved_probe_by_hand():
    """The arithmetic on numbers kept as a result saves them (string keys): prefill (0.98 - 0.29) / (128 x 262);
    context the median over B of (t_long - t_short - B x pp x 262 / 48) / (B x 262)."""
    from asyncrl.sim.probes import fit_token_costs

    c = fit_token_costs(RAW, DECODE, 48)
    pp = 0.69 / (128 * 262)
    ctx = [(0.015 - 0.0089 - 32 * pp * 262 / 48) / (32 * 262), (0.0518 - 0.0252 - 128 * pp * 262 / 48) / (128 * 262)]
    assert c.per_prefill_token_s == pytest.approx(20.576e-6, rel=1e-4) == pp
    assert c.per_ctx_token_s == pytest.approx(sum(ctx) / 2, rel=1e-9) and c.notes == ()
    assert c.probe_prompt_tokens == 58


@pytest.mark.parametrize("change, says", [
    ({"prefill_s": {"58": float("nan"), "320": 0.98}}, r"prefill_s\['58'\]=nan is no measured time"),
    ({"prefill_s": {"58": float("inf"), "320": float("inf")}}, r"prefill_s\['58'\]=inf is no measured time"),
    ({"prefill_s": {"58": -0.1, "320": 0.98}}, r"prefill_s\['58'\]=-0.1 is no measured time"),
    ({"decode_long": {"32": float("nan"), "128": float("nan")}}, r"decode_long\['32'\]=nan is no measured time"),
    ({"decode_long": {}}, "decode_long is empty"),
    ({"long_prompt_tokens": 58, "prefill_s": {"58": 0.29}}, "long_prompt_tokens=58 must exceed short_prompt_tokens=58"),
    ({"long_prompt_tokens": 40, "prefill_s": {"58": 0.29, "40": 0.2}}, "long_prompt_tokens=40 must exceed"),
    ({"prefill_s": {"58": 0.29, "300": 0.9}}, r"prefill_s has no time at \[320\] prompt tokens"),
    ({"prefill_batch": 0}, "prefill_batch=0 must be a whole number >= 1"),
    ({"short_prompt_tokens": 0}, "short_prompt_tokens=0 must be a whole number >= 1"),
    ({"probe_tokens": 16}, "taken at 16 tokens a request, not the 48 given: pass probe_tokens=16"),
    ({"decode_long": {"32": 0.015, "512": 0.1}}, r"batch size\(s\) \[512\] that the decode probe lacks"),
])
def test_fit_token_costs_refuses_a_measurement_that_is_none(change, says):
    """Each of these came out a price of 0 (NaN, inf, a negative time), a wrong price (long < short) or a bare
    ZeroDivisionError / KeyError / StatisticsError on a saved file (s34u #6): now one ValueError naming it."""
    from asyncrl.sim.probes import fit_token_costs

    with pytest.raises(ValueError, match=says):
        fit_token_costs({**RAW, **change}, DECODE, 48)


def test_fit_token_costs_names_what_a_saved_probe_lacks_and_a_bad_probe_length():
    from asyncrl.sim.probes import RAW_KEYS, fit_token_costs

    assert set(RAW_KEYS) == set(RAW)  # the docstring's keys are the ones read
    raw = {k: v for k, v in RAW.items() if k != "prefill_batch"}
    with pytest.raises(ValueError, match=r"raw lacks \['prefill_batch'\] \(probe_token_costs saves \['prefill_s', "):
        fit_token_costs(raw, DECODE, 48)
    with pytest.raises(ValueError, match="probe_tokens=0 must be a whole number >= 1"):
        fit_token_costs(RAW, DECODE, 0)
    with pytest.raises(ValueError, match=r"decode_probe\['8'\]=nan"):
        fit_token_costs(RAW, {**DECODE, "8": float("nan")}, 48)


def test_a_negative_difference_on_a_busy_box_is_a_price_of_0_with_a_note():
    """The long prompt's probe ran faster than the short one's (noise): the prefill price is clamped at 0 and said so,
    and the context price read with that 0: (0.015 - 0.0089) / (32 x 262) and (0.0518 - 0.0252) / (128 x 262), their
    mean 7.6037e-7. A context difference below 0 is clamped too, with its own note."""
    from asyncrl.sim.probes import fit_token_costs

    c = fit_token_costs({**RAW, "prefill_s": {"58": 0.9, "320": 0.3}}, DECODE, 48)
    assert c.per_prefill_token_s == 0.0 and c.per_ctx_token_s == pytest.approx(7.6037e-7, rel=1e-4)
    assert len(c.notes) == 1 and c.notes[0].startswith("prefill price clamped at 0: 128 one-token requests took 0.3 s")
    c = fit_token_costs({**RAW, "decode_long": {"32": 0.0089, "128": 0.0252}}, DECODE, 48)
    assert c.per_prefill_token_s > 0 and c.per_ctx_token_s == 0.0
    assert len(c.notes) == 1 and c.notes[0].startswith("context price clamped at 0")


def test_token_costs_take_numpy_numbers_and_refuse_bools():
    """s34u #10: np.int64 / np.float32 were refused as "not a number", True passed as a price and a length. Numbers are
    kept as float / int, so a result holding them stays JSON."""
    import json

    import numpy as np

    from asyncrl.sim.probes import TokenCosts

    c = TokenCosts(per_prefill_token_s=np.float64(2e-5), per_ctx_token_s=np.float32(1e-7), probe_prompt_tokens=np.int64(57))
    assert (type(c.per_ctx_token_s), type(c.probe_prompt_tokens), c.probe_prompt_tokens) == (float, int, 57)
    json.dumps(c.__dict__)
    assert TokenCosts(per_ctx_token_s=-0.0).per_ctx_token_s == 0.0
    with pytest.raises(ValueError, match="per_prefill_token_s=True"):
        TokenCosts(per_prefill_token_s=True)
    with pytest.raises(ValueError, match="probe_prompt_tokens=True"):
        TokenCosts(probe_prompt_tokens=True)
    with pytest.raises(ValueError, match="probe_prompt_tokens=57.0"):
        TokenCosts(probe_prompt_tokens=57.0)
    with pytest.raises(ValueError, match="probe_tokens=0 must be a whole number >= 1"):
        TokenCosts(1e-5, 1e-7, 57).probe_share(8, 0)
    assert TokenCosts(1e-5, 1e-7, 57, notes=("x",)) == TokenCosts(1e-5, 1e-7, 57)  # notes are no price


def test_cpu_cost_model_refuses_token_costs_without_a_per_request_cost():
    """s34u #10: with per_request_s=None (the least-squares line through the probe) token_costs were dropped without a
    word; the line already prices the probe's own prefill and context, so adding them would charge them twice."""
    from asyncrl.sim.calibrate import cpu_cost_model
    from asyncrl.sim.probes import TokenCosts

    dec = {int(k): v for k, v in DECODE.items()}
    tc = TokenCosts(1e-5, 1e-7, 57)
    with pytest.raises(ValueError, match="token_costs=.* need per_request_s"):
        cpu_cost_model(dec, 1e-5, 0.1, 57, per_request_s=None, token_costs=tc)
    assert cpu_cost_model(dec, 1e-5, 0.1, 57, per_request_s=0.0, token_costs=tc).rollout.per_prefill_token_s == 1e-5


@pytest.mark.parametrize("kw, says", [
    ({"repeats": 0}, "repeats=0 must be a whole number >= 1"),
    ({"tokens": 0}, "tokens=0 must be a whole number >= 1"),
    ({"batch_sizes": ()}, "batch_sizes is empty"),
    ({"batch_sizes": (8, 0)}, "batch_sizes=0 must be a whole number >= 1"),
    ({"prompt_ids": []}, "prompt_ids is empty"),
])
def test_probe_decode_refuses_arguments_out_of_range(kw, says):
    """repeats=0 returned {B: inf}; the others ran or failed in the engine (s34u #6)."""
    from asyncrl.sim.probes import probe_decode

    kw = {"prompt_ids": [1] * SHORT, "batch_sizes": (1, 8), **kw}
    with pytest.raises(ValueError, match=says):
        run(lambda: probe_decode(FakeReplicaOfCostModel(TRUE), **kw))


@pytest.mark.parametrize("kw, says", [
    ({"batch_sizes": ()}, "batch_sizes is empty"),
    ({"repeats": 0}, "repeats=0 must be"),
    ({"prefill_batch": 0}, "prefill_batch=0 must be"),
    ({"probe_tokens": 0}, "probe_tokens=0 must be"),
    ({"short_ids": []}, "the short prompt is empty"),
    ({"decode_probe": {32: 0.01, 128: float("nan")}}, r"decode_probe\[128\]=nan"),
])
def test_probe_token_costs_refuses_arguments_before_any_request(kw, says):
    """batch_sizes=() passed and failed after the probes had run (StatisticsError); the others ended in inf, a
    ZeroDivisionError or the engine's refusal (s34u #6). Refused before the replica sees a request."""
    from asyncrl.sim.probes import probe_token_costs

    class NoRequests:
        async def generate_async(self, *a):
            raise AssertionError("a request was sent")

    kw = {"short_ids": [1] * SHORT, "long_ids": [1] * LONG, "decode_probe": {32: 0.01, 128: 0.02}, "probe_tokens": T,
          **kw}
    with pytest.raises(ValueError, match=says):
        run(lambda: probe_token_costs(NoRequests(), **kw))


class FakeReplicaWithAContext(FakeReplicaOfCostModel):
    """A fake replica whose engine stops a request at ``context`` tokens (prompt + generated), as vLLM does."""

    def __init__(self, cost: RolloutCostModel, context: int):
        super().__init__(cost)
        self.context = context

    async def generate_async(self, request_id, prompt_ids, sampling_params):
        import dataclasses

        room = min(sampling_params.max_tokens, self.context - len(prompt_ids))
        return await super().generate_async(request_id, prompt_ids, dataclasses.replace(sampling_params, max_tokens=room))


def test_a_probe_the_engine_cut_at_its_context_is_refused_not_read_too_cheap():
    """s34u #1: with 320 < max_model_len < 368 each long-prompt request stops at the context (340: after 20 tokens),
    and the probe divided by 48 tokens: each iteration read 2.4x too cheap, and the context price with it."""
    from asyncrl.sim.probes import probe_decode, probe_token_costs

    rep = FakeReplicaWithAContext(TRUE, 340)
    with pytest.raises(ValueError, match=r"2 of 2 requests of a 320-token prompt asked 48 tokens and got 20 \(stop "
                                         r"reason 'length'\).*at most max_model_len - 48 tokens"):
        run(lambda: probe_decode(rep, [1] * LONG, batch_sizes=(2,), tokens=T))
    decode = run(lambda: probe_decode(rep, [1] * SHORT, batch_sizes=(32, 128), tokens=T))  # 57 + 48 fit
    with pytest.raises(ValueError, match="320-token prompt asked 48 tokens and got 20"):
        run(lambda: probe_token_costs(rep, [1] * SHORT, [1] * LONG, decode, T))
    costs, raw = run(lambda: probe_token_costs(rep, [1] * SHORT, [1] * (340 - T), decode, T))  # what the context holds
    assert raw["probe_tokens"] == T and raw["long_prompt_tokens"] == 292
    assert costs.per_ctx_token_s == pytest.approx(1e-6, rel=1e-6)


def test_the_few_token_probes_are_checked():
    """The context price from the few-token probes: a few_tokens not below probe_tokens, or a batch size they lack,
    is refused by name."""
    from asyncrl.sim.probes import fit_token_costs, probe_token_costs

    decode, _, raw = measure(TRUE)
    with pytest.raises(ValueError, match="few_tokens=48 must be below probe_tokens=48"):
        fit_token_costs(dict(raw, few_tokens=48), decode, T)
    with pytest.raises(ValueError, match=r"few-token probes lack batch size\(s\) \[128\]"):
        fit_token_costs(dict(raw, decode_long_few={32: raw["decode_long_few"][32]}), decode, T)
    with pytest.raises(ValueError, match="few_tokens=60 must be below probe_tokens=48"):
        run(lambda: probe_token_costs(FakeReplicaOfCostModel(TRUE), [1] * SHORT, [1] * LONG, decode, T, few_tokens=60))


def test_long_probe_plan_fits_the_long_prompt_to_any_probe_length():
    """The benchmark and notebook 06 both take the long prompt from here (the notebook had a fixed 320 tokens, which an
    engine of a shorter context could not hold). At notebook 06's smoke probe of 16 tokens: 320 while the context holds
    336; capped down to 128 over the probe's prompt; skipped below that; refused when the decode probe cannot run."""
    from asyncrl.sim.probes import long_probe_plan

    assert long_probe_plan(336, 57, 16) == (320, None)
    long_, note = long_probe_plan(300, 57, 16)
    assert long_ == 284 and "at a 284-token prompt, not 320" in note and "probe's 16 tokens" in note
    assert long_probe_plan(201, 57, 16)[0] == 185  # 57 + 128: the least kept
    long_, note = long_probe_plan(200, 57, 16)
    assert long_ is None and "raise max_model_len to 201 to have them" in note
    assert long_probe_plan(600, 57, 48, long_tokens=500) == (500, None)  # a longer long prompt where it fits
    with pytest.raises(ValueError, match="context of 72 tokens .* its 57-token prompt and 16 tokens; raise "
                                         "max_model_len to at least 73$"):
        long_probe_plan(72, 57, 16)
    for bad in (0, -1, 2.5, True, None):
        with pytest.raises(ValueError, match="long_probe_plan: probe_tokens"):
            long_probe_plan(336, 57, bad)
