"""GPU resources: the config rules, the Ray placement layout, and the placement groups themselves.

::

    validate_resources(cfg)            load time: impossible key combinations -> ConfigError (key + fix)
    check_cluster(cfg, resources)      start time: GPUs asked for vs ray.cluster_resources()
    plan_layout(cfg) -> Layout         pure: bundles per placement group, one Slot per actor
        separate   (hybrid_engine=False)  "trainer": one {"GPU": 1} bundle per trainer rank
                                          "rollout": one {"GPU": 1} bundle per replica
        colocated  (hybrid_engine=True)   "colocated": one {"GPU": 1} bundle per trainer rank, holding
                                          that rank (0.5 GPU) and one replica (0.5 GPU)
        CPU sides get no bundle: their actors are scheduled as before (num_cpus=0)
    Placement(layout)                  Ray: creates the groups, gives each Slot its actor options
    trainer_env(cfg)                   the trainer actor's runtime environment (OMP_WAIT_POLICY, GOMP_SPINCOUNT)

The split follows verl's fully-async recipe (``trainer.nnodes`` x ``trainer.n_gpus_per_node`` for the
trainer, top-level ``rollout.nnodes`` x ``rollout.n_gpus_per_node`` for the replicas: seed ``003``
chapter 6); the colocated layout is verl's hybrid engine (one worker group holds actor and rollout).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from asyncrl.config_schema import ConfigError, ExperimentConfig

logger = logging.getLogger(__name__)

COLOCATED_SHARE = 0.5
"""GPU fraction each of the trainer rank and the replica asks for on a colocated GPU."""


def trainer_env(cfg: ExperimentConfig) -> dict:
    """``ray.remote`` options of the trainer actor: its process's ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT``
    (``trainer.omp_wait_policy`` / ``trainer.omp_spin_count``), or the driver's own settings (a driver that sets
    ``OMP_WAIT_POLICY`` sets both: its ``GOMP_SPINCOUNT`` or none); OpenMP reads them when the process loads it,
    so they go in the actor's runtime environment."""
    env = {}
    if "OMP_WAIT_POLICY" in os.environ:
        policy, spin = os.environ["OMP_WAIT_POLICY"], os.environ.get("GOMP_SPINCOUNT")
    else:
        policy = cfg.trainer.omp_wait_policy
        spin = os.environ.get("GOMP_SPINCOUNT",
                              None if cfg.trainer.omp_spin_count is None else str(int(cfg.trainer.omp_spin_count)))
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    if spin is not None:
        env["GOMP_SPINCOUNT"] = spin
    return {"runtime_env": {"env_vars": env}} if env else {}


def trainer_gpus(cfg: ExperimentConfig) -> int:
    """GPUs of the trainer (0 on CPU, also for ``fsdp2`` with ``trainer.device=cpu``)."""
    t = cfg.trainer
    if cfg.actor_rollout_ref.actor.strategy != "fsdp2" or t.device != "cuda":
        return 0
    return t.nnodes * t.n_gpus_per_node


def trainer_world_size(cfg: ExperimentConfig) -> int:
    """Trainer processes: 1 for ``strategy=cpu``, ``nnodes * n_gpus_per_node`` for ``fsdp2``."""
    if cfg.actor_rollout_ref.actor.strategy != "fsdp2":
        return 1
    return max(1, cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node)


def rollout_gpus(cfg: ExperimentConfig) -> int:
    """GPUs holding rollout replicas (the trainer's GPUs when colocated)."""
    if cfg.actor_rollout_ref.hybrid_engine:
        return trainer_gpus(cfg)
    return cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node


def total_gpus(cfg: ExperimentConfig) -> int:
    """GPUs the run asks Ray for."""
    return trainer_gpus(cfg) + (0 if cfg.actor_rollout_ref.hybrid_engine else rollout_gpus(cfg))


def _nccl_transport(cfg: ExperimentConfig) -> bool:
    ce = cfg.actor_rollout_ref.rollout.checkpoint_engine
    return ce.backend == "nccl" and ce.engine_kwargs.get("backend", "nccl") == "nccl"


def validate_resources(cfg: ExperimentConfig) -> None:
    """Refuse impossible combinations of the GPU keys (the keys' own values are checked by
    :data:`asyncrl.config.CHOICES`); may set ``rollout.num_replicas`` from the GPUs.

    Raises:
        ConfigError: naming the key and the fix.
    """
    arr, t, r = cfg.actor_rollout_ref, cfg.trainer, cfg.rollout
    ac, ro, ce = arr.actor, arr.rollout, arr.rollout.checkpoint_engine
    for key, val, low in (("trainer.nnodes", t.nnodes, 1), ("rollout.nnodes", r.nnodes, 1),
                          ("trainer.n_gpus_per_node", t.n_gpus_per_node, 0),
                          ("rollout.n_gpus_per_node", r.n_gpus_per_node, 0)):
        if val < low:
            raise ConfigError(f"{key} must be >= {low}, got {val}")
    if ac.strategy == "cpu" and t.n_gpus_per_node > 0:
        raise ConfigError(f"trainer.n_gpus_per_node={t.n_gpus_per_node} with actor_rollout_ref.actor.strategy=cpu: "
                          "the cpu strategy trains in one CPU process; set actor_rollout_ref.actor.strategy=fsdp2 "
                          "to train on GPUs, or trainer.n_gpus_per_node=0")
    if ac.strategy == "fsdp2" and t.n_gpus_per_node < 1:
        raise ConfigError("actor_rollout_ref.actor.strategy=fsdp2 shards the model over the trainer GPUs, but "
                          "trainer.n_gpus_per_node=0; set trainer.n_gpus_per_node>=1 (or strategy=cpu on a "
                          "machine without GPUs)")
    if ac.strategy == "fsdp2" and cfg.algorithm.adv_estimator == "gae":
        raise ConfigError("algorithm.adv_estimator=gae trains a critic, which runs on CPU beside the trainer; with "
                          "actor_rollout_ref.actor.strategy=fsdp2 use a critic-free estimator (grpo, rloo, ...) or "
                          "strategy=cpu")
    if arr.hybrid_engine and r.n_gpus_per_node > 0:
        raise ConfigError(f"actor_rollout_ref.hybrid_engine=true colocates the replicas on the trainer's GPUs, but "
                          f"rollout.n_gpus_per_node={r.n_gpus_per_node}; set rollout.n_gpus_per_node=0")
    if ce.backend == "nccl":
        if ac.strategy != "fsdp2":
            raise ConfigError("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl sends from trainer rank 0's "
                              "GPU: set actor_rollout_ref.actor.strategy=fsdp2 and trainer.n_gpus_per_node>=1, or "
                              "checkpoint_engine.backend=cpu")
        if arr.hybrid_engine and trainer_gpus(cfg):
            raise ConfigError("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl with "
                              "actor_rollout_ref.hybrid_engine=true: a trainer rank and its colocated replica share "
                              "one GPU, and NCCL cannot connect two ranks on the same GPU; set "
                              "checkpoint_engine.backend=cpu or cuda_ipc (hf rollout; or hybrid_engine=false with "
                              "rollout GPUs)")
        if _nccl_transport(cfg) and (trainer_gpus(cfg) == 0 or rollout_gpus(cfg) == 0):
            raise ConfigError("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl needs CUDA GPUs on both "
                              f"sides (trainer GPUs {trainer_gpus(cfg)}, rollout GPUs {rollout_gpus(cfg)}); set "
                              "trainer.n_gpus_per_node >= 1 and rollout.n_gpus_per_node >= 1 (separate GPUs), or "
                              "checkpoint_engine.backend=cpu")
    if ce.backend == "cuda_ipc" and not (arr.hybrid_engine and trainer_gpus(cfg) and ro.name == "hf"):
        raise ConfigError("actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc shares GPU memory between a "
                          "trainer rank and the replica on the same GPU: it needs actor_rollout_ref.hybrid_engine=true, "
                          "actor.strategy=fsdp2 with trainer.n_gpus_per_node>=1 and rollout.name=hf (got hybrid_engine="
                          f"{arr.hybrid_engine}, trainer GPUs {trainer_gpus(cfg)}, rollout.name={ro.name}); use nccl "
                          "for separate GPUs or cpu")
    if ce.verify_each_sync and ro.name != "hf":
        raise ConfigError(f"actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync=true compares the replicas' "
                          f"tensors with the trainer's, which only the hf backend keeps as they are (rollout.name="
                          f"{ro.name} fuses / pads / repacks them); set rollout.name=hf or verify_each_sync=false")
    if ro.name == "hf" and ro.enable_prefix_caching:
        raise ConfigError("actor_rollout_ref.rollout.enable_prefix_caching=true: the hf backend has no prefix "
                          "cache; set it to false or actor_rollout_ref.rollout.name=vllm")
    gpus = rollout_gpus(cfg)
    if gpus:
        if ro.num_replicas not in (1, gpus):
            raise ConfigError(f"actor_rollout_ref.rollout.num_replicas={ro.num_replicas} but the rollout has {gpus} "
                              "GPUs (one replica per GPU); leave num_replicas at 1 or set it to the GPU count")
        ro.num_replicas = gpus


def check_cluster(cfg: ExperimentConfig, resources: dict[str, float]) -> None:
    """Refuse a run that asks for more GPUs than the Ray cluster has (``ray.cluster_resources()``).

    Raises:
        ConfigError: naming the GPU keys, what the cluster has, and the fix.
    """
    want, have = total_gpus(cfg), int(resources.get("GPU", 0))
    if want > have:
        nccl = " (checkpoint_engine.backend=nccl needs CUDA)" if _nccl_transport(cfg) else ""
        raise ConfigError(
            f"the run asks for {want} GPUs (trainer.nnodes*trainer.n_gpus_per_node={trainer_gpus(cfg)}"
            f"{'' if cfg.actor_rollout_ref.hybrid_engine else f' + rollout.nnodes*rollout.n_gpus_per_node={rollout_gpus(cfg)}'})"
            f" but the Ray cluster has {have}{nccl}; lower those keys, or attach to a cluster with GPUs (ray.address)")


@dataclass(frozen=True)
class Slot:
    """Where one actor runs: a bundle of a placement group (``group`` None: no placement group)."""

    group: Optional[str]
    bundle: int
    num_gpus: float


@dataclass
class Layout:
    """Placement groups and per-actor slots (pure data; :class:`Placement` makes it real).

    Attributes:
        groups: ``{name: [bundle, ...]}`` with bundles like ``{"GPU": 1}``.
        trainer: one :class:`Slot` per trainer rank.
        rollout: one :class:`Slot` per replica.
        colocated: trainer ranks and replicas share GPUs.
    """

    groups: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    trainer: list[Slot] = field(default_factory=list)
    rollout: list[Slot] = field(default_factory=list)
    colocated: bool = False


def plan_layout(cfg: ExperimentConfig) -> Layout:
    """Bundles and slots for ``cfg`` (see the module diagram). CPU sides get ``Slot(None, i, 0)``."""
    tg, world = trainer_gpus(cfg), trainer_world_size(cfg)
    n_rep = cfg.actor_rollout_ref.rollout.num_replicas
    lay = Layout(colocated=bool(cfg.actor_rollout_ref.hybrid_engine and tg))
    if lay.colocated:
        lay.groups["colocated"] = [{"GPU": 1.0} for _ in range(tg)]
        lay.trainer = [Slot("colocated", i, COLOCATED_SHARE) for i in range(tg)]
        lay.rollout = [Slot("colocated", i, COLOCATED_SHARE) for i in range(tg)]
        return lay
    if tg:
        lay.groups["trainer"] = [{"GPU": 1.0} for _ in range(tg)]
        lay.trainer = [Slot("trainer", i, 1.0) for i in range(tg)]
    else:
        lay.trainer = [Slot(None, i, 0.0) for i in range(world)]
    rg = rollout_gpus(cfg)
    if rg:
        lay.groups["rollout"] = [{"GPU": 1.0} for _ in range(rg)]
        lay.rollout = [Slot("rollout", i, 1.0) for i in range(rg)]
    else:
        lay.rollout = [Slot(None, i, 0.0) for i in range(n_rep)]
    return lay


class Placement:
    """The Ray side of a :class:`Layout`: placement groups, created at once, removed by :meth:`remove`.

    Args:
        layout: from :func:`plan_layout`.
        timeout_s: how long to wait for the groups to be placed.

    Raises:
        TimeoutError: the cluster could not place a group (not enough free GPUs).
    """

    def __init__(self, layout: Layout, timeout_s: float = 300.0):
        import ray
        from ray.util.placement_group import placement_group

        self.layout = layout
        self.pgs: dict[str, Any] = {}
        for name, bundles in layout.groups.items():
            self.pgs[name] = placement_group(bundles, strategy="PACK", name=f"asyncrl_{name}")
        if self.pgs:
            ready, _ = ray.wait([pg.ready() for pg in self.pgs.values()], num_returns=len(self.pgs), timeout=timeout_s)
            if len(ready) < len(self.pgs):
                self.remove()
                raise TimeoutError(f"Ray could not place {layout.groups} within {timeout_s:.0f} s (GPUs busy?)")

    def actor_options(self, slot: Slot) -> dict[str, Any]:
        """``ray.remote(...).options(**opts)`` for an actor in ``slot`` (``num_cpus=0`` as everywhere)."""
        opts: dict[str, Any] = {"num_cpus": 0}
        if slot.group is None:
            return opts
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts["num_gpus"] = slot.num_gpus
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=self.pgs[slot.group], placement_group_bundle_index=slot.bundle)
        return opts

    def remove(self) -> None:
        """Release the groups (their actors must be gone first). Idempotent."""
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs.values():
            try:
                remove_placement_group(pg)
            except Exception:  # pragma: no cover - already removed with the cluster
                logger.debug("placement group removal failed", exc_info=True)
        self.pgs = {}


def in_process_rollout(cfg: Any) -> bool:
    """Whether this config runs the rollout inside the trainer process (:mod:`asyncrl.trainer.hybrid_rollout`):
    colocated (``hybrid_engine``), the hf engine, the CPU trainer and no agent-loop worker processes (they could not
    reach an engine inside the trainer)."""
    arr = cfg.actor_rollout_ref
    return bool(arr.hybrid_engine and arr.rollout.name == "hf" and arr.actor.strategy == "cpu"
                and arr.rollout.agent.num_workers == 0)
