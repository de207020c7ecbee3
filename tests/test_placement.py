"""GPU config keys: refusals at load (key + fix), the cluster check at start, and the placement layout."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.placement import Slot, check_cluster, plan_layout, total_gpus, trainer_world_size

GPU2 = ["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
"""The two-GPU quickstart: trainer on one GPU, one hf replica on the other, NCCL sync."""


def test_cpu_default_is_unchanged():
    cfg = load_config()
    assert (cfg.actor_rollout_ref.actor.strategy, cfg.actor_rollout_ref.rollout.checkpoint_engine.backend) == ("cpu", "cpu")
    assert total_gpus(cfg) == 0 and trainer_world_size(cfg) == 1
    lay = plan_layout(cfg)
    assert lay.groups == {} and lay.trainer == [Slot(None, 0, 0.0)] and lay.rollout == [Slot(None, 0, 0.0)]


def test_two_gpu_layout_separate_bundles():
    cfg = load_config(overrides=GPU2)
    lay = plan_layout(cfg)
    assert lay.groups == {"trainer": [{"GPU": 1.0}], "rollout": [{"GPU": 1.0}]} and not lay.colocated
    assert lay.trainer == [Slot("trainer", 0, 1.0)] and lay.rollout == [Slot("rollout", 0, 1.0)]
    assert total_gpus(cfg) == 2


def test_rollout_gpus_set_the_replica_count_and_refuse_a_mismatch():
    cfg = load_config(overrides=GPU2[:3] + ["rollout.nnodes=2", "rollout.n_gpus_per_node=3"])
    assert cfg.actor_rollout_ref.rollout.num_replicas == 6
    assert plan_layout(cfg).rollout == [Slot("rollout", i, 1.0) for i in range(6)]
    with pytest.raises(ConfigError, match=r"num_replicas=2 but the rollout has 3 GPUs"):
        load_config(overrides=GPU2[:3] + ["rollout.n_gpus_per_node=3", "actor_rollout_ref.rollout.num_replicas=2"])


def test_colocated_layout_shares_each_gpu():
    cfg = load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=2",
                                 "actor_rollout_ref.hybrid_engine=true", "actor_rollout_ref.rollout.name=hf",
                                 "async_training.staleness_threshold=0"])
    lay = plan_layout(cfg)
    assert lay.colocated and lay.groups == {"colocated": [{"GPU": 1.0}, {"GPU": 1.0}]}
    assert lay.trainer == lay.rollout == [Slot("colocated", 0, 0.5), Slot("colocated", 1, 0.5)]
    assert cfg.actor_rollout_ref.rollout.num_replicas == 2 and total_gpus(cfg) == 2


def test_fsdp2_on_cpu_ranks_without_gpus():
    cfg = load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu", "trainer.n_gpus_per_node=2"])
    assert trainer_world_size(cfg) == 2 and total_gpus(cfg) == 0
    assert plan_layout(cfg).trainer == [Slot(None, 0, 0.0), Slot(None, 1, 0.0)]


@pytest.mark.parametrize("overrides,key,fix", [
    (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy='fsdp'", "fsdp2"),
    (["actor_rollout_ref.actor.strategy=fsdp2"], "trainer.n_gpus_per_node=0", "set trainer.n_gpus_per_node>=1"),
    (["trainer.n_gpus_per_node=2"], "actor_rollout_ref.actor.strategy=cpu", "strategy=fsdp2"),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"], "checkpoint_engine.backend=nccl",
     "strategy=fsdp2"),
    (["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=1",
      "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"], "needs CUDA GPUs on both sides",
     "rollout.n_gpus_per_node"),
    (["actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
      "rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
     "needs CUDA GPUs on both sides", "checkpoint_engine.backend=cpu"),
    (["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=2", "actor_rollout_ref.hybrid_engine=true",
      "async_training.staleness_threshold=0", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
     "hybrid_engine=true", "checkpoint_engine.backend=cpu"),
    (["actor_rollout_ref.hybrid_engine=true", "async_training.staleness_threshold=0", "rollout.n_gpus_per_node=1"],
     "rollout.n_gpus_per_node=1", "rollout.n_gpus_per_node=0"),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=shm"], "checkpoint_engine.backend='shm'", "nccl"),
    (["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.enable_prefix_caching=true"],
     "enable_prefix_caching=true", "rollout.name=vllm"),
    (["trainer.device=tpu"], "trainer.device='tpu'", "cuda"),
    (["actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync=true"], "verify_each_sync=true",
     "rollout.name=hf"),
    (["rollout.nnodes=0"], "rollout.nnodes must be >= 1", ""),
    # cuda_ipc maps a colocated rank's GPU memory: separate GPUs, vLLM replicas or a CPU trainer cannot
    (GPU2[:-1] + ["actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc"], "backend=cuda_ipc",
     "use nccl for separate GPUs"),
    (["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=1", "actor_rollout_ref.hybrid_engine=true",
      "async_training.staleness_threshold=0", "actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc"],
     "rollout.name=vllm", "rollout.name=hf"),
    (["actor_rollout_ref.hybrid_engine=true", "async_training.staleness_threshold=0",
      "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc"],
     "trainer GPUs 0", "trainer.n_gpus_per_node>=1"),
])
def test_impossible_combinations_are_refused_naming_key_and_fix(overrides, key, fix):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=overrides)
    assert key in str(err.value) and fix in str(err.value), str(err.value)


def test_more_gpus_than_the_cluster_has_is_refused_at_start():
    cfg = load_config(overrides=GPU2)
    check_cluster(cfg, {"CPU": 16.0, "GPU": 2.0})
    with pytest.raises(ConfigError, match=r"asks for 2 GPUs .* but the Ray cluster has 0 \(checkpoint_engine.backend="
                                          r"nccl needs CUDA\); lower those keys"):
        check_cluster(cfg, {"CPU": 2.0})
    check_cluster(load_config(), {"CPU": 2.0})  # the CPU default needs none


def test_cuda_ipc_is_accepted_for_colocated_hf_ranks():
    cfg = load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", "trainer.n_gpus_per_node=2",
                                 "actor_rollout_ref.hybrid_engine=true", "async_training.staleness_threshold=0",
                                 "actor_rollout_ref.rollout.name=hf",
                                 "actor_rollout_ref.rollout.checkpoint_engine.backend=cuda_ipc"])
    lay = plan_layout(cfg)
    assert lay.colocated and [s.bundle for s in lay.trainer] == [s.bundle for s in lay.rollout] == [0, 1]
