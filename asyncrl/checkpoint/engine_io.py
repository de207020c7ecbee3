"""Train-engine state on disk: HF weights, optimizer, LR schedule and RNG states.

Two layouts behind one pair of calls (``save_engine`` / ``load_engine``), chosen by the engine:

* single-process :class:`~asyncrl.trainer.engine.TrainEngine`: ``actor/huggingface/`` (HF
  ``save_pretrained`` + the tokenizer files of the source model), ``actor/optim.pt`` (optimizer,
  scheduler, update count), ``actor/rng.pt`` (python / numpy / torch CPU and CUDA generators);
* FSDP2 :class:`~asyncrl.trainer.fsdp_engine.FSDPEngine` (a collective: every rank calls it; the
  trainer's ``TrainWorkerGroup.save_checkpoint`` has each ``TrainWorker`` call it):
  the full weights are gathered to rank 0 for ``actor/huggingface/``; the optimizer state stays
  sharded and goes through ``torch.distributed.checkpoint`` into ``actor/optim/`` (each rank writes
  its shard; a different world size can load it); ``actor/rng_rank<r>.pt`` per rank.

The HF directory is what transformers and vLLM load (``from_pretrained(dir)`` / ``LLM(model=dir)``).
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)

HF_DIR = "huggingface"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json")


def rng_state() -> dict[str, Any]:
    """Every RNG this process draws from (python, numpy, torch CPU, torch CUDA when present)."""
    out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def copy_tokenizer_files(src: Optional[str | Path], dst: Path) -> list[str]:
    """Copy the tokenizer / generation files of the source model dir, so ``dst`` stands alone."""
    copied = []
    if src is None or not Path(src).is_dir():
        return copied
    for name in TOKENIZER_FILES:
        if (Path(src) / name).exists() and not (dst / name).exists():
            shutil.copy2(Path(src) / name, dst / name)
            copied.append(name)
    return copied


def _is_fsdp(engine: Any) -> bool:
    return type(engine).__name__ == "FSDPEngine"


def save_engine(engine: Any, actor_dir: str | Path, source_model_dir: Optional[str] = None) -> None:
    """Write the engine's state under ``actor_dir`` (created). See the module docstring for the layout."""
    actor_dir = Path(actor_dir)
    actor_dir.mkdir(parents=True, exist_ok=True)
    if _is_fsdp(engine):
        return _save_fsdp(engine, actor_dir, source_model_dir)
    hf = actor_dir / HF_DIR
    engine.model.save_pretrained(hf, safe_serialization=True)
    copy_tokenizer_files(source_model_dir, hf)
    torch.save({"optimizer": engine.optimizer.state_dict(), "scheduler": engine.scheduler.state_dict(),
                "updates": engine.updates}, actor_dir / "optim.pt")
    torch.save(rng_state(), actor_dir / "rng.pt")


def load_engine(engine: Any, actor_dir: str | Path, load_weights: bool = True) -> None:
    """Restore optimizer, LR schedule, update count, RNG states (and weights unless the engine was
    already built from ``actor_dir/huggingface``)."""
    actor_dir = Path(actor_dir)
    if _is_fsdp(engine):
        return _load_fsdp(engine, actor_dir, load_weights)
    if load_weights:
        from safetensors.torch import load_file

        sd = {}
        for f in sorted((actor_dir / HF_DIR).glob("*.safetensors")):
            sd.update(load_file(f))
        missing, unexpected = engine.model.load_state_dict(sd, strict=False)
        tied = {n for n in missing if "lm_head" in n and getattr(engine.model.config, "tie_word_embeddings", False)}
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"checkpoint weights do not match the model: missing {sorted(set(missing) - tied)[:5]}, "
                               f"unexpected {sorted(unexpected)[:5]}")
    state = torch.load(actor_dir / "optim.pt", weights_only=False)
    engine.optimizer.load_state_dict(state["optimizer"])
    engine.scheduler.load_state_dict(state["scheduler"])
    engine.updates = int(state["updates"])
    set_rng_state(torch.load(actor_dir / "rng.pt", weights_only=False))


# ------------------------------------------------------------------------------------- FSDP2
def _save_fsdp(engine: Any, actor_dir: Path, source_model_dir: Optional[str]) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    from asyncrl.trainer.fsdp_dist import _reshard

    _reshard(engine.model)  # units kept gathered after a forward without backward must be the sharded ones
    full = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if engine.rank == 0:
        hf = actor_dir / HF_DIR
        engine.model.save_pretrained(hf, state_dict=full, safe_serialization=True)
        copy_tokenizer_files(source_model_dir, hf)
        extra = {"updates": engine.updates}
        if getattr(engine, "scheduler", None) is not None:
            extra["scheduler"] = engine.scheduler.state_dict()
        torch.save(extra, actor_dir / "engine_state.pt")
    del full
    optim = get_optimizer_state_dict(engine.model, engine.optimizer)  # sharded (DTensor) state
    dcp.save({"optimizer": optim}, checkpoint_id=str(actor_dir / "optim"))
    torch.save(rng_state(), actor_dir / f"rng_rank{engine.rank}.pt")
    dist.barrier()


def _load_fsdp(engine: Any, actor_dir: Path, load_weights: bool) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    from asyncrl.trainer.fsdp_dist import _reshard

    _reshard(engine.model)
    if load_weights:
        full = {}
        if engine.rank == 0:
            from safetensors.torch import load_file

            for f in sorted((actor_dir / HF_DIR).glob("*.safetensors")):
                full.update(load_file(f))
        set_model_state_dict(engine.model, full, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=False))
    optim = {"optimizer": get_optimizer_state_dict(engine.model, engine.optimizer)}
    dcp.load(optim, checkpoint_id=str(actor_dir / "optim"))
    set_optimizer_state_dict(engine.model, engine.optimizer, optim["optimizer"])
    extra = torch.load(actor_dir / "engine_state.pt", weights_only=False)
    engine.updates = int(extra["updates"])
    if "scheduler" in extra and getattr(engine, "scheduler", None) is not None:
        engine.scheduler.load_state_dict(extra["scheduler"])
    rng = actor_dir / f"rng_rank{engine.rank}.pt"
    if rng.exists():  # same world size: each rank gets its own generators back
        set_rng_state(torch.load(rng, weights_only=False))
    dist.barrier()
