"""WeightSender for a trainer whose weights live in this process (``strategy=cpu``), and the engine factory.

::

    ParameterSynchronizer.sync(v) -> LocalWeightSender.send(v)
        -> CheckpointEngine.send_weights(TrainEngine.named_tensors_for_sync(), v) -> every replica

The ``fsdp2`` trainer's weights live in its Ray workers; its sender is
:class:`asyncrl.trainer.worker_group.TrainWorkerGroup` (rank 0 holds the checkpoint engine).
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from asyncrl.api import CheckpointEngine, TrainEngine, WeightSender
from asyncrl.sync.base import get_engine_cls
from asyncrl.sync.receiver import tensor_digest


def make_checkpoint_engine(cfg: Any, replicas: Sequence[Any]) -> CheckpointEngine:
    """The transport ``actor_rollout_ref.rollout.checkpoint_engine`` names, into ``replicas`` (actor handles).

    Raises:
        ValueError: unknown backend; ImportError / RuntimeError: its dependency (CUDA, NCCL, pyzmq) is missing.
    """
    ce = cfg.actor_rollout_ref.rollout.checkpoint_engine
    # at least a byte: a size under 2**-20 MiB (valid: > 0) gave 0 bytes, which the first sync refused; a bucket this
    # small holds one tensor (a tensor larger than a bucket has one of its own: asyncrl.sync.bucket.plan_buckets)
    bucket_bytes = max(1, int(cfg.async_training.sync_bucket_size_mb * 2**20))
    return get_engine_cls(ce.backend)(list(replicas), bucket_bytes=bucket_bytes, **dict(ce.engine_kwargs))


class LocalWeightSender:
    """:class:`asyncrl.api.WeightSender` over an in-process :class:`asyncrl.api.TrainEngine`."""

    def __init__(self, engine: TrainEngine, checkpoint_engine: CheckpointEngine):
        self.engine = engine
        self.checkpoint_engine = checkpoint_engine

    async def send(self, version: int) -> dict[str, float]:
        return await self.checkpoint_engine.send_weights(self.engine.named_tensors_for_sync(), version)

    async def digests(self) -> dict[str, str]:
        return await asyncio.to_thread(lambda: {n: tensor_digest(t) for n, t in self.engine.named_tensors_for_sync()})

    async def shutdown(self) -> None:
        await self.checkpoint_engine.shutdown()


async def verify_sync(sender: WeightSender, replicas: Sequence[Any]) -> dict[str, float]:
    """Compare what ``sender`` sends with every replica's live tensors, byte for byte (SHA-256).

    Every name the trainer sends must be in the replica with the same bytes (the hf backend keeps the
    trainer's names, dtypes and shapes; config refuses ``verify_each_sync`` for other backends).

    Returns:
        ``{"sync/verified_tensors": n}`` (per replica, the smallest).

    Raises:
        RuntimeError: a tensor differs or is missing in a replica (naming up to five).
    """
    mine = await sender.digests()
    theirs = await asyncio.gather(*[r.param_digests.remote() for r in replicas])
    counts = []
    for i, d in enumerate(theirs):
        bad = [n for n in mine if d.get(n) != mine[n]]
        if bad or not mine:
            raise RuntimeError(f"weight sync is not bit-exact on replica {i}: {bad[:5] or 'nothing was sent'}")
        counts.append(len(mine))
    return {"sync/verified_tensors": float(min(counts, default=0))}
