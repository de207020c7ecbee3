"""Weight sync without vLLM: bucket layout bit-exactness, wire format, gloo broadcast, CPU engines
into HF replicas (invariant 5 of DESIGN.md: bit-exact, bf16 included, tensors larger than a bucket,
odd sizes). The vLLM end of the same engines is in ``test_vllm_backend.py``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time

import pytest
import torch

from asyncrl.sync.bucket import BucketAssembler, iter_buckets, metas_from_wire, metas_to_wire, plan_buckets
from asyncrl.sync.gloo import gloo_broadcast, make_gloo_group, open_gloo_store


def _tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("big.bf16", torch.randn(37, 129, generator=g).to(torch.bfloat16)),  # 9546 B > bucket
        ("odd.fp32", torch.randn(7, 3, 5, generator=g)),
        ("scalar.fp32", torch.tensor(3.25)),
        ("empty.fp32", torch.empty(0, 4)),
        ("ids.int64", torch.arange(-5, 1000, 7)),
        ("half", torch.randn(13, generator=g).half()),
        ("mask.bool", torch.rand(11, generator=g) > 0.5),
        ("nan_inf.bf16", torch.tensor([float("nan"), float("inf"), -0.0, 1e-40]).to(torch.bfloat16)),
    ]


def _roundtrip(named, bucket_bytes):
    asm, got = BucketAssembler(), {}
    for bucket, metas in iter_buckets(named, bucket_bytes):
        # a bucket is at most bucket_bytes, or holds one tensor larger than that, whole
        assert bucket.dtype == torch.uint8 and (bucket.numel() <= bucket_bytes or
                                                [m.nbytes for m in metas if m.nbytes] == [bucket.numel()])
        got.update(asm.feed(bucket, metas_from_wire(metas_to_wire(metas))))
    assert asm.pending == []
    return got


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8) if a.numel() else a,
                                                                     b.reshape(-1).view(torch.uint8) if b.numel() else b)


@pytest.mark.parametrize("bucket_bytes", [1, 1000, 4093, 1 << 20])
def test_buckets_roundtrip_bit_exact(bucket_bytes):
    named = _tensors()
    got = _roundtrip(named, bucket_bytes)
    assert list(got) == [n for n, _ in named]
    for name, t in named:
        assert _bit_equal(got[name], t), name


def test_tensor_larger_than_bucket_gets_a_bucket_of_its_own():
    """Not bucket_bytes chunks over consecutive buckets (thousands of buckets, each a ray.put and an RPC, when
    sync_bucket_size_mb was tiny): one bucket its size, as slime; the tensors around it pack as before."""
    plan = plan_buckets([("a", torch.float32, (10,)), ("w", torch.bfloat16, (37, 129)), ("b", torch.float32, (10,))],
                        4093)
    assert [[(m.name, m.tensor_offset, m.bucket_offset, m.nbytes) for m in metas] for metas in plan] == [
        [("a", 0, 0, 40)], [("w", 0, 0, 37 * 129 * 2)], [("b", 0, 0, 40)]]
    assert plan[1][0].is_last


def test_a_tensor_straddling_a_bucket_end_is_still_split():
    plan = plan_buckets([("a", torch.float32, (600,)), ("b", torch.float32, (600,))], 4000)
    assert [[(m.name, m.tensor_offset, m.nbytes) for m in metas] for metas in plan] == [
        [("a", 0, 2400), ("b", 0, 1600)], [("b", 1600, 800)]]


def test_wire_metas_roundtrip():
    plan = plan_buckets([(n, t.dtype, tuple(t.shape)) for n, t in _tensors()], 777)
    for metas in plan:
        assert metas_from_wire(metas_to_wire(metas)) == metas


def _receiver(port: int, plan, queue) -> None:
    group = make_gloo_group("127.0.0.1", port, 1, 2, 60)
    asm, got = BucketAssembler(), {}
    for metas in plan:
        buf = torch.empty(max(m.bucket_offset + m.nbytes for m in metas), dtype=torch.uint8)
        gloo_broadcast(group, buf, 0)
        got.update(asm.feed(buf, metas))
    # plain bytes: a tensor on a multiprocessing queue travels as a file descriptor that this process must
    # outlive; it exits right after the put (CI: ConnectionResetError in the parent's get)
    queue.put({n: (str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
               for n, t in got.items()})


def test_gloo_broadcast_bit_exact_across_processes():
    named = _tensors()
    plan = plan_buckets([(n, t.dtype, tuple(t.shape)) for n, t in named], 4093)
    store = open_gloo_store("127.0.0.1", 0, 2, 60)  # rank 0 here: it binds its own port, no race
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(store.port, plan, queue))
    proc.start()
    try:
        group = make_gloo_group("127.0.0.1", store.port, 0, 2, 60, store=store)
        for bucket, _ in iter_buckets(named, 4093):
            gloo_broadcast(group, bucket, 0)
        got = queue.get(timeout=60)
    finally:
        proc.join(timeout=30)
    for name, t in named:
        dtype, shape, raw = got[name]
        assert dtype == str(t.dtype) and shape == tuple(t.shape)
        if t.numel():
            assert raw == t.reshape(-1).view(torch.uint8).numpy().tobytes(), name


# --------------------------------------------------------------------------- CPU engines -> HF replicas


def _hf_state(replica) -> dict[str, torch.Tensor]:
    import ray

    return ray.get(replica.actor.__ray_call__.remote(
        lambda self: {n: p.detach().clone() for n, p in self.engine.model.named_parameters()}))


@pytest.fixture(scope="module")
def hf_replicas(ray_session, random_model_dir):
    from asyncrl.rollout.replica import RolloutReplica

    reps = [RolloutReplica("hf", {"model_path": str(random_model_dir), "dtype": dtype}, replica_rank=i)
            for i, dtype in enumerate(["float32", "bfloat16"])]
    for r in reps:
        r.wait_ready(timeout=300)
    yield reps
    for r in reps:
        r.shutdown()


@pytest.mark.parametrize("name", ["cpu", "gloo", "cpu_rpc"])
def test_cpu_engines_deliver_bit_exact(hf_replicas, name):
    from asyncrl.sync import get_engine_cls

    fp32, _ = hf_replicas
    state = _hf_state(fp32)
    g = torch.Generator().manual_seed(hash(name) % 1000)
    sent = [(n, (t + torch.randn(t.shape, generator=g))) for n, t in state.items()]
    engine = get_engine_cls(name)([fp32], bucket_bytes=3001)
    metrics = asyncio.run(engine.send_weights(sent, version=5))
    asyncio.run(engine.shutdown())
    assert metrics["sync/bytes"] == sum(t.numel() * 4 for _, t in sent)
    got = _hf_state(fp32)
    assert fp32.param_version() == 5
    for n, t in sent:
        assert _bit_equal(got[n], t), (fp32.server_id, n)


@pytest.mark.parametrize("name", ["cpu", "gloo", "cpu_rpc"])
def test_a_dtype_the_replica_does_not_hold_is_refused_without_a_hang(hf_replicas, name):
    """One model dtype for trainer and rollout (``actor_rollout_ref.model.dtype``): float32 weights sent
    to a bfloat16 replica are refused with the key to fix, the replica keeps its weights, and over gloo
    the refusing receiver still takes part in every broadcast so the sender returns (it used to wait
    out the 600 s gloo timeout) and the group stays usable for the next, correct sync."""
    from asyncrl.sync import get_engine_cls

    fp32, bf16 = hf_replicas
    before = _hf_state(bf16)
    wrong = [(n, t.float() + 1.0) for n, t in before.items()]
    engine = get_engine_cls(name)([bf16], bucket_bytes=3001)
    t0 = time.perf_counter()
    with pytest.raises(Exception, match="actor_rollout_ref.model.dtype"):
        asyncio.run(engine.send_weights(wrong, version=7))
    assert time.perf_counter() - t0 < 60
    assert all(_bit_equal(_hf_state(bf16)[n], t) for n, t in before.items())
    right = [(n, t.float().add(0.5).to(torch.bfloat16)) for n, t in before.items()]
    asyncio.run(engine.send_weights(right, version=8))
    asyncio.run(engine.shutdown())
    got = _hf_state(bf16)
    assert bf16.param_version() == 8 and all(_bit_equal(got[n], t) for n, t in right)


def test_bf16_trainer_weights_bit_exact(hf_replicas):
    from asyncrl.sync import get_engine_cls

    _, bf16 = hf_replicas
    state = _hf_state(bf16)
    sent = [(n, (t.float() * 1.5 + 0.01).to(torch.bfloat16)) for n, t in state.items()]
    asyncio.run(get_engine_cls("cpu")([bf16], bucket_bytes=1000).send_weights(sent, version=6))
    got = _hf_state(bf16)
    assert all(_bit_equal(got[n], t) for n, t in sent)


def test_default_cpu_engine_is_the_measured_winner():
    from asyncrl.sync import get_engine_cls
    from asyncrl.sync.cpu_engine import GlooCheckpointEngine

    assert get_engine_cls("cpu") is GlooCheckpointEngine


def test_unknown_engine_lists_known():
    from asyncrl.sync import get_engine_cls

    with pytest.raises(ValueError, match="cpu_rpc"):
        get_engine_cls("carrier_pigeon")
