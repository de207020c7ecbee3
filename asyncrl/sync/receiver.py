"""Receiving end of every weight transport for an engine whose model lives in this process (hf).

::

    cpu_rpc : begin() -> load_bucket(bucket, metas)* -> finish()     BucketAssembler -> copy_
    gloo    : gloo_init(...) once; gloo_receive(plan)                gloo broadcast -> assembler -> copy_
    nccl    : nccl_init(...) once; nccl_receive()                    NCCLWeightReceiver -> copy_ (unpack stream)
    cuda_ipc: ipc_receive([(handle, metas), ...])                    mapped GPU bucket -> assembler -> copy_

Engine-agnostic: it only needs a callable returning the engine's ``{name: tensor}`` (parameters and
buffers, tied weights under every name), and copies into *those* tensors, so the engine serves the
new weights without re-allocating (and CUDA graphs captured over them stay valid). The engine
passes its own lock so no forward runs while tensors change. vLLM's worker extension
(:mod:`asyncrl.rollout.vllm_worker_ext`) is the other receiving end (its own load path).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import Any, AsyncIterator, Callable, Optional, Sequence

import torch

from asyncrl.sync.bucket import BucketAssembler, ChunkMeta, metas_from_wire
from asyncrl.sync.gloo import gloo_broadcast, make_gloo_group

logger = logging.getLogger(__name__)

NamedTensors = Callable[[], dict[str, torch.Tensor]]


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes with its dtype and shape (bit-exact comparison of weights)."""
    t = t.detach().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update((t.reshape(1) if t.dim() == 0 else t).reshape(-1).view(torch.uint8).cpu().numpy())  # no extra copy
    return h.hexdigest()


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of a transformers model's parameters and buffers, tied names included."""
    out = dict(model.named_buffers())
    out.update(dict(model.named_parameters(remove_duplicate=False)))
    return out


class ModelWeightReceiver:
    """Loads pushed weights into the tensors ``named_tensors()`` returns.

    Args:
        named_tensors: the engine's live tensors by HF name (called at each sync).
        lock: the engine's forward lock, held while tensors change (``None``: no locking).
    """

    def __init__(self, named_tensors: NamedTensors, lock: Optional[asyncio.Lock] = None):
        self.named_tensors = named_tensors
        self.lock = lock
        self._assembler: Optional[BucketAssembler] = None
        self._loaded = 0
        self._gloo: Any = None
        self._nccl: Any = None

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        if self.lock is None:
            yield
        else:
            async with self.lock:
                yield

    @torch.no_grad()
    def copy_in(self, weights: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(name, tensor)`` into the live tensors (dtype and shape must match: bit-exact).

        Raises:
            KeyError: a name the model does not have.
            ValueError: a dtype or shape that differs from the live tensor's.
        """
        live = self.named_tensors()
        for name, t in weights:  # every tensor checked before any is copied
            dst = live.get(name)
            if dst is None:
                raise KeyError(f"weight update has {name!r}, which the inference model does not have")
            if dst.dtype != t.dtype or dst.shape != t.shape:
                raise ValueError(f"weight update {name!r}: {t.dtype} {tuple(t.shape)} does not match the inference "
                                 f"model's {dst.dtype} {tuple(dst.shape)} (actor_rollout_ref.model.dtype must match)")
        for name, t in weights:
            live[name].copy_(t, non_blocking=True)
        self._loaded += len(weights)

    # ------------------------------------------------------------------ RPC transport
    async def begin(self, device: str | torch.device = "cpu") -> None:
        """Start a bucketed update; ``device``: where split tensors are rejoined (the buckets' device)."""
        self._assembler, self._loaded = BucketAssembler(device), 0

    async def load_bucket(self, bucket: Any, metas: Sequence[Any]) -> None:
        """Feed one bucket (uint8 tensor or numpy array; a read-only numpy view is copied)."""
        if self._assembler is None:
            raise RuntimeError("load_bucket() before begin_weight_update()")
        if not isinstance(bucket, torch.Tensor):
            bucket = torch.from_numpy(bucket if bucket.flags.writeable else bucket.copy())
        done = self._assembler.feed(bucket, metas_from_wire(metas))
        if done:
            async with self._locked():
                self.copy_in(done)

    async def finish(self) -> int:
        """Returns the tensors loaded. Raises ``RuntimeError`` when a tensor is incomplete (a lost bucket)."""
        if self._assembler is None:
            raise RuntimeError("finish_weight_update() before begin_weight_update()")
        pending, self._assembler = self._assembler.pending, None
        if pending:
            raise RuntimeError(f"weight update incomplete, missing chunks of {pending[:5]}")
        return self._loaded

    async def ipc_receive(self, items: Sequence[tuple[Any, Any]], device: torch.device) -> int:
        """``cuda_ipc``: map each shared bucket (:func:`asyncrl.sync.cuda_ipc.open_ipc_bucket`) and load it on
        ``device``; the copies finish before this returns (the sender frees the buckets then)."""
        from asyncrl.sync.cuda_ipc import open_ipc_bucket

        await self.begin(device)
        for handle, metas in items:
            await self.load_bucket(open_ipc_bucket(handle), metas)
        torch.cuda.synchronize(device)
        return await self.finish()

    # ------------------------------------------------------------------ gloo broadcast
    async def gloo_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        self._gloo = await asyncio.to_thread(make_gloo_group, host, port, base_rank, world_size, timeout_s)
        return [base_rank]

    async def gloo_receive(self, plan: Sequence[Sequence[Any]]) -> int:
        """One broadcast bucket per ``plan`` entry (ChunkMeta lists or their wire form).

        Raises:
            KeyError / ValueError: from :meth:`copy_in` (a name, dtype or shape the model does not have),
            after the last broadcast, so the sender and the other receivers finish the collective.
        """
        if self._gloo is None:
            raise RuntimeError("gloo_receive() before gloo_init()")
        await self.begin()
        refused: Optional[Exception] = None
        for metas in plan:
            metas = metas_from_wire(metas)
            buf = torch.empty(max(m.bucket_offset + m.nbytes for m in metas), dtype=torch.uint8)
            await asyncio.to_thread(gloo_broadcast, self._gloo, buf, 0)
            if refused is None:  # after a refusal keep taking part in every broadcast: the sender never hangs
                try:
                    await self.load_bucket(buf, metas)
                except (KeyError, ValueError) as exc:
                    refused = exc
        if refused is not None:
            self._assembler = None
            raise refused
        return await self.finish()

    # ------------------------------------------------------------------ NCCL broadcast
    async def nccl_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0,
                        device: Optional[str] = None) -> list[int]:
        """Create the receiver (the group forms on the first :meth:`nccl_receive`, with the sender)."""
        from asyncrl.sync.nccl_engine import NCCLWeightReceiver

        self._nccl = NCCLWeightReceiver(host, port, base_rank, world_size, device=device, timeout_s=timeout_s)
        return [base_rank]

    async def nccl_receive(self) -> int:
        """Receive one sync straight into the live tensors (no staging copy); returns tensors loaded."""
        if self._nccl is None:
            raise RuntimeError("nccl_receive() before nccl_init()")
        self._loaded = 0
        refused: list[Exception] = []

        def copy_in(weights: Sequence[tuple[str, torch.Tensor]]) -> None:
            if not refused:  # after a refusal keep receiving every bucket: the sender never hangs
                try:
                    self.copy_in(weights)
                except (KeyError, ValueError) as exc:
                    refused.append(exc)

        async with self._locked():
            await asyncio.to_thread(self._nccl.receive_weights, copy_in)
        if refused:
            raise refused[0]
        return self._loaded

    async def nccl_close(self) -> None:
        """Leave the NCCL group (collective with the sender's teardown: in a thread, the loop stays free)."""
        nccl, self._nccl = self._nccl, None
        if nccl is not None:
            await asyncio.to_thread(nccl.close)

    async def close(self) -> None:
        """Drop the groups (their stores belong to the sender)."""
        await self.nccl_close()
        self._gloo = None

    def digests(self) -> dict[str, str]:
        """``{name: sha256}`` of the live tensors (see :func:`tensor_digest`)."""
        return {n: tensor_digest(t) for n, t in self.named_tensors().items()}
