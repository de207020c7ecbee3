"""Partial-rollout resume loop (FullyAsyncLLMServerClient) against a fake aborting replica."""

import asyncio
import copy
import types

import pytest

from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.client import FullyAsyncLLMServerClient, GenerationAborted
from fake_replica import EOS, FakeAbortingReplica, FakeGatedReplica, FakePool


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
    """A replica actor handle over a fake replica, with ``generate`` and ``generate_many`` (the replica actor's
    own streaming ``generate_many`` over the fake; ``remote`` returns its async generator, as the simulator's
    handles do, where Ray's would be an ObjectRefGenerator). ``die_after``: the stream fails with a replica
    fault right after that many batches (a replica that died mid-call)."""

    def __init__(self, replica, fail_ids=(), die_after=None):
        from asyncrl.rollout.replica import _ReplicaActor

        self.replica, self.fail_ids, self.die_after = replica, set(fail_ids), die_after
        self.generate = _Remote(self._one)
        body = types.SimpleNamespace(generate=self._one, _stats={"group_calls": 0})
        self.generate_many = _Remote(lambda requests: self._many(_ReplicaActor.generate_many(body, requests)))

    async def _one(self, request_id, prompt_ids, sp):
        if request_id in self.fail_ids:
            raise ValueError(f"bad request {request_id}")
        return await self.replica.generate(request_id, prompt_ids, sp)

    async def _many(self, stream):
        from asyncrl.rollout.health import ReplicaUnavailable

        n = 0
        async for batch in stream:
            yield batch
            n += 1
            if n == self.die_after:
                await stream.aclose()
                raise ReplicaUnavailable("replica died mid-call (fake)")


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


def _gated_group(handle, pool, client_cls=FullyAsyncLLMServerClient):
    """Start a coalesced group g-0 (ends at once), g-1 (gated); return the client and the two tasks."""
    from asyncrl.rollout.client import coalesced

    client = client_cls(pool)

    async def one(rid):
        with coalesced("g"):
            return await client.generate(rid, [1, 2], SamplingParams(max_tokens=4))

    return [asyncio.ensure_future(one(f"g-{k}")) for k in range(2)]


def test_a_coalesced_request_returns_and_ends_its_lease_when_it_ends_not_with_its_group():
    """The kind behind 06's 'replicas 91-97% full' (session 10): with one Ray call per group, a request that
    ended early stayed leased at the load balancer until the group's last one ended."""
    replica = FakeGatedReplica()
    handle = FakeActorHandle(replica)
    pool = FakePool({"r": handle})

    async def main():
        slow = replica.gate("g-1")
        fast, late = _gated_group(handle, pool)
        out = await asyncio.wait_for(fast, timeout=5)  # the old code: waits for g-1, which never ends
        assert out.stop_reason == "completed"
        assert replica.running == {"g-1"}, "g-1 still runs in the engine"
        assert pool.inflight["r"] == 1, "only g-1 is leased: g-0's lease ended when g-0 did"
        slow.set()
        assert (await late).stop_reason == "completed"
        assert pool.inflight["r"] == 0

    run(main())
    assert [len(c[0]) for c in handle.generate_many.calls] == [2], "both went in one call"


def test_a_replica_that_dies_mid_call_fails_only_the_requests_still_waiting():
    from asyncrl.rollout.client import LLMServerClient
    from asyncrl.rollout.health import ReplicaFault

    replica = FakeGatedReplica()
    handle = FakeActorHandle(replica, die_after=1)
    pool = FakePool({"r": handle})

    async def main():
        replica.gate("g-1")
        fast, late = _gated_group(handle, pool, LLMServerClient)
        out = await asyncio.wait_for(fast, timeout=5)
        with pytest.raises(ReplicaFault):
            await asyncio.wait_for(late, timeout=5)
        return out

    assert run(main()).stop_reason == "completed"
    assert pool.inflight["r"] == 0
    assert not replica.running, "closing the stream cancelled the request still running"


def test_a_request_the_stream_never_answers_fails_instead_of_hanging():
    from asyncrl.rollout.client import coalesced

    class HalfStream:
        generate = _Remote(lambda *a: None)

        def __init__(self):
            self.generate_many = _Remote(self._many)

        async def _many(self, requests):
            yield [(0, await FakeGatedReplica().generate(*requests[0]))]  # nothing for requests[1]

    pool = FakePool({"r": HalfStream()})
    client = FullyAsyncLLMServerClient(pool)

    async def one(rid):
        with coalesced("g"):
            return await client.generate(rid, [1], SamplingParams(max_tokens=4))

    async def main():
        return await asyncio.wait_for(asyncio.gather(one("a"), one("b"), return_exceptions=True), timeout=5)

    outs = run(main())
    assert outs[0].stop_reason == "completed"
    assert isinstance(outs[1], RuntimeError) and "without a result for request b" in str(outs[1])
    assert pool.inflight["r"] == 0


# --------------------------------------------------------------------------- stale partial rollouts (session 20)


def _sim_replica():
    """The real replica actor body over the simulator's engine (in real time: ~1 ms a decode iteration)."""
    from asyncrl.sim.cost_models import RolloutCostModel
    from asyncrl.sim.engines import CostModelInferenceEngine
    from asyncrl.trainer.hybrid_rollout import LocalReplica

    return LocalReplica(CostModelInferenceEngine(RolloutCostModel(step_s=1e-3, per_seq_s=0.0, per_ctx_token_s=0.0),
                                                 prompt_tokens=4))


def test_a_resubmission_waits_for_the_resume_and_is_refused_on_a_version_past_its_limit():
    async def main():
        body = _sim_replica()
        await body.pause("abort")
        late = SamplingParams(max_tokens=5, ignore_eos=True, max_start_version=1)
        ok = SamplingParams(max_tokens=5, ignore_eos=True, max_start_version=2)
        waiting = [asyncio.ensure_future(body.generate(f"r{i}", [1, 2], sp)) for i, sp in enumerate((late, ok))]
        await asyncio.sleep(0.02)
        assert not any(t.done() for t in waiting)  # paused: both wait for the version they will start on
        await body.engine.finish_weight_update(2)
        await body.resume()
        refused, served = await asyncio.gather(*waiting)
        assert (refused.stop_reason, refused.token_ids) == ("stale", [])  # 2 > 1: not started, no tokens
        assert served.stop_reason == "length" and served.response_versions == [2] * 5
        assert body.stats()["stale"] == 1
        # abort_all_requests releases a request still waiting for a resume: aborted, no tokens, not stale
        await body.pause("abort")
        pending = asyncio.ensure_future(body.generate("r9", [1], late))
        await asyncio.sleep(0.01)
        assert await body.abort_all_requests() == 0  # nothing in the engine ...
        out = await asyncio.wait_for(pending, 1.0)  # ... but the waiter ended
        assert (out.stop_reason, out.token_ids) == ("aborted", []) and body.stats()["stale"] == 1

    run(main())


@pytest.mark.parametrize("resumed_on", [0, 1])
def test_a_partial_rollout_resumed_past_the_staleness_bound_ends_as_stale_generation(resumed_on):
    """The client sends its oldest token's version + the bound with each resubmission; resumed on a newer
    version the request ends as ``StaleGeneration`` (with the tokens so far), else it continues. Outside
    ``staleness_bounded`` (evaluation) there is no limit."""
    from asyncrl.rollout.client import StaleGeneration, staleness_bounded

    async def main(bounded: bool):
        body = _sim_replica()
        client = FullyAsyncLLMServerClient(FakePool({"r": body}), partial_rollout=True)
        with staleness_bounded(0 if bounded else None):  # on-policy: a token of version 0 trains at version 0
            task = asyncio.ensure_future(client.generate("long", [1, 2], SamplingParams(max_tokens=400, ignore_eos=True)))
        await asyncio.sleep(0.05)
        await body.pause("abort")  # a sync: the request returns its tokens and is resubmitted
        await asyncio.sleep(0.01)
        await body.engine.finish_weight_update(resumed_on)
        await body.resume()
        return await task

    if resumed_on == 1:  # 1 - 0 > the bound 0
        with pytest.raises(StaleGeneration) as err:
            run(main(True))
        assert err.value.partial.token_ids and set(err.value.partial.response_versions) == {0}
        out = run(main(False))  # no bound (an evaluation request): it continues on the new version
        assert len(out.token_ids) == 400 and out.response_versions[-1] == 1
    else:
        out = run(main(True))  # resumed on version 0 again: within the bound
        assert len(out.token_ids) == 400 and set(out.response_versions) == {0} and out.num_aborts == 1


def test_the_bound_is_the_samples_a_request_after_an_older_sibling_is_refused():
    """A group is trained whole, so its oldest token counts for every request of it: a request (a sibling, a
    tool loop's next turn) that would start more than the bound past a token another one returned is refused,
    even with no old token of its own."""
    from asyncrl.rollout.client import StaleGeneration, staleness_bounded

    async def main():
        body = _sim_replica()
        client = FullyAsyncLLMServerClient(FakePool({"r": body}), partial_rollout=True)
        sp = SamplingParams(max_tokens=3, ignore_eos=True)
        with staleness_bounded(1) as limit:
            first = await client.generate("g-0", [1], sp)
            assert first.response_versions == [0, 0, 0] and limit.oldest == 0 and limit.max_start_version == 1
            await body.engine.finish_weight_update(1)
            assert (await client.generate("g-1", [1], sp)).response_versions == [1, 1, 1]  # 1 - 0 <= 1
            await body.engine.finish_weight_update(2)
            with pytest.raises(StaleGeneration, match="oldest token \\(version 0\\)"):
                await client.generate("g-2", [1], sp)
        assert (await client.generate("eval-0", [1], sp)).response_versions == [2, 2, 2]  # outside: no limit

    run(main())


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_a_waiting_request_of_an_older_sample_takes_the_free_seat_first_under_priority(policy):
    """``rollout.scheduling_policy=priority``: every request of a trained sample carries the version of the sample's
    oldest token as its ``priority`` (the engine's current version before it has any), so when requests wait for a
    seat (``max_num_seqs``) a resumed long-tail response, nearest the staleness bound, decodes before a fresh group
    that arrived first; ``fcfs`` seats them in arrival order. The real client and replica body over the simulator's
    engine (one seat)."""
    from asyncrl.rollout.client import staleness_bounded
    from asyncrl.sim.cost_models import RolloutCostModel
    from asyncrl.sim.engines import CostModelInferenceEngine
    from asyncrl.trainer.hybrid_rollout import LocalReplica

    async def main():
        body = LocalReplica(CostModelInferenceEngine(
            RolloutCostModel(step_s=1e-3, per_seq_s=0.0, per_ctx_token_s=0.0, max_num_seqs=1), prompt_tokens=4,
            scheduling_policy=policy))
        client = FullyAsyncLLMServerClient(FakePool({"r": body}), partial_rollout=True)
        sp = SamplingParams(max_tokens=3, ignore_eos=True)
        done: list[str] = []

        async def request(rid: str, tokens: int = 3, after_s: float = 0.0) -> None:
            await asyncio.sleep(after_s)
            await client.generate(rid, [1], SamplingParams(max_tokens=tokens, ignore_eos=True))
            done.append(rid)

        with staleness_bounded(None, track=True) as old:  # a sample whose first tokens came on version 0
            await client.generate("old-0", [1], sp)
            late = asyncio.ensure_future(request("old-1", after_s=0.05))  # its next request, after the fresh one
        assert old.oldest == 0 and old.max_start_version is None  # tracked, no bound
        await body.engine.finish_weight_update(1)
        blocker = asyncio.ensure_future(request("blocker", 200))  # holds the only seat for ~200 ms
        await asyncio.sleep(0.02)
        with staleness_bounded(None, track=True):  # a fresh sample: priority = the engine's version, 1
            fresh = asyncio.ensure_future(request("fresh-0"))
        await asyncio.gather(blocker, fresh, late)
        return done

    done = run(main())
    assert done[0] == "blocker"
    assert done[1:] == (["old-1", "fresh-0"] if policy == "priority" else ["fresh-0", "old-1"])
