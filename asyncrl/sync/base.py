"""ParameterSynchronizer contract: trainer weights into every rollout replica, in memory.

A :class:`CheckpointEngine` is one transport (CPU: Ray object store + vLLM RPC; GPU: NCCL
broadcast, another issue). The synchronizer around it sequences a sync the way the verl
fully-async design does: pause/abort generation -> send buckets -> replicas load -> resume ->
``reset_staleness``. Engines register lazily by name so optional dependencies (cupy, pyzmq,
NCCL) are imported only when used.
"""

from __future__ import annotations

import abc
from typing import Callable, Iterable

import torch

from asyncrl.registry import Registry


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


CHECKPOINT_ENGINES: Registry[type] = Registry("checkpoint engine")
"""Transport name -> :class:`CheckpointEngine` subclass (imported on first use)."""


def register_engine(name: str, loader: Callable[[], type] | str) -> None:
    """Register a :class:`CheckpointEngine` lazily: a ``"module:Class"`` string or a loader function."""
    CHECKPOINT_ENGINES.register_lazy(name, loader)


def get_engine_cls(name: str) -> type:
    """Look up a checkpoint engine.

    Raises:
        UnknownNameError: unknown ``name`` (a ``ValueError``; the message lists the known ones).
        ImportError: the engine's dependency is absent (the message names it).
    """
    return CHECKPOINT_ENGINES[name]


def _lazy(module: str, attr: str) -> str:
    return f"{module}:{attr}"
