"""A weight-sync bucket smaller than a tensor (``async_training.sync_bucket_size_mb=0.001``): the tensor gets a bucket
of its own (as slime) instead of being cut into ``bucket_bytes`` chunks over thousands of buckets (a ``ray.put`` and
an RPC each, every sync), and a size under one byte no longer fails the first sync. No Ray, no process group."""

import pytest
import torch

from asyncrl.config import ExperimentConfig
from asyncrl.sync.bucket import BucketAssembler, iter_buckets, plan_buckets
from asyncrl.sync.metadata import iter_bucket_plan, pack_bucket, unpack_bucket
from asyncrl.sync.sender import make_checkpoint_engine


def _state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"model.embed_tokens.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),  # 4 KiB
            "model.layers.0.input_layernorm.weight": torch.randn(32, generator=g),  # 128 B
            "model.layers.0.mlp.up_proj.weight": torch.randn(96, 32, generator=g),  # 12 KiB
            "model.layers.0.mlp.up_proj.bias": torch.randn(96, generator=g),  # 384 B
            "model.norm.weight": torch.randn(32, generator=g),  # 128 B
            "lm_head.weight": torch.randn(64, 32, generator=g)}  # 8 KiB


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("mb", [0.001, 1e-9])
def test_a_tiny_bucket_size_gives_one_bucket_per_large_tensor_bit_exact(mb):
    sd = _state_dict()
    bucket_bytes = make_checkpoint_engine(_cfg(mb), []).bucket_bytes  # 1048 B; 1e-9 MiB: 1 B, was 0 (refused)
    assert bucket_bytes == max(1, int(mb * 2**20))
    asm, got, sizes = BucketAssembler(), {}, []
    for bucket, metas in iter_buckets(sd.items(), bucket_bytes):
        sizes.append(bucket.numel())
        got.update(asm.feed(bucket, metas))
    assert not asm.pending and list(got) == list(sd)
    assert all(_bytes(got[n]) == _bytes(t) and got[n].dtype == t.dtype and got[n].shape == t.shape
               for n, t in sd.items())
    large = [t.numel() * t.element_size() for t in sd.values() if t.numel() * t.element_size() > bucket_bytes]
    assert len(sizes) <= len(sd)  # was sum(bytes) / 1048 = 24 buckets at 0.001 MiB (2,140 for the tiny model)
    assert sorted(large) == sorted(s for s in sizes if s > bucket_bytes)  # each large tensor whole, alone


def test_the_nccl_layout_is_the_same_and_round_trips():
    """The streamed layout (NCCL / gloo engine) matches plan_buckets, and a bucket larger than the buffer size
    round-trips (the engine grows its buffer to it: NCCLCheckpointEngine.buffer)."""
    sd = _state_dict()
    lazy = [metas for metas, _ in iter_bucket_plan(sd.items(), 1048)]
    assert lazy == plan_buckets(((n, t.dtype, tuple(t.shape)) for n, t in sd.items()), 1048)
    partial, got = {}, {}
    for metas, srcs in iter_bucket_plan(sd.items(), 1048):
        buf = torch.empty(max(m.bucket_offset + m.nbytes for m in metas), dtype=torch.uint8)
        pack_bucket(buf, metas, srcs)
        got.update({n: t.clone() for n, t in unpack_bucket(buf, metas, partial)})
    assert not partial and all(_bytes(got[n]) == _bytes(t) for n, t in sd.items())


def test_the_nccl_endpoint_grows_a_buffer_for_a_large_bucket():
    from asyncrl.sync.nccl_engine import NCCLSyncConfig, _Endpoint  # what sender and receiver share

    rx = _Endpoint(NCCLSyncConfig(bucket_mb=1 / 1024, backend="gloo", device="cpu"), 0)
    assert rx.buffer(0, 100).numel() == 100 and rx.bufs[0].numel() == 100  # the bucket's size, not 1024 up front
    assert rx.buffer(0, 60).numel() == 60 and rx.bufs[0].numel() == 100  # a smaller bucket reuses it
    assert rx.buffer(1, 5000).numel() == 5000 and rx.bufs[1].numel() == 5000 and rx.bufs[0].numel() == 100


def _cfg(mb: float) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.async_training.sync_bucket_size_mb = mb
    cfg.actor_rollout_ref.rollout.checkpoint_engine.backend = "cpu"
    return cfg
