"""Partial-rollout resume loop (FullyAsyncLLMServerClient) against a fake aborting replica."""

import asyncio
import copy

import pytest

from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.client import FullyAsyncLLMServerClient, GenerationAborted
from fake_replica import EOS, FakeAbortingReplica, FakePool


def run(coro):
    return asyncio.run(coro)


def test_resume_total_never_exceeds_response_length():
    replica = FakeAbortingReplica(abort_every=2000)
    client = FullyAsyncLLMServerClient(FakePool({"r0": replica}), partial_rollout=True)
    sp = SamplingParams(max_tokens=8192)
    before = copy.deepcopy(sp)
    out = run(client.generate("req-1", [5, 6, 7], sp))
    assert len(out.token_ids) == 8192
    assert out.stop_reason == "length"
    assert out.num_aborts == 4
    assert sp == before, "caller's sampling params were mutated"
    # each resubmission asked only for the remaining budget and carried prompt + generated
    assert [c[2] for c in replica.calls] == [8192, 6192, 4192, 2192, 192]
    assert [c[1] for c in replica.calls] == [3, 2003, 4003, 6003, 8003]
    assert len(out.log_probs) == len(out.token_ids) == len(out.response_versions)


def test_resumed_output_equals_uninterrupted():
    uninterrupted = run(FullyAsyncLLMServerClient(FakePool({"r": FakeAbortingReplica(natural_len=37)}))
                        .generate("a", [1, 2], SamplingParams(max_tokens=64)))
    resumed = run(FullyAsyncLLMServerClient(FakePool({"r": FakeAbortingReplica(abort_every=5, natural_len=37)}))
                  .generate("a", [1, 2], SamplingParams(max_tokens=64)))
    assert resumed.token_ids == uninterrupted.token_ids
    assert len(resumed.token_ids) == 37 and resumed.token_ids[-1] == EOS
    assert resumed.stop_reason == uninterrupted.stop_reason == "completed"
    # the engine's version of every token survives the resumes: 7 aborts -> versions 0..7, 5 tokens each
    assert resumed.response_versions == [k // 5 for k in range(37)]
    assert uninterrupted.response_versions == [0] * 37


def test_no_partial_rollout_does_not_resubmit():
    replica = FakeAbortingReplica(abort_every=3)
    client = FullyAsyncLLMServerClient(FakePool({"r": replica}), partial_rollout=False)
    with pytest.raises(GenerationAborted) as err:
        run(client.generate("x", [1], SamplingParams(max_tokens=10)))
    assert len(replica.calls) == 1, "aborted request was resubmitted"
    assert len(err.value.partial.token_ids) == 3


def test_retries_stay_on_the_same_request_id():
    replica = FakeAbortingReplica(abort_every=2)
    run(FullyAsyncLLMServerClient(FakePool({"r": replica})).generate("sticky-7", [1], SamplingParams(max_tokens=7)))
    assert {c[0] for c in replica.calls} == {"sticky-7"}


def test_release_on_error():
    class Boom:
        async def generate(self, *a):
            raise RuntimeError("engine died")

    pool = FakePool({"r": Boom()})
    with pytest.raises(RuntimeError):
        run(FullyAsyncLLMServerClient(pool).generate("e", [1], SamplingParams(max_tokens=4)))
    assert pool.inflight["r"] == 0


class _BareEngine:
    """An in-process engine's surface: generate and param_version, no engine_version."""

    param_version = 7

    async def generate(self, request_id, prompt_ids, sampling_params):
        from asyncrl.rollout.base import TokenOutput

        return TokenOutput(token_ids=[EOS], log_probs=[-0.5], response_versions=[self.param_version])


def test_an_agent_loop_given_a_bare_engine_has_the_client_interface():
    """The kind behind 04's ``'HFEngine' object has no attribute 'engine_version'``: an engine used as a
    server manager goes behind a one-server client, so ``engine_version`` (and ``generate``) work."""
    from asyncrl.agent_loop.single_turn import SingleTurnAgentLoop
    from asyncrl.rollout.client import LLMServerClient, as_server_manager

    engine = _BareEngine()
    loop = SingleTurnAgentLoop(engine, None, None)
    assert isinstance(loop.server_manager, LLMServerClient)
    assert run(loop.server_manager.engine_version("r1")) == 7
    assert run(loop.server_manager.generate("r1", [1, 2], SamplingParams(max_tokens=4))).token_ids == [EOS]
    client = FullyAsyncLLMServerClient(FakePool({"r": engine}))
    assert as_server_manager(client) is client and as_server_manager(None) is None, "used as they are"
    with pytest.raises(TypeError, match="generate"):
        as_server_manager(object())


class _Remote:
    """``method.remote(*args)`` -> an awaitable, as a Ray actor handle's method (counts the calls)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def remote(self, *args):
        self.calls.append(args)
        return self.fn(*args)


class FakeActorHandle:
    """A replica actor handle over a FakeAbortingReplica, with ``generate`` and ``generate_many``."""

    def __init__(self, replica, fail_ids=()):
        self.replica, self.fail_ids = replica, set(fail_ids)
        self.generate = _Remote(self._one)
        self.generate_many = _Remote(self._many)

    async def _one(self, request_id, prompt_ids, sp):
        if request_id in self.fail_ids:
            raise ValueError(f"bad request {request_id}")
        return await self.replica.generate(request_id, prompt_ids, sp)

    async def _many(self, requests):
        return list(await asyncio.gather(*(self._one(*r) for r in requests), return_exceptions=True))


def test_coalesced_requests_of_one_group_share_one_replica_call():
    from asyncrl.rollout.client import coalesced

    handle = FakeActorHandle(FakeAbortingReplica(abort_every=4, natural_len=9), fail_ids={"g-3"})
    client = FullyAsyncLLMServerClient(FakePool({"r": handle}), partial_rollout=True)

    async def one(rid, key):
        with coalesced(key):
            return await client.generate(rid, [1, 2], SamplingParams(max_tokens=16))

    async def main():
        group = [one(f"g-{k}", "g") for k in range(6)]
        alone = [one(f"h-{k}", None) for k in range(2)]
        return await asyncio.gather(*group, *alone, return_exceptions=True)

    outs = run(main())
    assert isinstance(outs[3], ValueError)  # one request's error reaches that request only
    for o in outs[:3] + outs[4:]:  # every other one resumed across 2 aborts to its natural end
        assert o.stop_reason == "completed" and len(o.token_ids) == 9 and o.num_aborts == 2
    # group g: one call per round (first + 2 resumes), each carrying every request still going;
    # h-*: one call each per round, never coalesced
    assert [len(c[0]) for c in handle.generate_many.calls] == [6, 5, 5]
    assert sorted(c[0] for c in handle.generate.calls) == ["h-0", "h-0", "h-0", "h-1", "h-1", "h-1"]
