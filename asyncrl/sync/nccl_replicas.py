"""The ``nccl`` checkpoint engine: :class:`~asyncrl.sync.nccl_engine.NCCLCheckpointEngine` into RolloutReplicas.

::

    trainer rank 0 (sender)                              replica r (Ray actor) -> engine workers
    first send: num_weight_workers() of every replica -> ranks 1.. ; init_nccl_receiver(host, port, base, world)
    each send:  receive_weights_nccl(v) launched on every replica (they block in the NCCL receive)
                NCCLCheckpointEngine.send_weights(params, v)  ── buckets by NCCL broadcast ──► load into the
                                                                  engine's own tensors (hf: copy_, vLLM: load_weights)
                await every receiver: tensors loaded, version adopted

The sender's group (store at this node's IP, a free port) forms on the first send, when the
receivers join from inside ``receive_weights_nccl``. Same constructor as the CPU engines
(``Engine(replicas, bucket_bytes=..., **checkpoint_engine.engine_kwargs)``); the caller pauses the
replicas before and resumes them after. ``engine_kwargs["backend"] = "gloo"`` runs the same code over
gloo on CPU (the CPU tests of this wiring).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from typing import Any, Iterable, Optional, Sequence

import torch

from asyncrl.sync.base import CheckpointEngine
from asyncrl.sync.cpu_engine import _handles

logger = logging.getLogger(__name__)


class NCCLReplicaEngine(CheckpointEngine):
    """Broadcast weights from this process's GPU into every replica's engine workers.

    Args:
        replicas: RolloutReplica wrappers or their actor handles.
        bucket_bytes: NCCL bucket capacity (two buffers on each side, each the size of the largest bucket filled).
        host: address the receivers reach this process at; default this node's Ray IP.
        port: TCPStore port; 0 (default) lets the sender's store bind one the kernel picks, before the
            receivers are told where to connect.
        timeout_s: deadline of every wait and collective.
        backend: ``nccl`` or ``gloo`` (CPU tests).
        metadata_channel: ``zmq`` or ``store`` (see :mod:`asyncrl.sync.metadata`); default ``zmq`` when
            pyzmq is installed, else ``store``.
        rebuild_group_each_sync: tear the group down after each sync.
    """

    name = "nccl"

    def __init__(self, replicas: Sequence[Any], bucket_bytes: int = 1 << 30, host: Optional[str] = None, port: int = 0,
                 timeout_s: float = 300.0, backend: str = "nccl", metadata_channel: Optional[str] = None,
                 rebuild_group_each_sync: bool = False, **_: Any):
        from asyncrl.sync.nccl_engine import require_backend

        require_backend(backend)  # fail at construction, naming what is missing (CUDA / NCCL)
        self.replicas = _handles(replicas)
        self.bucket_bytes = int(bucket_bytes)
        self.host, self.port, self.timeout_s = host, port, timeout_s
        if metadata_channel is None:
            metadata_channel = "zmq" if importlib.util.find_spec("zmq") is not None else "store"
        self.backend, self.metadata_channel, self.rebuild = backend, metadata_channel, rebuild_group_each_sync
        self.sender: Any = None

    async def _connect(self) -> float:
        import ray

        from asyncrl.sync.nccl_engine import NCCLCheckpointEngine, NCCLSyncConfig

        t0 = time.perf_counter()
        host = self.host or (ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1")
        sizes = await asyncio.gather(*[h.num_weight_workers.remote() for h in self.replicas])
        bases, world = [], 1
        for n in sizes:
            bases.append(world)
            world += int(n)
        self.sender = NCCLCheckpointEngine(NCCLSyncConfig(
            master_addr=host, master_port=self.port, world_size=world, bucket_mb=self.bucket_bytes / (1 << 20),
            timeout_s=self.timeout_s, backend=self.backend, metadata_channel=self.metadata_channel,
            rebuild_group_each_sync=self.rebuild))
        port = self.sender.open_store()  # listening before anyone is told the port
        await asyncio.gather(*[h.init_nccl_receiver.remote(host, port, b, world, self.timeout_s)
                               for h, b in zip(self.replicas, bases)])
        logger.info("NCCL weight sync: sender %s:%d, %d receivers (%s)", host, port, world - 1, self.backend)
        return time.perf_counter() - t0

    async def send_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Every replica loads every tensor as ``version``.

        Returns:
            ``sync/engine/*`` from the sender, ``sync/connect_s`` (first call), ``sync/load_wait_s``
            (after the last bucket until every replica loaded) and ``sync/total_s``.

        Raises:
            TimeoutError / RuntimeError: a receiver failed or did not keep up (the group is dropped
            and rebuilt on the next call).
        """
        t0 = time.perf_counter()
        connect_s = await self._connect() if self.sender is None else 0.0
        receivers = [h.receive_weights_nccl.remote(version) for h in self.replicas]
        try:
            metrics = dict(await self.sender.send_weights(named_tensors, version))
        except BaseException:
            for r in receivers:  # they fail on the torn-down group; do not leave them running
                ray_cancel(r)
            raise
        t1 = time.perf_counter()
        await asyncio.gather(*receivers)
        metrics.update({"sync/connect_s": connect_s, "sync/load_wait_s": time.perf_counter() - t1,
                        "sync/total_s": time.perf_counter() - t0})
        return metrics

    async def shutdown(self) -> None:
        """Tear the group down on both sides at once. NCCL's teardown (``ncclCommFinalize``) is collective:
        a sender leaving alone waited for replicas that leave only at their own shutdown, later (60 s and
        a timeout per run on two H200s). Bounded by ``timeout_s``; a side that does not answer is logged."""
        sender, self.sender = self.sender, None
        if sender is None:
            return
        parts = [sender.shutdown(), *[h.close_nccl_receiver.remote() for h in self.replicas]]
        try:
            results = await asyncio.wait_for(asyncio.gather(*parts, return_exceptions=True), self.timeout_s)
        except asyncio.TimeoutError:
            logger.warning("NCCL weight-sync teardown did not finish in %.0f s", self.timeout_s)
            return
        for who, res in zip(["sender", *[f"replica {i}" for i in range(len(self.replicas))]], results):
            if isinstance(res, BaseException):
                logger.warning("NCCL weight-sync teardown on the %s: %r", who, res)


def ray_cancel(ref: Any) -> None:
    """Best-effort cancel of an in-flight actor call."""
    try:
        import ray

        ray.cancel(ref)
    except Exception:  # pragma: no cover - already finished
        logger.debug("could not cancel %s", ref, exc_info=True)
