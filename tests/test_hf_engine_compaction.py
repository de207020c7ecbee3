"""Adversarial checks of ``ContinuousBatcher.compact``: a request moved to a lower slot gets what it gets alone.

The batcher-level test drives random schedules (admissions in the same iteration as moves, prompts shared by
several slots, aborts, greedy and seeded rows with different filters, stop ids, stop checks, top log-probs,
budgets cut by ``max_len``, a weight version per iteration) and compares every request with the same request
decoded alone; the engine-level test cancels a moved request, freezes another with ``pause("keep")``, and admits
a late request into a freed slot after a second move.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch

from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.hf_batch import ContinuousBatcher
from asyncrl.rollout.hf_requests import Finished, SlotRequest
from asyncrl.rollout.hf_forward import StaticCacheLM
from test_hf_engine import PROMPTS, run

MAX_LEN = 40


@pytest.fixture(scope="module")
def tiny_model(random_model_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).eval()


def _random_request(rng: random.Random, i: int, shared: list[list[int]]) -> SlotRequest:
    prompt = rng.choice(shared) if rng.random() < 0.4 else [rng.randrange(3, 96) for _ in range(rng.randint(1, 12))]
    kind, kw = rng.random(), {}
    if kind < 0.3:
        kw["temperature"] = 0.0
    elif kind < 0.6:
        kw.update(temperature=rng.choice([0.7, 1.0]), top_k=rng.choice([-1, 10]))
    else:
        kw.update(temperature=1.0, top_p=rng.choice([1.0, 0.9]))
    if rng.random() < 0.3:
        kw["stop_token_ids"] = [rng.randrange(3, 96) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        kw["top_logprobs"] = rng.randint(1, 4)
    if rng.random() < 0.3:
        a = rng.randrange(7)
        kw["stop_check"] = lambda ids, a=a: len(ids) > 3 and ids[-1] % 7 == a
    # budgets past MAX_LEN - len(prompt) end at max_len
    return SlotRequest(f"r{i}", prompt, rng.choice([1, 2, 3, 5, 10, 30, 60]), rng.randrange(2**64), **kw)


def _alone(model, req: SlotRequest) -> Finished:
    b = ContinuousBatcher(StaticCacheLM(model, 1, MAX_LEN), cuda_graphs=False)
    done = b.add([req])
    while not done:
        done = b.step()
    return done[0]


def _schedule(model, seed: int, slots: int, bucketed: bool):
    """Random admissions and aborts, one version per iteration; returns requests, results, and when each was
    admitted / aborted, plus how many times each request moved. ``bucketed``: rows and kv lengths rounded up to
    the CUDA-graph buckets (idle rows inside ``[0, r)``; moves only when the bucket drops), decoded eagerly."""
    rng = random.Random(seed)
    shared = [[rng.randrange(3, 96) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    b = ContinuousBatcher(StaticCacheLM(model, slots, MAX_LEN), cuda_graphs=False,
                          max_prefill_tokens=rng.choice([12, 10000]))
    if bucketed:
        b.cuda_graphs = True
        b._run_decode = lambda key, fn: fn()
    moved: dict[str, int] = {}
    compact = b.compact

    def counting_compact() -> int:
        before = list(b._reqs)
        n = compact()
        for s, r in enumerate(b._reqs):
            if r is not None and before[s] is not r:
                moved[r.request_id] = moved.get(r.request_id, 0) + 1
        return n

    b.compact = counting_compact
    pending = [_random_request(rng, i, shared) for i in range(rng.randint(slots, 3 * slots))]
    reqs = {r.request_id: r for r in pending}
    admitted: dict[str, int] = {}
    aborted: dict[str, int] = {}
    results: dict[str, Finished] = {}
    it = 0
    while pending or b.num_active:
        active = b.active_ids()
        if active and rng.random() < 0.2:
            ids = set(rng.sample(active, rng.randint(1, len(active))))
            aborted.update(dict.fromkeys(ids, it))
            results.update((f.request_id, f) for f in b.abort(ids))
        n = rng.randint(0, min(b.num_free, len(pending))) if rng.random() < 0.5 else 0
        batch, pending = pending[:n], pending[n:]
        admitted.update(dict.fromkeys((r.request_id for r in batch), it))
        finished = b.add(batch, version=it) if batch else []
        finished += b.step(version=it)
        results.update((f.request_id, f) for f in finished)
        it += 1
        assert it < 500
    assert b.num_free == slots and not b._tops and not b._stop_checks
    return reqs, results, admitted, aborted, moved


@pytest.mark.parametrize("slots,bucketed", [(5, False), (8, False), (16, False), (16, True)])
def test_moved_requests_get_what_they_get_alone_under_random_schedules(tiny_model, slots, bucketed):
    total_moved, twice = 0, 0
    for seed in range(6):
        reqs, results, admitted, aborted, moved = _schedule(tiny_model, 1000 * slots + seed, slots, bucketed)
        total_moved += len(moved)
        twice += sum(v > 1 for v in moved.values())
        for rid, req in reqs.items():
            got, ref = results[rid], _alone(tiny_model, req)
            n, reason = len(ref.token_ids), ref.stop_reason
            if got.stop_reason == "aborted":  # tokens 0 and 1 in its first iteration, one per iteration after
                assert rid in aborted
                n, reason = aborted[rid] - admitted[rid] + 1, "aborted"
                assert n < len(ref.token_ids)
            t = admitted[rid]
            where = f"seed {seed} {rid} moved {moved.get(rid, 0)}x"
            assert (got.token_ids, got.stop_reason) == (ref.token_ids[:n], reason), where
            assert got.versions == ([t] + [t + j for j in range(n - 1)])[:n], where
            np.testing.assert_allclose(got.log_probs, ref.log_probs[:n], atol=5e-5, err_msg=where)  # batch-size noise
            if req.top_logprobs:
                assert len(got.top_logprobs) == n, where
                for a, b in zip(got.top_logprobs, ref.top_logprobs):
                    assert [i for i, _ in a] == [i for i, _ in b], where
                    np.testing.assert_allclose([v for _, v in a], [v for _, v in b], atol=5e-5, err_msg=where)
            else:
                assert got.top_logprobs is None, where
    assert total_moved >= 5 and twice >= 1  # the schedules did exercise compaction


def test_moved_request_cancelled_frozen_and_a_late_one_admitted(random_model_dir):
    """Two long seeded requests move to slots 0 and 1 once six short ones finish; the caller of the one in
    slot 0 goes away while the engine is frozen (pause keep), so after resume the other moves again (1 -> 0)
    and a late request takes slot 1. The survivor and the late one get exactly what they get alone."""
    short = SamplingParams(max_tokens=2, temperature=1.0, ignore_eos=True)
    long = [SamplingParams(max_tokens=60, temperature=1.0, seed=70 + i, ignore_eos=True, logprobs=True,
                           top_logprobs=2) for i in range(2)]
    late_sp = SamplingParams(max_tokens=12, temperature=0.8, top_k=20, seed=5, ignore_eos=True, logprobs=True)

    async def wait_for(cond):
        while not cond():
            await asyncio.sleep(0.001)

    async def body(eng):
        alone = await eng.generate("alone1", PROMPTS[11], long[1])
        alone_late = await eng.generate("alone_late", PROMPTS[20], late_sp)
        shorts = [asyncio.create_task(eng.generate(f"s{i}", PROMPTS[i], short)) for i in range(6)]
        longs = [asyncio.create_task(eng.generate(f"l{i}", PROMPTS[10 + i], sp)) for i, sp in enumerate(long)]
        await wait_for(lambda: eng.batcher.moves >= 2)
        await eng.pause("keep")
        slots = [None if r is None else r.request_id for r in eng.batcher._reqs[:3]]
        longs[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await longs[0]
        await wait_for(lambda: eng.num_inflight == 1)
        frozen_free = eng.batcher.num_free
        await eng.resume()
        await wait_for(lambda: eng.batcher.moves >= 3)
        late = await eng.generate("late", PROMPTS[20], late_sp)
        survivor = await longs[1]
        await asyncio.gather(*shorts)
        return alone, alone_late, slots, frozen_free, late, survivor, eng.batcher.moves, eng.batcher.num_free

    alone, alone_late, slots, frozen_free, late, survivor, moves, free = run(
        dict(model_path=str(random_model_dir), max_num_seqs=8, max_model_len=96), body)
    assert slots == ["l0", "l1", None] and frozen_free == 7 and moves == 3 and free == 8
    for got, ref in ((survivor, alone), (late, alone_late)):
        assert got.token_ids == ref.token_ids and got.stop_reason == ref.stop_reason == "length"
        np.testing.assert_allclose(got.log_probs, ref.log_probs, atol=1e-5)
    assert [[t for t, _ in x] for x in survivor.top_logprobs] == [[t for t, _ in x] for x in alone.top_logprobs]


def test_top_logprobs_of_requests_asking_for_different_counts_in_one_batch(random_model_dir):
    """Rows pack the batch's largest k of top ids, then as many top log-probs: a request asking for fewer
    read ids as its log-probs (e.g. ``(15, 15.0)``), in the prefill and in every step shared with it."""
    sps = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=k)
           for k in (1, 3, 2)]

    async def body(eng):
        alone = [await eng.generate(f"alone{i}", PROMPTS[4 + i], sp) for i, sp in enumerate(sps)]
        together = await asyncio.gather(*(eng.generate(f"t{i}", PROMPTS[4 + i], sp) for i, sp in enumerate(sps)))
        return alone, together

    alone, together = run(dict(model_path=str(random_model_dir), max_num_seqs=4, max_model_len=64), body)
    for k, a, t in zip((1, 3, 2), alone, together):
        assert t.token_ids == a.token_ids and len(t.top_logprobs) == 8
        for tid, lp, alts, ref in zip(t.token_ids, t.log_probs, t.top_logprobs, a.top_logprobs):
            assert len(alts) == k and alts[0][0] == tid and alts[0][1] == pytest.approx(lp, abs=1e-5)  # greedy
            assert all(v <= 0 for _, v in alts) and [v for _, v in alts] == sorted((v for _, v in alts), reverse=True)
            assert [i for i, _ in alts] == [i for i, _ in ref]
            np.testing.assert_allclose([v for _, v in alts], [v for _, v in ref], atol=1e-5)
