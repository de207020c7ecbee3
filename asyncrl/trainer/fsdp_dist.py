"""The FSDP2 engine's process-group setup, batch slicing helpers and full-state checkpoint methods
(split out of :mod:`asyncrl.trainer.fsdp_engine`, which re-exports them)."""

from __future__ import annotations

import os
from typing import Any, Optional

import torch
import torch.distributed as dist


def init_distributed(backend: Optional[str] = None) -> tuple[int, int, torch.device]:
    """Initialise the default process group from torchrun's env (single process where absent or empty).

    Returns:
        ``(rank, world_size, device)``; the device is ``cuda:LOCAL_RANK`` when CUDA is present.
    """
    if not dist.is_initialized():
        _default_env()
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend)
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def _default_env() -> None:
    """Fill in torchrun's variables that are unset *or empty* (``MASTER_PORT=`` exported with no value would
    otherwise reach torch, which fails with "MASTER_PORT expected, but not set"); set values are kept."""
    for key, val in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        if not os.environ.get(key, "").strip():
            os.environ[key] = val
    if not os.environ.get("MASTER_PORT", "").strip():
        # alone, the store is ours: port 0 lets it bind one the kernel picks (a fixed 29511 would collide between two
        # single-process runs on one machine); more ranks must agree on a port, so they keep a fixed default
        os.environ["MASTER_PORT"] = "0" if os.environ["WORLD_SIZE"].strip() == "1" else "29511"


def _rows(batch: Any, i: int, j: int) -> Any:
    if hasattr(batch, "select"):
        return batch.select(range(i, j))
    return {k: (v[i:j] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def _get(batch: Any, key: str, default: Any = None) -> Any:
    return batch.get(key, default) if isinstance(batch, dict) else getattr(batch, key, default)


def _reshard(model: torch.nn.Module) -> None:
    """Reshard every FSDP2 unit of ``model`` (those kept gathered after a forward without backward)."""
    for m in model.modules():
        if hasattr(m, "reshard") and hasattr(m, "unshard"):
            m.reshard()


def _len(batch: Any) -> int:
    return _get(batch, "input_ids").shape[0]


class FSDPCheckpointState:
    """``state_dict`` / ``load_state_dict`` of :class:`~asyncrl.trainer.fsdp_engine.FSDPEngine` (needs its
    ``model``, ``optimizer``, ``scheduler`` and ``updates``)."""

    def state_dict(self) -> dict[str, Any]:
        """Full (unsharded) model and optimizer state on CPU, on rank 0; other ranks get empty dicts.
        A collective: every rank calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        _reshard(self.model)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {"model": model_sd, "optimizer": optim_sd,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore rank 0's :meth:`state_dict` output; every rank passes the same full dict and keeps its shard."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        _reshard(self.model)  # the optimizer holds the sharded parameters: they must be the registered ones
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
