"""Conformance with the seams in :mod:`asyncrl.api`, by calling every method a protocol declares.

A recording wrapper notes which protocol methods a test called; each test ends by checking it called
them all, so a method added to a protocol without a conforming, exercised implementation fails here.
The fsdp2 engine's conformance (2 gloo ranks, and 2 GPUs) is in ``test_gpu_trainer.py``; checkpoint
engines into real replicas (Ray) in ``test_gpu_wiring.py``.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading

import pytest
import torch

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.api import CheckpointEngine, InferenceEngine, TrainEngine, WeightSender, protocol_methods
from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.hf_backend import HFEngine
from asyncrl.sync.bucket import iter_buckets, plan_buckets
from asyncrl.sync.gloo import open_gloo_store
from asyncrl.sync.nccl_engine import NCCLCheckpointEngine, NCCLSyncConfig
from asyncrl.sync.receiver import tensor_digest
from asyncrl.trainer.engine import TrainEngine as CPUTrainEngine
from asyncrl.trainer.engine import collate


class Recorder:
    """Forwards attribute access to ``target`` and records the names of the protocol's methods used."""

    def __init__(self, target, proto):
        self._target, self._names, self.used = target, set(protocol_methods(proto)), set()

    def __getattr__(self, name):
        if name in self._names:
            self.used.add(name)
        return getattr(self._target, name)

    def missing(self) -> set:
        return self._names - self.used


def _batch(vocab: int = 96):
    g = torch.Generator().manual_seed(0)
    outs = []
    for i in range(3):
        n = 4 + i
        outs.append(AgentLoopOutput(
            prompt_ids=torch.randint(3, vocab, (3,), generator=g).tolist(),
            response_ids=torch.randint(3, vocab, (n,), generator=g).tolist(), response_mask=[1] * (n - 1) + [0],
            response_logprobs=[-1.0] * (n - 1) + [0.0], response_versions=[0] * n, reward_score=float(i)))
    return collate(outs, ["g0", "g0", "g1"])


def _loss(log_probs, mb, scale, entropy):
    loss = -(log_probs * mb.response_mask).sum() / max(scale.tokens, 1.0)
    return loss, {"actor/pg_loss": float(loss.detach())}


def test_cpu_train_engine_conforms(random_model_dir):
    eng = Recorder(CPUTrainEngine(str(random_model_dir), lr=1e-2, warmup=1, total_updates=10, with_reference=True),
                   TrainEngine)
    assert isinstance(eng._target, TrainEngine)
    batch = _batch()
    before = eng.compute_log_probs(batch)
    ref = eng.compute_ref_log_probs(batch)
    assert before.shape == batch.response_mask.shape and torch.equal(before, ref)  # same weights at start
    metrics = eng.update(batch, _loss)
    assert {"actor/pg_loss", "actor/grad_norm", "actor/lr"} <= set(metrics)
    after = eng.compute_log_probs(batch)
    mask = batch.response_mask > 0
    assert after[mask].sum() > before[mask].sum()  # the step raised the response log-likelihood
    state = copy.deepcopy(eng.state_dict())
    saved = {n: t.clone() for n, t in eng.named_tensors_for_sync()}
    lr = eng.scheduler.get_last_lr()
    eng.update(batch, _loss)  # move on, then come back
    assert not all(torch.equal(t, saved[n]) for n, t in eng.named_tensors_for_sync())
    eng.load_state_dict(state)
    assert eng.updates == 1 and eng.scheduler.get_last_lr() == lr
    assert all(torch.equal(t, saved[n]) for n, t in eng.named_tensors_for_sync())
    assert eng.missing() == set()


def _gloo_sender(store, tensors, bucket):
    from asyncrl.sync.gloo import gloo_broadcast, make_gloo_group

    group = make_gloo_group("127.0.0.1", store.port, 0, 2, 60, store=store)
    for buf, _ in iter_buckets(tensors, bucket):
        gloo_broadcast(group, buf, 0)


def _nccl_sender(eng, tensors, version):
    eng.send_weights_sync(iter(tensors), version)
    eng.close()


def test_hf_engine_conforms_to_inference_engine(random_model_dir):
    raw = HFEngine(str(random_model_dir))
    eng = Recorder(raw, InferenceEngine)
    assert isinstance(raw, InferenceEngine)

    def weights(seed):
        g = torch.Generator().manual_seed(seed)
        return [(n, torch.randn(p.shape, generator=g).to(p.dtype)) for n, p in raw.model.named_parameters()]

    async def main():
        await eng.start()
        assert eng.num_weight_workers == 1 and eng.param_version == 0
        sp = SamplingParams(max_tokens=300, temperature=1.0, ignore_eos=True)
        task = asyncio.create_task(eng.generate("a", [4, 5], sp))
        while eng.num_inflight == 0:
            await asyncio.sleep(0.01)
        await eng.pause("keep")
        await eng.resume()
        assert await eng.abort_all_requests() == 1
        out = await task
        assert out.stop_reason == "aborted" and out.response_versions == [0] * len(out.token_ids)
        await eng.pause("abort")
        await eng.resume()
        # RPC transport
        sent = weights(1)
        await eng.begin_weight_update()
        for bucket, metas in iter_buckets(sent, 1000):
            await eng.load_bucket(bucket, metas)
        assert await eng.finish_weight_update(3) == len(sent)
        out = await eng.generate("b", [4, 5], SamplingParams(max_tokens=3, ignore_eos=True))
        assert out.response_versions == [3, 3, 3]
        digests = await eng.param_digests()
        assert all(digests[n] == tensor_digest(t) for n, t in sent)
        sums = await eng.param_checksums()
        assert sums[sent[0][0]] == pytest.approx(float(sent[0][1].double().sum()))
        # gloo transport (the trainer side in a thread)
        sent, store = weights(2), open_gloo_store("127.0.0.1", 0, 2, 60)  # binds its own port: no race
        th = threading.Thread(target=_gloo_sender, args=(store, sent, 1000))
        th.start()
        assert await eng.gloo_init("127.0.0.1", store.port, 1, 2, 60) == [1]
        plan = plan_buckets(((n, t.dtype, tuple(t.shape)) for n, t in sent), 1000)
        assert await eng.gloo_receive(plan, 4) == len(sent)
        th.join()
        digests = await eng.param_digests()
        assert all(digests[n] == tensor_digest(t) for n, t in sent) and eng.param_version == 4
        # nccl engine's transport over gloo
        sent = weights(3)
        sender = NCCLCheckpointEngine(NCCLSyncConfig(master_port=0, world_size=2, bucket_mb=1 / 1024, backend="gloo",
                                                     metadata_channel="store", timeout_s=60))
        port = sender.open_store()
        th = threading.Thread(target=_nccl_sender, args=(sender, sent, 5))
        th.start()
        assert await eng.nccl_init("127.0.0.1", port, 1, 2, 60) == [1]
        assert await eng.nccl_receive(5) == len(sent)
        th.join()
        digests = await eng.param_digests()
        assert all(digests[n] == tensor_digest(t) for n, t in sent) and eng.param_version == 5
        await eng.nccl_close()
        assert raw._weights._nccl is None
        await eng.nccl_close()  # idempotent
        await eng.shutdown()

    asyncio.run(main())
    assert eng.missing() == set()


def test_vllm_engine_declares_every_protocol_method_with_its_signature():
    """The vLLM engine cannot run here without the shared replica (test_vllm_backend calls it); its
    methods must at least match the protocol's names and parameters."""
    pytest.importorskip("vllm")
    from asyncrl.rollout.vllm_backend import VLLMEngine

    for name in protocol_methods(InferenceEngine):
        proto, impl = getattr(InferenceEngine, name), getattr(VLLMEngine, name, None)
        assert impl is not None, name
        if callable(proto):
            assert list(inspect.signature(impl).parameters) == list(inspect.signature(proto).parameters), name
            assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(proto), name


def test_registered_checkpoint_engines_and_senders_declare_the_protocol():
    from asyncrl.sync import get_engine_cls
    from asyncrl.sync.sender import LocalWeightSender
    from asyncrl.trainer.worker_group import TrainWorkerGroup

    for name in ("cpu", "gloo", "cpu_rpc", "nccl"):
        cls = get_engine_cls(name)
        for m in protocol_methods(CheckpointEngine):
            assert inspect.iscoroutinefunction(getattr(cls, m)), (name, m)
    for cls in (LocalWeightSender, TrainWorkerGroup):
        for m in protocol_methods(WeightSender):
            assert inspect.iscoroutinefunction(getattr(cls, m)), (cls, m)


class _FakeActorMethod:
    """``handle.method.remote(*args)`` -> an awaitable, like a Ray actor method (test-only)."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        out = self.fn(*args)
        return asyncio.ensure_future(out) if inspect.isawaitable(out) else _done(out)


def _done(value):
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


class FakeReplicaHandle:
    """The replica actor's weight methods over an in-process engine, without Ray (fake, tests only)."""

    def __init__(self, engine):
        self.num_weight_workers = _FakeActorMethod(lambda: engine.num_weight_workers)
        self.init_nccl_receiver = _FakeActorMethod(engine.nccl_init)
        self.receive_weights_nccl = _FakeActorMethod(engine.nccl_receive)
        self.close_nccl_receiver = _FakeActorMethod(engine.nccl_close)
        self.param_digests = _FakeActorMethod(engine.param_digests)


def test_nccl_replica_engine_delivers_into_the_engines_own_tensors_over_gloo(random_model_dir):
    """The ``nccl`` checkpoint engine's orchestration (connect, receivers launched, send, acks) into two
    hf engines, over gloo; the engines' parameter tensors are the same objects before and after."""
    from asyncrl.sync import get_engine_cls
    from asyncrl.sync.sender import LocalWeightSender, verify_sync

    engines = [HFEngine(str(random_model_dir)) for _ in range(2)]
    trainer = CPUTrainEngine(str(random_model_dir), lr=1e-2, warmup=0, total_updates=1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)  # differs from what the engines loaded

    async def main():
        for e in engines:
            await e.start()
        ids_before = [{n: id(p) for n, p in e.model.named_parameters()} for e in engines]
        handles = [FakeReplicaHandle(e) for e in engines]
        ckpt = get_engine_cls("nccl")(handles, bucket_bytes=4096, backend="gloo", timeout_s=60)
        sender = LocalWeightSender(trainer, ckpt)
        for version in (1, 2):
            m = await sender.send(version)
            assert m["sync/buckets"] > 1 and (version > 1 or m["sync/connect_s"] > 0)
            assert (await verify_sync(sender, handles))["sync/verified_tensors"] == len(dict(trainer.model.named_parameters()))
        ids_after = [{n: id(p) for n, p in e.model.named_parameters()} for e in engines]
        assert all(e._weights._nccl is not None for e in engines)
        await sender.shutdown()
        # NCCL's teardown is collective: the sender's shutdown takes every receiver out with it, at once
        assert ckpt.sender is None and all(e._weights._nccl is None for e in engines)
        for e in engines:
            await e.shutdown()  # closes the receivers' sockets (an open zmq socket keeps the process alive)
        return ids_before, ids_after

    ids_before, ids_after = asyncio.run(main())
    assert ids_after == ids_before and all(e.param_version == 2 for e in engines)
