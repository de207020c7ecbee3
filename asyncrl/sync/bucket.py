"""Pack named tensors into fixed-size byte buckets and rebuild them bit-exactly.

This is the data layout of the checkpoint-engine style weight sync (seed ``000`` section 7.1):
parameters are copied as raw bytes into ``uint8`` buckets of ``bucket_bytes``; a tensor that
straddles a bucket's end is split into two chunks and rejoined by the receiver, and a tensor larger
than a whole bucket gets a bucket of its own, its exact size (as slime's bucketing does; verl refuses
it). It used to be cut into ``bucket_bytes`` chunks: ``async_training.sync_bucket_size_mb=0.001`` made
2,140 buckets of the 2 MB tiny model (a ``ray.put`` and an RPC each, every sync; about a million for a
1 GB model) where it now makes as many as there are large tensors.
The layout is transport-agnostic: the CPU path ships buckets through Ray / vLLM RPC, a GPU path
broadcasts the same buckets with NCCL while the metadata travels on a side channel.

Bit-exactness: bytes are copied with ``view(torch.uint8)``, never cast, so bf16 / fp32 / int
tensors round-trip exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                               torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


@dataclass(frozen=True)
class ChunkMeta:
    """Where one piece of one tensor sits inside one bucket.

    Attributes:
        name: parameter name (HF naming, e.g. ``model.layers.0.mlp.up_proj.weight``).
        dtype: ``str(torch.dtype)``, e.g. ``"torch.bfloat16"``.
        shape: full tensor shape.
        tensor_nbytes: size of the full tensor in bytes.
        tensor_offset: byte offset of this chunk within the full tensor.
        bucket_offset: byte offset of this chunk within the bucket.
        nbytes: chunk size in bytes.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    tensor_nbytes: int
    tensor_offset: int
    bucket_offset: int
    nbytes: int

    @property
    def is_last(self) -> bool:
        return self.tensor_offset + self.nbytes == self.tensor_nbytes


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8).reshape(-1)


def plan_buckets(named_shapes: Iterable[tuple[str, torch.dtype, tuple[int, ...]]], bucket_bytes: int) -> list[list[ChunkMeta]]:
    """Assign every tensor's bytes to buckets without touching data.

    Args:
        named_shapes: ``(name, dtype, shape)`` per tensor, in send order.
        bucket_bytes: capacity of each bucket in bytes (> 0).

    Returns:
        One list of :class:`ChunkMeta` per bucket. A bucket holds at most ``bucket_bytes``, except one
        holding a single tensor larger than that (whole, at offset 0, with any zero-size tensors
        before it); a tensor that fits in a bucket but not in what is left of the current one is
        split over the two.

    Raises:
        ValueError: if ``bucket_bytes`` is not positive.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[list[ChunkMeta]] = [[]]
    used = 0
    for name, dtype, shape in named_shapes:
        elem = torch.empty((), dtype=dtype).element_size()
        total = elem
        for s in shape:
            total *= int(s)
        if total > bucket_bytes:  # a bucket of its own, not total / bucket_bytes chunks
            if used:
                buckets.append([])
            buckets[-1].append(ChunkMeta(name, str(dtype), tuple(int(s) for s in shape), total, 0, 0, total))
            buckets.append([])
            used = 0
            continue
        done = 0
        while done < total or (total == 0 and done == 0):
            if used == bucket_bytes:
                buckets.append([])
                used = 0
            n = min(total - done, bucket_bytes - used)
            buckets[-1].append(ChunkMeta(name, str(dtype), tuple(int(s) for s in shape), total, done, used, n))
            used += n
            done += n
            if total == 0:
                break
    return [b for b in buckets if b]


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                 device: str | torch.device = "cpu") -> Iterator[tuple[torch.Tensor, list[ChunkMeta]]]:
    """Yield ``(bucket, metas)``: a ``(<= bucket_bytes,)`` uint8 tensor on ``device`` and its layout
    (larger when it holds one tensor larger than ``bucket_bytes``: :func:`plan_buckets`).

    The tensors are materialised lazily, one bucket at a time, so peak extra memory is one bucket
    plus the tensor being copied. ``device="cuda"`` packs on the GPU (the ``cuda_ipc`` engine).
    """
    items = [(n, t) for n, t in named_tensors]
    by_name = {n: t for n, t in items}
    plan = plan_buckets(((n, t.dtype, tuple(t.shape)) for n, t in items), bucket_bytes)
    for metas in plan:
        size = max(m.bucket_offset + m.nbytes for m in metas)
        buf = torch.empty(size, dtype=torch.uint8, device=device)
        for m in metas:
            if m.nbytes:
                src = _as_bytes(by_name[m.name].to(buf.device))
                buf[m.bucket_offset:m.bucket_offset + m.nbytes] = src[m.tensor_offset:m.tensor_offset + m.nbytes]
        yield buf, metas


class BucketAssembler:
    """Receiver side: feed buckets in order, get back complete ``(name, tensor)`` pairs."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self._partial: dict[str, torch.Tensor] = {}

    def feed(self, bucket: torch.Tensor, metas: list[ChunkMeta]) -> list[tuple[str, torch.Tensor]]:
        """Consume one bucket; returns the tensors whose last chunk was in it.

        Raises:
            ValueError: on an unknown dtype or a chunk that arrives out of order.
        """
        bucket = bucket.reshape(-1)
        done: list[tuple[str, torch.Tensor]] = []
        for m in metas:
            if m.dtype not in _DTYPES:
                raise ValueError(f"unsupported dtype {m.dtype} for {m.name}")
            dst = self._partial.get(m.name)
            if dst is None:
                if m.tensor_offset != 0:
                    raise ValueError(f"chunk of {m.name} at byte {m.tensor_offset} arrived before its start")
                dst = torch.empty(m.tensor_nbytes, dtype=torch.uint8, device=self.device)
                self._partial[m.name] = dst
            dst[m.tensor_offset:m.tensor_offset + m.nbytes] = bucket[m.bucket_offset:m.bucket_offset + m.nbytes].to(self.device)
            if m.is_last:
                raw = self._partial.pop(m.name)
                done.append((m.name, raw.view(_DTYPES[m.dtype]).reshape(m.shape)))
        return done

    @property
    def pending(self) -> list[str]:
        """Names of tensors with chunks received but not complete (non-empty means a lost bucket)."""
        return list(self._partial)


def metas_to_wire(metas: Iterable[ChunkMeta]) -> list[list]:
    """ChunkMeta -> msgpack-friendly lists (vLLM's RPC refuses arbitrary classes)."""
    return [[m.name, m.dtype, list(m.shape), m.tensor_nbytes, m.tensor_offset, m.bucket_offset, m.nbytes] for m in metas]


def metas_from_wire(wire: Iterable) -> list[ChunkMeta]:
    """Inverse of :func:`metas_to_wire`; :class:`ChunkMeta` objects pass through unchanged."""
    return [w if isinstance(w, ChunkMeta) else
            ChunkMeta(str(w[0]), str(w[1]), tuple(int(s) for s in w[2]), int(w[3]), int(w[4]), int(w[5]), int(w[6]))
            for w in wire]
