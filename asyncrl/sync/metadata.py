"""Metadata side channel of the NCCL weight sync: bucket layouts travel beside the data.

Seed ``000`` section 7.1: while bucket bytes go through an NCCL broadcast, the layout of each
bucket (tensor name, dtype, shape, offsets, chunking) is published on a ZeroMQ PUB/SUB socket, so
the receivers learn what to unpack without a second collective.

::

    trainer rank 0                                 rollout worker r
    --------------                                 ----------------
    publish(BucketMsg k)  --- PUB/SUB (tcp) --->   recv() -> metas k, nbytes k
    broadcast(bucket k)   --- NCCL ------------>   broadcast(bucket k) into buffer k % 2

Two channels share one tiny interface (``publish(msg)`` / ``recv(timeout_s)``):

* :class:`ZmqPublisher` / :class:`ZmqSubscriber` (pyzmq, the seed's design). PUB/SUB drops
  messages sent before a subscriber has joined (the "slow joiner"), so the publisher repeats a
  ``HELLO`` until the caller's barrier confirms every subscriber has seen one.
* :class:`StoreChannel` over a ``torch.distributed`` TCPStore, for machines without pyzmq;
  every message is a key ``{prefix}/{seq}``.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from typing import Iterable, Iterator

import torch

from asyncrl.sync.bucket import _DTYPES, ChunkMeta, _as_bytes

logger = logging.getLogger(__name__)

_HELLO = b"asyncrl-hello"


@dataclass
class BucketMsg:
    """Layout of one bucket, or the end-of-sync marker.

    Attributes:
        version: parameter version being synced.
        seq: bucket index within this sync, from 0.
        nbytes: bytes of the bucket actually used (the broadcast length), 0 for ``done``.
        metas: chunks inside the bucket (see :class:`asyncrl.sync.bucket.ChunkMeta`).
        done: True on the final message of a sync (no bucket follows).
    """

    version: int
    seq: int
    nbytes: int
    metas: list[ChunkMeta] = field(default_factory=list)
    done: bool = False


def require_zmq():
    """Import pyzmq or raise an ``ImportError`` that names the package.

    Raises:
        ImportError: pyzmq is not installed.
    """
    try:
        import zmq
    except ImportError as e:  # pragma: no cover - exercised by monkeypatching in tests
        raise ImportError(
            "the NCCL checkpoint engine's metadata channel needs the 'pyzmq' package "
            "(pip install pyzmq), or use metadata_channel='store'") from e
    return zmq


class ZmqPublisher:
    """PUB socket bound on ``bind_host``; ``endpoint`` is what subscribers connect to.

    Args:
        advertise_host: host name / IP the subscribers reach this process on.
        port: TCP port, 0 for a random free one.
        bind_host: interface to bind (default all).
    """

    def __init__(self, advertise_host: str, port: int = 0, bind_host: str = "*"):
        zmq = require_zmq()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never drop layouts
        self._sock.setsockopt(zmq.LINGER, 1000)
        if port:
            self._sock.bind(f"tcp://{bind_host}:{port}")
        else:
            port = self._sock.bind_to_random_port(f"tcp://{bind_host}")
        self.endpoint = f"tcp://{advertise_host}:{port}"
        self._lock = threading.Lock()
        self._hello_stop: threading.Event | None = None
        self._hello_thread: threading.Thread | None = None

    def publish(self, msg: BucketMsg) -> None:
        """Send one message to every subscriber (non-blocking)."""
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self._sock.send(data)

    def start_hello(self, period_s: float = 0.005) -> None:
        """Repeat ``HELLO`` every ``period_s`` until :meth:`stop_hello` (slow-joiner handshake)."""
        self._hello_stop = threading.Event()

        def loop(stop: threading.Event) -> None:
            while not stop.is_set():
                with self._lock:
                    self._sock.send(_HELLO)
                stop.wait(period_s)

        self._hello_thread = threading.Thread(target=loop, args=(self._hello_stop,), daemon=True)
        self._hello_thread.start()

    def stop_hello(self) -> None:
        if self._hello_stop is not None:
            self._hello_stop.set()
            self._hello_thread.join()
            self._hello_stop = self._hello_thread = None

    def close(self) -> None:
        self.stop_hello()
        self._sock.close()
        self._ctx.term()


class ZmqSubscriber:
    """SUB socket connected to a :class:`ZmqPublisher`."""

    def __init__(self, endpoint: str):
        zmq = require_zmq()
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self.endpoint = endpoint

    def _recv_raw(self, timeout_s: float) -> bytes:
        if not self._sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no metadata from {self.endpoint} within {timeout_s:.1f}s "
                               "(is the trainer's sender alive?)")
        return self._sock.recv()

    def wait_hello(self, timeout_s: float) -> None:
        """Block until one ``HELLO`` arrived, i.e. the subscription is live.

        Raises:
            TimeoutError: nothing arrived within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while self._recv_raw(max(deadline - time.monotonic(), 0.0)) != _HELLO:
            pass

    def recv(self, timeout_s: float) -> BucketMsg:
        """Next :class:`BucketMsg`, skipping handshake leftovers.

        Raises:
            TimeoutError: nothing arrived within ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            data = self._recv_raw(max(deadline - time.monotonic(), 0.0))
            if data != _HELLO:
                return pickle.loads(data)

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()


class StoreChannel:
    """Publisher and subscriber over a ``torch.distributed`` Store (no pyzmq needed).

    Each side keeps its own message counter; message ``n`` is the key ``{prefix}/{n}``. Keys
    are not deleted (a few KB per sync) because every subscriber reads each one.
    """

    def __init__(self, store, prefix: str = "asyncrl/meta"):
        self._store = store
        self._prefix = prefix
        self._seq = 0
        self.endpoint = f"store:{prefix}"

    def publish(self, msg: BucketMsg) -> None:
        self._store.set(f"{self._prefix}/{self._seq}", pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        self._seq += 1

    def recv(self, timeout_s: float) -> BucketMsg:
        """Raises ``TimeoutError`` when the next message does not appear in time."""
        key = f"{self._prefix}/{self._seq}"
        try:
            self._store.wait([key], timedelta(seconds=timeout_s))
        except Exception as e:  # the store raises a DistStoreError / RuntimeError on timeout
            raise TimeoutError(f"no metadata under {key!r} within {timeout_s:.1f}s: {e}") from e
        self._seq += 1
        return pickle.loads(self._store.get(key))

    def start_hello(self) -> None:  # the store has no slow joiners
        pass

    def stop_hello(self) -> None:
        pass

    def wait_hello(self, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        pass


def iter_bucket_plan(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                     ) -> Iterator[tuple[list[ChunkMeta], dict[str, torch.Tensor]]]:
    """Lazily cut a tensor stream into buckets, same layout as :func:`~asyncrl.sync.bucket.plan_buckets`.

    Yields:
        ``(metas, sources)`` per bucket: the chunks and ``{name: uint8 byte view}`` of each tensor
        that has bytes in it. Tensors are pulled from ``named_tensors`` only as buckets fill.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    metas: list[ChunkMeta] = []
    srcs: dict[str, torch.Tensor] = {}
    used = 0
    for name, t in named_tensors:
        raw = _as_bytes(t)
        total, done, shape = raw.numel(), 0, tuple(int(s) for s in t.shape)
        if total > bucket_bytes:  # a bucket of its own (plan_buckets), the receiver's buffer grows to it
            if used:
                yield metas, srcs
                metas, srcs, used = [], {}, 0
            metas.append(ChunkMeta(name, str(t.dtype), shape, total, 0, 0, total))
            srcs[name] = raw
            yield metas, srcs
            metas, srcs, used = [], {}, 0
            continue
        while True:
            if used == bucket_bytes:
                yield metas, srcs
                metas, srcs, used = [], {}, 0
            n = min(total - done, bucket_bytes - used)
            metas.append(ChunkMeta(name, str(t.dtype), shape, total, done, used, n))
            srcs[name] = raw
            used += n
            done += n
            if done >= total:
                break
    if metas:
        yield metas, srcs


def unpack_bucket(buf: torch.Tensor, metas: list[ChunkMeta], partial: dict[str, torch.Tensor]
                  ) -> list[tuple[str, torch.Tensor]]:
    """Tensors completed by this bucket: views into ``buf`` when whole, else rejoined copies.

    A whole tensor whose bucket offset is not a multiple of its element size is copied out
    (a dtype view needs alignment); the tight layout of ``plan_buckets`` allows that.

    Args:
        buf: ``(>= nbytes,)`` uint8 bucket.
        metas: its layout.
        partial: chunks of tensors still incomplete (updated in place).

    Raises:
        ValueError: unknown dtype or a chunk out of order (a lost bucket).
    """
    out = []
    for m in metas:
        if m.dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {m.dtype} for {m.name}")
        piece = buf[m.bucket_offset:m.bucket_offset + m.nbytes]
        if m.tensor_offset == 0 and m.is_last:  # whole tensor: a view, or a copy when misaligned
            elem = torch.empty((), dtype=_DTYPES[m.dtype]).element_size()
            raw = piece if (buf.storage_offset() + m.bucket_offset) % elem == 0 else piece.clone()
        else:
            if m.tensor_offset == 0:
                partial[m.name] = torch.empty(m.tensor_nbytes, dtype=torch.uint8, device=buf.device)
            elif m.name not in partial:
                raise ValueError(f"chunk of {m.name} at byte {m.tensor_offset} arrived before its start")
            partial[m.name][m.tensor_offset:m.tensor_offset + m.nbytes].copy_(piece)
            if not m.is_last:
                continue
            raw = partial.pop(m.name)
        out.append((m.name, raw.view(_DTYPES[m.dtype]).reshape(m.shape)))
    return out


def pack_bucket(buf: torch.Tensor, metas: list[ChunkMeta], srcs: dict[str, torch.Tensor]) -> None:
    """Copy each chunk's bytes from ``srcs`` (uint8 views) into ``buf`` at its bucket offset."""
    for m in metas:
        if m.nbytes:
            buf[m.bucket_offset:m.bucket_offset + m.nbytes].copy_(
                srcs[m.name][m.tensor_offset:m.tensor_offset + m.nbytes], non_blocking=True)
