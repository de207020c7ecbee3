"""CPU tests of the NCCL checkpoint engine's logic: layout, channel, gloo group, sequence, errors.

The transport code is the same as on GPU; with ``backend="gloo"`` it runs synchronously on CPU,
so chunking, metadata ordering, rebuilds, acks and timeouts are covered here. Stream/event
overlap is covered by ``tests/test_gpu_sync.py`` on GPUs.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.net import free_port
from asyncrl.sync.bucket import plan_buckets
from asyncrl.sync.metadata import BucketMsg, StoreChannel, iter_bucket_plan, pack_bucket, unpack_bucket
from asyncrl.sync.nccl_engine import NCCLCheckpointEngine, NCCLSyncConfig, NCCLWeightReceiver, require_backend
from asyncrl.sync.sync_sequence import STEPS, SyncSteps, run_sync_sequence

# name -> (shape, dtype); "embed" is larger than the 16 KiB test bucket, sizes are odd on purpose.
SPEC = {
    "model.embed_tokens.weight": ((1000, 37), torch.bfloat16),
    "model.norm.weight": ((13,), torch.bfloat16),
    "odd.bias": ((7,), torch.float32),
    "scalar": ((), torch.float32),
    "big.fp32": ((131, 67), torch.float32),
    "ints": ((5,), torch.int64),
    "empty": ((0, 3), torch.float32),
}


def make_tensors(round_: int, device: str = "cpu", spec=SPEC) -> dict[str, torch.Tensor]:
    """Deterministic per-round values, with -0.0, inf and nan planted in float tensors."""
    out = {}
    for i, (name, (shape, dtype)) in enumerate(spec.items()):
        g = torch.Generator().manual_seed(1000 * round_ + i)
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
            if t.numel() >= 3:
                t.view(-1)[:3] = torch.tensor([-0.0, float("inf"), float("nan")]).to(dtype)
        else:
            t = torch.randint(-2**40, 2**40, shape, generator=g, dtype=dtype)
        out[name] = t.to(device)
    return out


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8).cpu(), b.contiguous().reshape(-1).view(torch.uint8).cpu())


def _sender(port, world, channel, rebuild, rounds, q, bucket_mb=16 / 1024):
    try:
        eng = NCCLCheckpointEngine(NCCLSyncConfig(master_port=port, world_size=world, bucket_mb=bucket_mb,
                                                  backend="gloo", metadata_channel=channel, timeout_s=60,
                                                  rebuild_group_each_sync=rebuild))
        stats = []
        for r in range(rounds):
            m = asyncio.run(eng.send_weights(make_tensors(r).items(), version=r))
            stats.append((m["sync/bytes"], m["sync/buckets"]))
        buffers = [b.numel() for b in eng.bufs]
        eng.close()
        q.put(("sender", stats))
    except BaseException as e:  # pragma: no cover - reported to the parent
        q.put(("sender", repr(e)))
        buffers = None
    q.put(("sender_buffers", buffers))


def _receiver(port, world, rank, rounds, q):
    try:
        rx = NCCLWeightReceiver("127.0.0.1", port, rank, world, timeout_s=60)
        bad = []
        for r in range(rounds):
            got: dict[str, torch.Tensor] = {}
            m = rx.receive_weights(lambda ws: got.update({n: t.clone() for n, t in ws}))
            want = make_tensors(r)
            bad += [f"r{r}:{n}" for n in want if n not in got or not bytes_equal(got[n], want[n])]
            bad += [f"r{r}:version" for _ in [0] if m["sync/version"] != r]
        rx.close()
        q.put((f"rx{rank}", bad))
    except BaseException as e:  # pragma: no cover
        q.put((f"rx{rank}", repr(e)))


def _run_group(channel: str, rebuild: bool, receivers: int = 2, rounds: int = 3, bucket_mb: float = 16 / 1024) -> dict:
    ctx = mp.get_context("spawn")
    q, port, world = ctx.Queue(), free_port(), receivers + 1
    procs = [ctx.Process(target=_sender, args=(port, world, channel, rebuild, rounds, q, bucket_mb))]
    procs += [ctx.Process(target=_receiver, args=(port, world, r, rounds, q)) for r in range(1, world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=120) for _ in range(len(procs) + 1))  # + the sender's buffer sizes
    for p in procs:
        p.join(30)
    return results


def test_incremental_plan_matches_plan_buckets():
    tensors = make_tensors(0)
    for bucket in (1, 7, 1000, 16384, 10**6):
        lazy = [metas for metas, _ in iter_bucket_plan(tensors.items(), bucket)]
        ref = plan_buckets(((n, t.dtype, tuple(t.shape)) for n, t in tensors.items()), bucket)
        assert lazy == ref


def test_pack_unpack_roundtrip_bit_exact():
    tensors = make_tensors(1)
    partial: dict = {}
    got = {}
    for metas, srcs in iter_bucket_plan(tensors.items(), 4096):  # the embedding (74 KB) has a bucket of its own
        buf = torch.full((max(4096, max(m.bucket_offset + m.nbytes for m in metas)),), 0xAB, dtype=torch.uint8)
        pack_bucket(buf, metas, srcs)
        got.update({n: t.clone() for n, t in unpack_bucket(buf, metas, partial)})
    assert not partial and set(got) == set(tensors)
    assert all(bytes_equal(got[n], tensors[n]) for n in tensors)


def test_unpack_rejects_lost_bucket():
    plan = list(iter_bucket_plan([("a", torch.zeros(10)), ("w", torch.zeros(10))], 64))  # "w" straddles: 24 + 16
    with pytest.raises(ValueError, match="arrived before its start"):
        unpack_bucket(torch.zeros(64, dtype=torch.uint8), plan[1][0], {})


@pytest.mark.parametrize("channel,rebuild", [("zmq", False), ("store", True)])
def test_gloo_sync_three_rounds_bit_exact(channel, rebuild):
    if channel == "zmq":
        pytest.importorskip("zmq")
    res = _run_group(channel, rebuild)
    assert res["rx1"] == [] and res["rx2"] == [], res
    sent = res["sender"]
    assert isinstance(sent, list) and len(sent) == 3, res
    total = sum(t.numel() * t.element_size() for t in make_tensors(0).values())
    assert all(b == total and n >= 3 for b, n in sent)


@pytest.mark.parametrize("bucket_mb", [1e6, 1e300])
def test_a_huge_bucket_size_sizes_the_buffers_to_the_weights(bucket_mb):
    """``async_training.sync_bucket_size_mb=1e6`` failed allocating two 1 TiB buffers up front, ``1e300``
    overflowed: the buffers are now the size of the largest bucket the weights fill (here all of them, one bucket)."""
    res = _run_group("store", False, receivers=1, rounds=2, bucket_mb=bucket_mb)
    assert res["rx1"] == [], res
    total = sum(t.numel() * t.element_size() for t in make_tensors(0).values())
    assert res["sender"] == [(total, 1.0)] * 2, res
    assert res["sender_buffers"] == [total, 0], res  # one bucket: the second buffer is never used


def _dead_receiver(port):
    rx = NCCLWeightReceiver("127.0.0.1", port, 1, 2, timeout_s=30)
    rx.init_group()
    sys.exit(0)  # joins the group, then dies before the sync


def test_sender_times_out_on_dead_receiver():
    ctx = mp.get_context("spawn")
    eng = NCCLCheckpointEngine(NCCLSyncConfig(master_port=0, world_size=2, bucket_mb=1 / 1024,
                                              backend="gloo", metadata_channel="store", timeout_s=60))
    p = ctx.Process(target=_dead_receiver, args=(eng.open_store(),))  # the sender's store binds its own port
    p.start()
    eng.init_group()
    p.join(30)
    t0 = time.monotonic()
    with pytest.raises(Exception):
        eng.send_weights_sync(make_tensors(0).items(), version=1)
    assert time.monotonic() - t0 < 30
    eng.close()


def test_channel_timeouts_name_the_problem():
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)  # 0: it binds one
    ch = StoreChannel(store, "t")
    with pytest.raises(TimeoutError, match="no metadata"):
        ch.recv(0.2)
    ch.publish(BucketMsg(3, 0, 10))
    assert StoreChannel(store, "t").recv(1.0).version == 3
    zmq = pytest.importorskip("zmq")
    from asyncrl.sync.metadata import ZmqSubscriber
    sub = ZmqSubscriber(f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(TimeoutError, match="no metadata"):
        sub.recv(0.2)
    sub.close()
    assert zmq


def test_missing_dependencies_are_named(monkeypatch):
    from asyncrl.sync import metadata
    monkeypatch.setitem(sys.modules, "zmq", None)
    with pytest.raises(ImportError, match="pyzmq"):
        metadata.require_zmq()
    with pytest.raises(ImportError, match="pyzmq"):
        metadata.ZmqPublisher("127.0.0.1")
    with pytest.raises(ValueError, match="unknown backend"):
        require_backend("mpi")
    if not torch.cuda.is_available():
        with pytest.raises((ImportError, RuntimeError), match="NCCL|CUDA"):
            require_backend("nccl")
        with pytest.raises((ImportError, RuntimeError), match="NCCL|CUDA"):
            NCCLCheckpointEngine(NCCLSyncConfig(master_port=free_port())).init_group()


def test_sync_sequence_order_timings_and_recovery():
    calls: list[str] = []

    def step(name, result=None):
        def f():
            calls.append(name)
            return result
        return f

    async def transfer():
        calls.append("transfer")
        return {"sync/bytes": 10.0, "sync/pause_s": -1.0}

    steps = SyncSteps(transfer=transfer, **{n: step(n) for n in STEPS if n != "transfer"})
    m = asyncio.run(run_sync_sequence(steps))
    assert calls == list(STEPS)
    assert all(m[f"sync/{n}_s"] >= 0 for n in STEPS) and m["sync/bytes"] == 10.0

    calls.clear()

    def boom():
        calls.append("transfer")
        raise RuntimeError("peer died")

    steps = SyncSteps(transfer=boom, **{n: step(n) for n in STEPS if n != "transfer"})
    with pytest.raises(RuntimeError, match="peer died"):
        asyncio.run(run_sync_sequence(steps))
    assert calls == ["pause", "free_cache", "group", "transfer", "restore_cache", "resume"]
