"""CUDA-IPC checkpoint engine: a colocated trainer rank hands its weights to the replica on its own GPU.

::

    trainer rank r (GPU g)                                   replica r (GPU g, another process)
      named_tensors_for_sync() -> iter_buckets(device=cuda)
      bucket (uint8, on GPU g) -> reduce_tensor -> handle ─► receive_weights_ipc([(handle, metas), ...])
                                                              rebuild (maps the same GPU memory, no copy)
                                                              BucketAssembler(cuda) -> copy_ into the model
      buckets freed after the replica returns  ◄───────────

With ``actor_rollout_ref.hybrid_engine=True`` on GPUs each trainer rank shares a GPU with one replica
(:mod:`asyncrl.placement`, the "colocated" layout). NCCL cannot join two ranks on one GPU and the
``cpu`` engine copies every byte GPU -> host -> TCP -> host -> GPU (2.1 s for 0.99 GB on an H200,
``benchmarks/RESULTS.md``); here each rank's full (all-gathered) tensors stay on the device and the
replica maps them through CUDA IPC (``torch.multiprocessing.reductions.reduce_tensor``, the handle
pickles through Ray) and copies device to device: verl's hybrid engine hands weights over in process,
this is the nearest a two-process colocated layout gets. Every rank sends to its own replica (each
holds the full tensors of a sync bucket while the FSDP2 gather yields them).

Memory: the buckets of one sync stay allocated until the replica has loaded them (one extra copy
of the weights in ``sync dtype`` on each GPU, e.g. 0.99 GB for a 0.5B model in bf16).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable, Sequence

import torch

from asyncrl.sync.base import CheckpointEngine
from asyncrl.sync.bucket import iter_buckets, metas_to_wire

_MiB = 1 << 20


def device_uuid(device: torch.device | str | int | None = None) -> str:
    """The CUDA device's UUID (``""`` without CUDA): two processes on one GPU report the same."""
    if not torch.cuda.is_available():
        return ""
    return str(torch.cuda.get_device_properties(torch.device("cuda", torch.cuda.current_device())
                                                if device is None else device).uuid)


def open_ipc_bucket(handle: tuple[Any, tuple]) -> torch.Tensor:
    """Map a bucket another process on this GPU shared (``(rebuild_fn, args)`` of ``reduce_tensor``)."""
    fn, args = handle
    return fn(*args)


class CudaIpcCheckpointEngine(CheckpointEngine):
    """Bucketed weights shared by CUDA IPC with the replica on the same GPU.

    Args:
        replicas: actor handles or RolloutReplica wrappers; on the first sync the engine keeps those on
            this process's GPU (by device UUID): with ``hybrid_engine`` one per trainer rank.
        bucket_bytes: bucket capacity (``async_training.sync_bucket_size_mb`` MiB).

    Raises (from :meth:`send_weights`):
        RuntimeError: no CUDA here, or no replica on this GPU (the message names the UUIDs).
    """

    name = "cuda_ipc"

    def __init__(self, replicas: Sequence[Any], bucket_bytes: int = 64 * _MiB, **_: Any):
        self.replicas = [getattr(r, "actor", r) for r in replicas]
        self.bucket_bytes = int(bucket_bytes)
        self._checked = False

    async def _select_same_gpu(self, device: torch.device) -> None:
        """Keep the replicas on this process's GPU (device UUID); the colocated layout puts one there."""
        if self._checked:
            return
        mine = device_uuid(device)
        theirs = await asyncio.gather(*[h.device_uuid.remote() for h in self.replicas])
        here = [h for h, u in zip(self.replicas, theirs) if u == mine]
        if not here:
            raise RuntimeError(f"checkpoint_engine.backend=cuda_ipc: no replica on this trainer rank's GPU {mine} (replicas "
                               f"on {sorted(set(theirs))}); CUDA IPC needs them colocated "
                               "(actor_rollout_ref.hybrid_engine=true), else use nccl or cpu")
        self.replicas, self._checked = here, True

    async def send_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Pack on the GPU, share the buckets, wait until every replica loaded them, free them.

        Returns:
            ``sync/pack_s`` (bucketing on the GPU), ``sync/load_s`` (replicas map and copy),
            ``sync/total_s``, ``sync/bytes`` and ``sync/buckets``.
        """
        from torch.multiprocessing.reductions import reduce_tensor

        if not torch.cuda.is_available():
            raise RuntimeError("checkpoint_engine.backend=cuda_ipc needs CUDA in the trainer process; use cpu")
        device = torch.device("cuda", torch.cuda.current_device())
        await self._select_same_gpu(device)
        t0 = time.perf_counter()
        buckets, items, nbytes = [], [], 0
        for bucket, metas in iter_buckets(named_tensors, self.bucket_bytes, device=device):
            buckets.append(bucket)  # kept alive until the replicas return
            items.append((reduce_tensor(bucket), metas_to_wire(metas)))
            nbytes += bucket.numel()
        torch.cuda.synchronize(device)  # the receivers read on their own streams
        t1 = time.perf_counter()
        await asyncio.gather(*[h.receive_weights_ipc.remote(items, version) for h in self.replicas])
        t2 = time.perf_counter()
        del buckets
        return {"sync/pack_s": t1 - t0, "sync/load_s": t2 - t1, "sync/total_s": t2 - t0, "sync/bytes": float(nbytes),
                "sync/buckets": float(len(items))}
