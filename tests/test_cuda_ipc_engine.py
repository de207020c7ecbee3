"""The cuda_ipc checkpoint engine's CPU-side rules (its GPU run: tests/test_gpu_wiring.py, ``gpu``).

The replicas here are fakes (``FakeReplica``): they only answer ``device_uuid``; the engine must keep
the ones on its own GPU and refuse to run with none, naming the GPUs.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.sync import get_engine_cls
from asyncrl.sync import cuda_ipc
from asyncrl.sync.bucket import BucketAssembler, iter_buckets


class _Remote:
    def __init__(self, value):
        self.value = value

    def remote(self):
        async def get():
            return self.value
        return get()


class FakeReplica:
    def __init__(self, uuid):
        self.device_uuid = _Remote(uuid)


def test_registered_by_name():
    assert get_engine_cls("cuda_ipc") is cuda_ipc.CudaIpcCheckpointEngine


def test_keeps_only_the_replicas_on_this_gpu(monkeypatch):
    monkeypatch.setattr(cuda_ipc, "device_uuid", lambda device=None: "GPU-a")
    here, there = FakeReplica("GPU-a"), FakeReplica("GPU-b")
    eng = cuda_ipc.CudaIpcCheckpointEngine([there, here])
    asyncio.run(eng._select_same_gpu(torch.device("cpu")))
    assert eng.replicas == [here]


def test_no_replica_on_this_gpu_is_refused_naming_both(monkeypatch):
    monkeypatch.setattr(cuda_ipc, "device_uuid", lambda device=None: "GPU-a")
    eng = cuda_ipc.CudaIpcCheckpointEngine([FakeReplica("GPU-b")])
    with pytest.raises(RuntimeError, match=r"no replica on this trainer rank's GPU GPU-a \(replicas on \['GPU-b'\]\)"):
        asyncio.run(eng._select_same_gpu(torch.device("cpu")))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_send_is_refused():
    eng = cuda_ipc.CudaIpcCheckpointEngine([FakeReplica("")])
    with pytest.raises(RuntimeError, match="needs CUDA in the trainer process; use cpu"):
        asyncio.run(eng.send_weights([("w", torch.zeros(2))], 1))


def test_buckets_pack_on_the_requested_device_and_rejoin_bit_exact():
    torch.manual_seed(0)
    named = [("a", torch.randn(5, 7).to(torch.bfloat16)), ("b", torch.arange(40, dtype=torch.int64)),
             ("c", torch.randn(300))]
    asm, out = BucketAssembler("cpu"), {}
    sizes = []
    for bucket, metas in iter_buckets(named, 256, device="cpu"):  # "b" (320 bytes) and "c" (1,200) have one each
        assert bucket.device.type == "cpu"
        sizes.append(bucket.numel())
        out.update(dict(asm.feed(bucket, metas)))
    assert not asm.pending and sizes == [70, 320, 1200]
    for name, t in named:
        assert torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)), name
