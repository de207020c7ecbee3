"""ParameterSynchronizer contract: trainer weights into every rollout replica, in memory.

A :class:`CheckpointEngine` is one transport (CPU: Ray object store + vLLM RPC; GPU: NCCL
broadcast, another issue). The synchronizer around it sequences a sync the way the verl
fully-async design does: pause/abort generation -> send buckets -> replicas load -> resume ->
``reset_staleness``. Engines register lazily by name so optional dependencies (cupy, pyzmq,
NCCL) are imported only when used.
"""

from __future__ import annotations

import abc
import importlib
from typing import Any, Callable, Iterable

import torch


class CheckpointEngine(abc.ABC):
    """One weight transport from trainer rank 0 to all rollout replicas."""

    name: str = "base"

    @abc.abstractmethod
    async def send_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Deliver every tensor to every replica and have them loaded.

        Args:
            named_tensors: ``(hf_name, tensor)`` pairs from the trainer (any dtype / device).
            version: parameter version the replicas report afterwards.

        Returns:
            Timing metrics in seconds under ``sync/...`` keys.
        """

    async def shutdown(self) -> None:  # pragma: no cover - optional
        """Tear down process groups / sockets."""


_ENGINES: dict[str, Callable[[], type]] = {}


def register_engine(name: str, loader: Callable[[], type]) -> None:
    """Register a lazy loader returning a :class:`CheckpointEngine` subclass."""
    _ENGINES[name] = loader


def get_engine_cls(name: str) -> type:
    """Look up a checkpoint engine; raises ``ValueError`` naming the known ones, or
    ``ImportError`` naming the missing package when its dependency is absent."""
    if name not in _ENGINES:
        raise ValueError(f"unknown checkpoint engine {name!r}; known: {sorted(_ENGINES)}")
    return _ENGINES[name]()


def _lazy(module: str, attr: str) -> Callable[[], type]:
    def load() -> Any:
        return getattr(importlib.import_module(module), attr)
    return load
