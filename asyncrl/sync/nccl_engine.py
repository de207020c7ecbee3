"""NCCL checkpoint engine: trainer rank 0 broadcasts weights to every rollout worker.

Seed ``000`` section 7.1 (checkpoint-engine style sync). One process group holds the trainer's
rank 0 (group rank 0, the root) and every rollout worker (ranks 1..W-1). It is built *stateless*
from a TCPStore, so it lives beside the trainer's own torchrun world and vLLM's groups.

::

    sender (trainer rank 0)                         receiver (each rollout worker)
    host: plan bucket k ---publish(meta k)--ZMQ-->  host: recv(meta k)
    pack stream:  params -> buf[k%2] (ev packed)    comm stream: wait consumed[k%2],
    comm stream:  wait packed -> NCCL bcast(buf)      NCCL bcast into buf[k%2] (ev received)
                  (ev sent[k%2])                    unpack stream: wait received ->
    host waits sent[k%2] before reusing buf[k%2]      load_fn(views / rejoined chunks) (ev consumed)
    end: publish(done) -> allreduce ack <---------  all buckets loaded -> allreduce ack(1)

Packing bucket k+1 overlaps the broadcast of bucket k (two buffers, three streams). The host
never runs more than two buckets ahead, which bounds the memory of lazily gathered parameters.
Every wait has a deadline (``timeout_s``): host waits poll CUDA events, collectives carry the
process group's timeout (NCCL watchdog), so a dead peer raises instead of hanging.

With ``backend="gloo"`` the same code runs on CPU (synchronously), which the unit tests use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable, Optional

import torch
import torch.distributed as dist

from asyncrl.sync.base import CheckpointEngine
from asyncrl.sync.metadata import (BucketMsg, StoreChannel, ZmqPublisher, ZmqSubscriber, iter_bucket_plan,
                                   pack_bucket, unpack_bucket)

logger = logging.getLogger(__name__)

LoadFn = Callable[[list[tuple[str, torch.Tensor]]], Any]
_KEY = "asyncrl/nccl_sync"


@dataclass
class NCCLSyncConfig:
    """Sender-side settings; receivers read them from the store at connect time."""

    master_addr: str = "127.0.0.1"
    """Host of the TCPStore (trainer rank 0); receivers connect there."""
    master_port: int = 29600
    """TCPStore port; 0: the kernel picks one as the sender's store binds it (:meth:`NCCLCheckpointEngine.open_store`
    returns it), so no other process can take it before the receivers connect (see :mod:`asyncrl.net`)."""
    world_size: int = 2
    """1 sender + number of rollout workers."""
    bucket_mb: float = 1024
    """Bucket capacity in MiB. Each process holds two buffers, each the size of the largest bucket the weights
    fill (at most this, or one tensor larger than it), not of this capacity: ``1e6`` or ``1e300`` is all the
    weights in one bucket, not a failed allocation."""
    timeout_s: float = 300.0
    """Deadline for every wait and collective, seconds."""
    backend: str = "nccl"
    """``nccl`` (GPU) or ``gloo`` (CPU, tests)."""
    metadata_channel: str = "zmq"
    """``zmq`` (PUB/SUB, needs pyzmq) or ``store`` (TCPStore keys)."""
    metadata_port: int = 0
    """ZMQ PUB port, 0 for a random one."""
    rebuild_group_each_sync: bool = False
    """Destroy the process group (and free buckets) after each sync; rebuild on the next."""
    device: Optional[str] = None
    """Device of the buckets; default ``cuda:<current>`` for nccl, ``cpu`` for gloo."""

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * (1 << 20))


def require_backend(backend: str) -> None:
    """Fail early, naming what is missing.

    Raises:
        RuntimeError: ``nccl`` requested but no CUDA device is visible.
        ImportError: ``nccl`` requested but this torch build has no NCCL.
        ValueError: unknown backend.
    """
    if backend == "nccl":
        if not dist.is_available() or not dist.is_nccl_available():
            raise ImportError("NCCL weight sync needs a CUDA build of torch with NCCL "
                              "(package 'nvidia-nccl'); this torch has none. Use backend='gloo' on CPU.")
        if not torch.cuda.is_available():
            raise RuntimeError("NCCL weight sync needs CUDA GPUs (torch.cuda.is_available() is False); "
                               "use backend='gloo' on CPU")
    elif backend != "gloo":
        raise ValueError(f"unknown backend {backend!r}; expected 'nccl' or 'gloo'")


def hf_load_fn(model: torch.nn.Module) -> LoadFn:
    """``load_fn`` copying into a transformers model's parameters (tied weights included).

    With vLLM pass ``model.load_weights`` instead. ``load_fn`` receives views that stay valid
    only during the call, so it must copy (both of these do).
    """
    params = dict(model.named_parameters(remove_duplicate=False))

    @torch.no_grad()
    def load(weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            if name not in params:
                raise KeyError(f"receiver model has no parameter {name!r}")
            params[name].copy_(t, non_blocking=True)
    return load


def _wait_event(ev: Optional["torch.cuda.Event"], deadline: float, what: str) -> None:
    while ev is not None and not ev.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"NCCL weight sync: {what} did not finish before the deadline")
        time.sleep(5e-5)


class _Endpoint:
    """What sender and receiver share: store, group, channel, buffers, streams."""

    def __init__(self, cfg: NCCLSyncConfig, rank: int):
        self.cfg, self.rank = cfg, rank
        self.timeout = timedelta(seconds=cfg.timeout_s)
        self.store = self.channel = self.pg = None
        self.bufs: list[torch.Tensor] = []
        self.generation = 0
        self.device = torch.device("cpu")

    def _setup_device(self) -> None:
        require_backend(self.cfg.backend)
        if self.cfg.device is not None:
            self.device = torch.device(self.cfg.device)
        elif self.cfg.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self.streams = [torch.cuda.Stream(self.device) for _ in range(2)]  # pack/unpack, comm

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def _new_group(self) -> None:
        store = dist.PrefixStore(f"{_KEY}/pg{self.generation}", self.store)
        if self.cfg.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self.pg = dist.ProcessGroupNCCL(store, self.rank, self.cfg.world_size, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, self.rank, self.cfg.world_size, self.timeout)
        self.generation += 1

    def allreduce(self, value: float) -> float:
        """Small allreduce used as barrier and ack; host-blocking with the deadline."""
        t = torch.tensor([value], dtype=torch.float32, device=self.device)
        self.pg.allreduce([t]).wait(self.timeout)
        return float(t.item())

    def broadcast(self, buf: torch.Tensor):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, self.timeout
        return self.pg.broadcast([buf], opts)

    def buffers(self) -> list[torch.Tensor]:
        """The two bucket buffers, empty until :meth:`buffer` grows them to the buckets actually sent (they were
        ``bucket_bytes`` each up front: ``sync_bucket_size_mb=1e6`` failed to allocate, ``1e300`` overflowed)."""
        if not self.bufs:
            self.bufs = [torch.empty(0, dtype=torch.uint8, device=self.device) for _ in range(2)]
        return self.bufs

    def buffer(self, i: int, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of buffer ``i``, grown first when this bucket is larger than any before (a bucket
        holds at most ``bucket_bytes``, or one tensor larger than that: :func:`~asyncrl.sync.bucket.plan_buckets`),
        so a buffer is the size of the largest bucket the weights fill, whatever ``bucket_bytes`` is; it stays that
        size until the group is torn down. Call it only once no stream still uses buffer ``i`` (its event waited on
        the host)."""
        bufs = self.buffers()
        if bufs[i].numel() < nbytes:
            bufs[i] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return bufs[i][:nbytes]

    def destroy_group(self) -> None:
        """Tear the process group down and drop the buckets (store and channel stay)."""
        if self.pg is not None:
            try:
                self.pg.shutdown() if hasattr(self.pg, "shutdown") else self.pg.abort()
            except Exception:  # pragma: no cover - best effort teardown
                logger.debug("process group teardown failed", exc_info=True)
            self.pg = None
        self.bufs = []

    def close(self) -> None:
        """Release everything: group, buckets, metadata sockets, store connection."""
        self.destroy_group()
        if self.channel is not None:
            self.channel.close()
        self.channel = self.store = None


class NCCLCheckpointEngine(CheckpointEngine, _Endpoint):
    """Sender side (trainer rank 0): :meth:`send_weights` broadcasts buckets to all receivers.

    Args:
        cfg: group, bucket and timeout settings (:class:`NCCLSyncConfig`).

    Raises:
        ImportError / RuntimeError: from :func:`require_backend` or the metadata channel.
    """

    name = "nccl"

    def __init__(self, cfg: NCCLSyncConfig | None = None):
        _Endpoint.__init__(self, cfg or NCCLSyncConfig(), rank=0)

    def open_store(self) -> int:
        """Host the TCPStore now (once) and return the port it listens on.

        Call it before telling the receivers where to connect when ``master_port`` is 0: the kernel picks
        the port as the store binds it, so there is no window in which another process can take it.
        """
        if self.store is None:
            self.store = dist.TCPStore(self.cfg.master_addr, self.cfg.master_port, self.cfg.world_size,
                                       is_master=True, timeout=self.timeout, wait_for_workers=False)
        return self.store.port

    def init_group(self) -> float:
        """Build (or reuse) store, metadata channel and process group; returns seconds spent."""
        t0 = time.perf_counter()
        first = self.channel is None
        if first:
            self._setup_device()
            self.open_store()
            if self.cfg.metadata_channel == "zmq":
                self.channel = ZmqPublisher(self.cfg.master_addr, self.cfg.metadata_port)
            else:
                self.channel = StoreChannel(self.store, f"{_KEY}/meta")
            for key, val in (("endpoint", self.channel.endpoint), ("bucket_bytes", self.cfg.bucket_bytes),
                             ("backend", self.cfg.backend), ("rebuild", int(self.cfg.rebuild_group_each_sync))):
                self.store.set(f"{_KEY}/{key}", str(val))
            self.channel.start_hello()
        if self.pg is None:
            self._new_group()
            self.allreduce(0.0)  # receivers join only after their subscription is live
        if first:
            self.channel.stop_hello()
        return time.perf_counter() - t0

    def send_weights_sync(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Blocking :meth:`send_weights`; returns ``sync/engine/*`` metrics (seconds, bytes, GB/s).

        Raises:
            TimeoutError / RuntimeError: a receiver did not keep up within ``timeout_s`` or failed.
        """
        group_s = self.init_group() if self.pg is None else 0.0
        t0 = time.perf_counter()
        try:
            nbytes, nbuckets = self._transfer(named_tensors, version)
            acks = self.allreduce(0.0)
        except BaseException:
            self.destroy_group()
            raise
        if acks != self.cfg.world_size - 1:
            raise RuntimeError(f"only {acks:.0f} of {self.cfg.world_size - 1} receivers confirmed version {version}")
        transfer_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if self.cfg.rebuild_group_each_sync:
            self.destroy_group()
        return {"sync/engine/group_s": group_s, "sync/engine/transfer_s": transfer_s,
                "sync/engine/finalize_s": time.perf_counter() - t1, "sync/bytes": float(nbytes),
                "sync/buckets": float(nbuckets), "sync/gbps": nbytes / transfer_s / 1e9}

    async def send_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """See :meth:`CheckpointEngine.send_weights`; runs the blocking sync in a thread."""
        def run() -> dict[str, float]:
            torch.cuda.set_device(self.device) if self.cuda else None  # the worker thread's device
            return self.send_weights_sync(named_tensors, version)
        return await asyncio.to_thread(run)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)  # collective with the receivers: keep the event loop free

    def _transfer(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> tuple[int, int]:
        deadline = time.monotonic() + self.cfg.timeout_s
        total = count = 0
        if self.cuda:
            cur, (pack, comm) = torch.cuda.current_stream(self.device), self.streams
            packed = [torch.cuda.Event(), torch.cuda.Event()]
            sent = [torch.cuda.Event(), torch.cuda.Event()]
        for k, (metas, srcs) in enumerate(iter_bucket_plan(named_tensors, self.cfg.bucket_bytes)):
            i, n = k % 2, max(m.bucket_offset + m.nbytes for m in metas)
            if not self.cuda:
                buf = self.buffer(i, n)
                pack_bucket(buf, metas, srcs)
                self.channel.publish(BucketMsg(version, k, n, metas))
                self.broadcast(buf).wait(self.timeout)
                total, count = total + n, count + 1
                continue
            _wait_event(sent[i], deadline, f"broadcast of bucket {k - 2}")
            buf = self.buffer(i, n)  # after the wait: a grown buffer replaces one no stream uses any more
            self.channel.publish(BucketMsg(version, k, n, metas))
            pack.wait_stream(cur)  # sources were produced on the caller's stream
            with torch.cuda.stream(pack):
                pack_bucket(buf, metas, srcs)
                packed[i].record(pack)
            for s in srcs.values():
                if s.device == self.device:  # keep sources alive until the pack stream used them
                    s.record_stream(pack)
            comm.wait_event(packed[i])
            with torch.cuda.stream(comm):
                self.broadcast(buf).wait()  # comm stream waits for NCCL's stream; host does not
                sent[i].record(comm)
            total, count = total + n, count + 1
        self.channel.publish(BucketMsg(version, count, 0, done=True))
        return total, count


class NCCLWeightReceiver(_Endpoint):
    """Receiver side, one per rollout worker (usable inside a vLLM worker extension).

    Args:
        master_addr: host of the sender's TCPStore.
        master_port: its port.
        rank: this worker's rank in the sync group, 1..world_size-1.
        world_size: 1 + number of rollout workers.
        device: bucket device (default current CUDA device for nccl).
        timeout_s: deadline for connect, every metadata wait and every collective.
    """

    def __init__(self, master_addr: str, master_port: int, rank: int, world_size: int,
                 device: Optional[str] = None, timeout_s: float = 300.0):
        if not 1 <= rank < world_size:
            raise ValueError(f"receiver rank must be in [1, {world_size}), got {rank}")
        cfg = NCCLSyncConfig(master_addr=master_addr, master_port=master_port, world_size=world_size,
                             timeout_s=timeout_s, device=device)
        super().__init__(cfg, rank)

    def init_group(self) -> float:
        """Connect to the store and metadata channel, join the group; returns seconds spent."""
        t0 = time.perf_counter()
        if self.store is None:
            self.store = dist.TCPStore(self.cfg.master_addr, self.cfg.master_port, self.cfg.world_size,
                                       is_master=False, timeout=self.timeout)
            get = lambda key: self.store.get(f"{_KEY}/{key}").decode()  # noqa: E731 (blocks until set)
            self.cfg.backend, self.cfg.bucket_mb = get("backend"), int(get("bucket_bytes")) / (1 << 20)
            self.cfg.rebuild_group_each_sync = bool(int(get("rebuild")))
            self._setup_device()
            endpoint = get("endpoint")
            self.channel = (ZmqSubscriber(endpoint) if endpoint.startswith("tcp://")
                            else StoreChannel(self.store, f"{_KEY}/meta"))
            self.channel.wait_hello(self.cfg.timeout_s)
        if self.pg is None:
            self._new_group()
            self.allreduce(0.0)
        return time.perf_counter() - t0

    def receive_weights(self, load_fn: LoadFn) -> dict[str, float]:
        """Receive one sync and hand every tensor to ``load_fn`` (a list of ``(name, tensor)`` per bucket).

        Returns:
            ``{"sync/version", "sync/bytes", "sync/engine/transfer_s", "sync/engine/group_s"}``.

        Raises:
            TimeoutError: metadata or a bucket did not arrive within ``timeout_s``.
            ValueError: buckets out of order / incomplete tensors at the end.
        """
        group_s = self.init_group() if self.pg is None else 0.0
        t0 = time.perf_counter()
        try:
            version, total = self._receive(load_fn)
            self.allreduce(1.0)
        except BaseException:
            self.destroy_group()
            raise
        metrics = {"sync/version": float(version), "sync/bytes": float(total),
                   "sync/engine/group_s": group_s, "sync/engine/transfer_s": time.perf_counter() - t0}
        if self.cfg.rebuild_group_each_sync:
            self.destroy_group()
        return metrics

    def _receive(self, load_fn: LoadFn) -> tuple[int, int]:
        deadline = time.monotonic() + self.cfg.timeout_s
        partial: dict[str, torch.Tensor] = {}
        total = k = 0
        if self.cuda:
            unpack, comm = self.streams
            received = [torch.cuda.Event(), torch.cuda.Event()]
            consumed = [torch.cuda.Event(), torch.cuda.Event()]
        while True:
            msg = self.channel.recv(max(deadline - time.monotonic(), 0.0))
            if msg.seq != k:
                raise ValueError(f"metadata for bucket {msg.seq} arrived, expected {k}")
            if msg.done:
                break
            i = k % 2
            if not self.cuda:
                buf = self.buffer(i, msg.nbytes)
                self.broadcast(buf).wait(self.timeout)
                ready = unpack_bucket(buf, msg.metas, partial)
                if ready:
                    load_fn(ready)
            else:
                _wait_event(consumed[i], deadline, f"unpacking of bucket {k - 2}")
                buf = self.buffer(i, msg.nbytes)  # after the wait, as the sender's
                comm.wait_event(consumed[i])
                with torch.cuda.stream(comm):
                    self.broadcast(buf).wait()
                    received[i].record(comm)
                unpack.wait_event(received[i])
                with torch.cuda.stream(unpack):
                    ready = unpack_bucket(buf, msg.metas, partial)
                    if ready:
                        load_fn(ready)
                    consumed[i].record(unpack)
            total += msg.nbytes
            k += 1
        if self.cuda:
            _wait_event(consumed[(k - 1) % 2] if k else None, deadline, "unpacking of the last bucket")
            torch.cuda.current_stream(self.device).wait_stream(unpack)
        if partial:
            raise ValueError(f"sync of version {msg.version} ended with incomplete tensors: {sorted(partial)}")
        return msg.version, total
