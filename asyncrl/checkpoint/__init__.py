"""Checkpoint and exact resume (verl's ``trainer.save_freq`` / ``resume_mode`` / ``default_local_dir``).

- :mod:`asyncrl.checkpoint.manager`: directory layout, atomic writes, last-K retention, finding the
  checkpoint to resume from.
- :mod:`asyncrl.checkpoint.engine_io`: train-engine state (HF weights, optimizer, LR schedule,
  RNG), single-process and FSDP2 (sharded optimizer through ``torch.distributed.checkpoint``).
- :mod:`asyncrl.checkpoint.trainer_state`: what a run saves and restores around the engine.
- :mod:`asyncrl.checkpoint.fingerprint`: the model a checkpoint trained, known again in a moved folder.
"""

from asyncrl.checkpoint.manager import (CheckpointError, CheckpointManager, check_checkpoint,
                                        find_resume_checkpoint)

__all__ = ["CheckpointError", "CheckpointManager", "check_checkpoint", "find_resume_checkpoint"]
